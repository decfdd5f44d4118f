"""An OpenAI Agents SDK agent written as its users write it, and a local fake of the Responses API, for the
tests of ``runledger.integrations.openai_agents``.

The agent, ``support``, has two function tools, ``lookup_order`` (a read tool) and ``refund`` (an effect
keyed ``refund:<order>``, whose reconcile asks the witness), and a handoff to ``closer``, which writes the
closing note. Its model is the SDK's own ``OpenAIResponsesModel`` (through ``OpenAIProvider``) on an
``AsyncOpenAI`` client pointed at ``FakeResponses``: a real HTTP server on loopback that answers the
Responses API by a script (look up the order the user names, refund it, hand off, close; with instructions that say
"never refund", hand off after the lookup) and counts the requests it answered by their content
(``$OA_SHOP_URL``: where the server is).

Witnesses: each tool appends a line to ``$OA_SHOP_LOG/tools.log`` as it acts (``refund`` first acts, then
takes ``$OA_SHOP_DELAY_S`` before it returns, so a kill lands between its act and its record); the
server waits ``$OA_SHOP_DELAY_S`` before each answer, so a kill lands while a request is in flight.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agents import Agent, OpenAIProvider, RunConfig, function_tool
from openai import AsyncOpenAI

from runledger import NOT_FOUND, AgentSpec, DataPolicy, EffectContext
from runledger.integrations.openai_agents import Effect, OpenAIAgentsModel, agent_spec

SUPPORT = "You are the support agent of a shop. Look the order up, refund it if it arrived broken, then hand off."
CLOSER = "You write the closing note of a support case."
NEVER = "never refund"


class Killed(BaseException):
    """The process dying at a chosen moment (in-process tests)."""


# -- the fake Responses API --------------------------------------------------------------------------------


def digest(body: dict[str, Any]) -> str:
    """A request's content: its body with sorted keys (what "the same request" means to the fake)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def _call(name: str, args: dict[str, Any], n: int) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": name,
            "arguments": json.dumps(args), "status": "completed"}  # fmt: skip


def _message(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def script(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The shop's model: what it answers to a request of the Responses API (its output items)."""
    instructions = str(body.get("instructions") or "")
    items = body.get("input") if isinstance(body.get("input"), list) else []
    outputs = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
    asked = next((str(i.get("content")) for i in items if isinstance(i, dict) and i.get("role") == "user"), "")
    order = (re.findall(r"\bo-[\w-]+", asked) or ["o-1"])[0]  # the order the customer names
    if instructions.startswith(CLOSER):
        return [_message(f"Closed: {outputs[-1]['output'] if outputs else 'nothing done'}")]
    if not outputs:
        return [_call("lookup_order", {"order": order}, 1)]
    if len(outputs) == 1 and NEVER not in instructions:
        return [_call("refund", {"order": order, "amount": 30.0, "reason": "broken"}, 2)]
    return [_call("transfer_to_closer", {}, 3)]


class FakeResponses:
    """The Responses API on loopback: ``answer(body) -> output items``; every request's content counted."""

    def __init__(self, answer: Callable[[dict[str, Any]], list[dict[str, Any]]] = script, delay_s: float = 0.0) -> None:
        self.answer = answer
        self.delay_s = delay_s
        self.requests: list[str] = []  # the content digest of every request answered, in order
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def respond(self, body: dict[str, Any]) -> dict[str, Any]:
        key = digest(body)
        with self._lock:
            self.requests.append(key)
            self.bodies.append(body)
        time.sleep(self.delay_s)
        return {"id": f"resp_{key}", "object": "response", "created_at": 1700000000, "model": body.get("model"),
                "status": "completed", "output": self.answer(body), "parallel_tool_calls": True,
                "tool_choice": "auto", "tools": [],
                "usage": {"input_tokens": 20, "output_tokens": 5, "total_tokens": 25,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}}}  # fmt: skip

    @contextlib.contextmanager
    def serving(self) -> Iterator[str]:
        """Serve on a free port of 127.0.0.1; yields the base URL (``.../v1``)."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                if not self.path.endswith("/responses"):
                    self.send_error(404, "only POST /v1/responses here")
                    return
                data = json.dumps(fake.respond(body)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/v1"
        finally:
            server.shutdown()
            server.server_close()


# -- the agent ------------------------------------------------------------------------------------------------


def _log() -> Path | None:
    log = os.environ.get("OA_SHOP_LOG")
    return Path(log) / "tools.log" if log else None


def _witness(line: str) -> None:
    log = _log()
    if log is not None:
        with open(log, "a") as f:
            f.write(line + "\n")


def refunded(key: str) -> Any:
    """The refund's reconcile: what the "payments service" (the witness) knows of ``key``."""
    log = _log()
    for line in log.read_text().splitlines() if log is not None and log.exists() else []:
        kind, order, amount, done_key = line.split(" ")
        if kind == "refund" and done_key == key:
            return {"order": order, "refunded": float(amount), "currency": "EUR"}
    return NOT_FOUND


@function_tool
def lookup_order(order: str) -> dict[str, Any]:
    """Look an order up (a read tool): its result an unsorted dict with a whole-number float."""
    _witness(f"lookup {order} - -")
    return {"order": order, "total": 30.0, "state": "delivered", "items": {"z": 1, "a": 2.0}}


@function_tool
def refund(order: str, amount: float, reason: str) -> dict[str, Any]:
    """Refund an order (an effect, keyed by the order)."""
    ctx = EffectContext.current()
    _witness(f"refund {order} {amount} {ctx.key if ctx is not None else '-'}")
    time.sleep(float(os.environ.get("OA_SHOP_DELAY_S", "0")))
    return {"order": order, "refunded": amount, "currency": "EUR"}


def build() -> Agent[Any]:
    closer = Agent(name="closer", instructions=CLOSER, model="fake-closer")
    return Agent(name="support", instructions=SUPPORT, model="fake-support", tools=[lookup_order, refund],
                 handoffs=[closer])  # fmt: skip


def provider() -> OpenAIProvider:
    url = os.environ.get("OA_SHOP_URL", "http://127.0.0.1:9/v1")  # unset: nothing answers (a sandbox guest)
    return OpenAIProvider(openai_client=AsyncOpenAI(base_url=url, api_key="sk-fake", max_retries=0))


REFUND = Effect(key=lambda a: f"refund:{a['order']}", effect_class="irreversible", reconcile=refunded)


def spec() -> AgentSpec:
    return agent_spec(
        build(),
        effects={
            "refund": Effect(key=lambda a: f"refund:{a['order']}", effect_class="irreversible", reconcile=refunded)
        },
        agent_version="shop-v1",
        model=OpenAIAgentsModel(provider, model="fake-support"),
        run_config=lambda run: RunConfig(tracing_disabled=True),
        data_policy=DataPolicy(capture="full"),
    )
