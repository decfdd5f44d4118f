"""Guests that lie to the broker (tests/integration/sandbox/test_hostile_guests.py).

The parent run is recorded with ``parent_spec`` on the host; each liar is an agent of the same
package (same code hash, same tools and model, so the same version tuple) whose re-run talks to
the broker in ways an honest guest never would: secrets it was not given, another agent's key, a
key of its own, model parameters, malformed outcomes, replies it never reads, a disk to fill,
floods. The tools and the model run on the host (in the test's process), so they count what
reached them. Nothing hostile runs at import time: the host imports this module too.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from typing import Any

from runledger import AgentSpec, LedgerError, ModelResponse, Run, tool
from runledger.sandbox.channel import encode, read_message

ALLOWED_SECRET = "RL_ALLOWED_TOKEN"  # declared by the tools and allowed by the test's policy
DECLARED_ONLY = "RL_DECLARED_ONLY"  # declared by echo, never allowed by the operator
HOST_ONLY = "RL_HOST_ONLY"  # in the host's environment, declared by nothing
PREFIXED = "RL_PREFIXED"  # as RUNLEDGER_SECRET_RL_PREFIXED in the host's environment

SEEN: list[Any] = []  # the arguments host-side tools received, secrets resolved
MODEL_CALLS: list[dict[str, Any]] = []  # the parameters each host-side model call received


@tool("echo", secrets=[ALLOWED_SECRET, DECLARED_ONLY])
def echo(args: Any) -> Any:
    SEEN.append(args)
    return {"echo": args}


@tool("explode", secrets=[ALLOWED_SECRET])
def explode(args: Any) -> Any:
    SEEN.append(args)
    raise ValueError(f"cannot use {args}")


def _pay(args: Any) -> Any:
    # The counting service: one line per real payment.
    with open(os.environ["TEST_PAYMENTS_LOG"], "a") as f:
        f.write(json.dumps(args) + "\n")
    return {"paid": args, "receipt": f"rcpt-{uuid.uuid4().hex}"}


pay = tool("pay", effect="irreversible", key=lambda a: f"pay:{a['order']}")(_pay)


class CountingModel:
    """A model that answers "ok" and remembers the parameters of every call."""

    name = "counting-1"

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        MODEL_CALLS.append(dict(params))
        return ModelResponse(content="ok", input_tokens=3, output_tokens=1)


def _spec(fn: Any) -> AgentSpec:
    return AgentSpec("liar", fn, CountingModel(), tools=[echo, explode, pay], agent_version=None)


async def parent(run: Run) -> Any:
    await run.tool("echo", {"q": 1})
    await run.model([{"role": "user", "content": "pay order-1"}])
    await run.tool("pay", {"order": "order-1", "amount": 5})
    return "paid"


async def victim(run: Run) -> Any:
    """Another run of the same agent (another lineage), whose payment's result the liars try to read."""
    return await run.tool("pay", {"order": "victim-7", "amount": 900})


async def honest(run: Run) -> Any:
    await run.tool("echo", {"q": "honest"})
    return "honest"


# -- liars -------------------------------------------------------------------------------------------------


async def _raw(run: Any, message: dict[str, Any] | bytes) -> Any:
    """Send one line the Run API would never send; the broker's answer (None when it hung up)."""
    run._writer.write(message if isinstance(message, bytes) else encode(message))
    await run._writer.drain()
    return await read_message(run._reader)


async def _attempt(call: Any) -> Any:
    try:
        return await call
    except LedgerError as exc:
        return f"{type(exc).__name__}: {exc}"


async def ask_for_secrets(run: Run) -> Any:
    """Name secrets through every request that carries arguments, and report what came back."""
    got: dict[str, Any] = {}
    for label, args in (
        ("host_only", {"v": f"secret://{HOST_ONLY}"}),
        ("prefixed", f"key=secret://{PREFIXED}"),
        ("declared_only", [f"secret://{DECLARED_ONLY}"]),
        ("allowed", f"x secret://{ALLOWED_SECRET} y"),
    ):
        got[label] = await _attempt(run.tool("echo", args))
    got["explode_allowed"] = await _attempt(run.tool("explode", f"secret://{ALLOWED_SECRET}"))
    got["explode_host_only"] = await _attempt(run.tool("explode", f"secret://{HOST_ONLY}"))
    got["effect"] = await _attempt(run.tool("pay", {"order": "order-3", "amount": 1, "note": f"secret://{HOST_ONLY}"}))
    got["model"] = (await run.model([{"role": "user", "content": f"secret://{HOST_ONLY}"}])).content
    return got


async def read_another_lineage(run: Run) -> Any:
    """Ask for the victim's committed key, with the victim's exact arguments, both ways."""
    args = {"order": "victim-7", "amount": 900}
    return {
        "tool": await run.tool("pay", args),
        "effect": await run.effect("pay", args, key="pay:victim-7", fn=_pay),
    }


async def choose_a_key(run: Run) -> Any:
    """Under --allow-effects, name a fresh key for an order already paid: over the raw channel."""
    reply = await _raw(run, {"id": 7, "op": "effect", "name": "pay", "args": {"order": "order-1", "amount": 5},
                             "key": "pay:order-1-again"})  # fmt: skip
    return {"reply": reply}


async def choose_a_key_politely(run: Run) -> Any:
    """The same through the Run API: the key given is not sent; the host computes its own."""
    same = await run.effect("pay", {"order": "order-1", "amount": 5}, key="pay:order-1-again", fn=_pay)
    other = await run.effect("pay", {"order": "order-1", "amount": 6}, key="pay:order-1-third", fn=_pay)
    return {"same": same, "other": other}


async def override_the_model(run: Run) -> Any:
    return (await run.model([{"role": "user", "content": "hi"}], model="gpt-4-32k", n=16)).content


async def ask_for_many_tokens(run: Run) -> Any:
    reply = await run.model([{"role": "user", "content": "hi"}], max_tokens=10**9, temperature=0.2)
    return reply.content


async def never_read(run: Run) -> Any:
    """Send requests with large replies and never read one."""
    big = "r" * 200_000
    for n in range(50):
        run._writer.write(encode({"id": 100 + n, "op": "tool", "name": "echo", "args": big}))  # type: ignore[attr-defined]
        await run._writer.drain()  # type: ignore[attr-defined]
    await asyncio.sleep(600)
    return "unreachable"


async def fill_the_disk(run: Run) -> Any:
    """Write 300 MB wherever the host might be reachable (and to /tmp, which is capped)."""
    await run.tool("echo", {"q": "disk"})
    report: dict[str, dict[str, Any]] = {}
    chunk = b"\0" * (1 << 20)
    for path in ("/run/runledger/fill.bin", "/run/runledger/broker.sock", "/run/fill.bin", "/app/fill.bin",
                 "/fill.bin", "/tmp/fill.bin"):  # fmt: skip
        written = 0
        try:
            with open(path, "ab") as f:
                for _ in range(300):
                    f.write(chunk)
                    written += len(chunk)
                f.flush()
        except OSError as exc:
            report[path] = {"errno": exc.errno, "written": written}
        else:
            report[path] = {"errno": None, "written": written}
        if path.startswith("/tmp"):
            os.unlink(path)
    raise RuntimeError("disk attempts: " + json.dumps(report))


async def flood_events(run: Run) -> Any:
    for _ in range(100_000):
        await run.now()
    return "flooded"


async def flood_blobs(run: Run) -> Any:
    for n in range(10_000):
        await run.tool("echo", f"{n}:" + "b" * 70_000)  # over the 64 KiB threshold: args and output are blobs
    return "flooded"


async def flood_bytes(run: Run) -> Any:
    for n in range(10_000):
        await run.tool("echo", f"{n}:" + "c" * 30_000)  # under the blob threshold: recorded inline
    return "flooded"


# Malformed outcomes and requests, written as raw lines (JSON's \\ud800 escape is ASCII on the wire).
MALFORMED = {
    "surrogate_output": b'{"id":-1,"op":"done","output":{"text":"half a pair: \\ud800"}}\n',
    "surrogate_error": b'{"id":-1,"op":"failed","error":{"type":"X","message":"\\udfff"}}\n',
    "surrogate_key": b'{"id":-1,"op":"done","output":{"\\ud83d":1}}\n',
    "deep_output": b'{"id":-1,"op":"done","output":' + b"[" * 500 + b"]" * 500 + b"}\n",
    "error_not_an_object": b'{"id":-1,"op":"failed","error":"boom"}\n',
    "nan_args": b'{"id":3,"op":"tool","name":"echo","args":NaN}\n',
    "huge_number": b'{"id":3,"op":"tool","name":"echo","args":1e999}\n',
    "unknown_field": b'{"id":3,"op":"now","also":"this"}\n',
    "name_not_text": b'{"id":3,"op":"tool","name":["echo"],"args":1}\n',
}


def deep_frame(values: int, depth: int = 100, ident: int = 7) -> bytes:
    """A tool request nested ``depth`` levels deep with the message itself (what a depth limit of
    ``depth`` accepts), of about ``values`` values: lists in lists, the shape whose every walk on the
    host costs the most per value."""
    unit = b"[" * (depth - 2) + b"0" + b"]" * (depth - 2)  # depth - 2 values
    head, tail = b'{"id":%d,"op":"tool","name":"echo","args":[' % ident, b"]}\n"
    return head + b",".join([unit] * max(1, values // (depth - 1))) + tail


AT_THE_CAP = 99_000  # values of each accepted frame: under the broker's MAX_VALUES (100,000)
HUGE = 1_800_000  # values of the last frame: about 3.6 MB, within the 4 MiB line limit
DEEP_FRAMES = 4  # frames deep_frames sends: three at the cap, then a huge one


async def deep_frames(run: Run) -> Any:
    """Requests of deep frames, raw on the channel; the replies read as raw lines (an echo of a frame
    100 deep is deeper than the guest's own reader takes)."""
    answered = []
    for n in range(DEEP_FRAMES):
        size = AT_THE_CAP if n < DEEP_FRAMES - 1 else HUGE
        run._writer.write(deep_frame(size, ident=100 + n))  # type: ignore[attr-defined]
        await run._writer.drain()  # type: ignore[attr-defined]
        try:
            answered.append(len(await run._reader.readuntil(b"\n")))  # type: ignore[attr-defined]
        except asyncio.IncompleteReadError:  # the broker hung up
            break
    return answered


# Requests just under the channel's 4 MiB line limit (room left for the message around the argument),
# repeated: each is parsed, redacted, recorded (as blobs) twice, its echo sent back. Text of words and
# numbers, the kind of text a tool passes on.
BIG_FRAME_CHARS = 4 * 1024 * 1024 - 200
BIG_FRAMES = 1_000  # more than any budget lets through: the host stops the guest, not the guest itself


def big_frame(n: int) -> bytes:
    words = b"order %d shipped to warehouse 7, invoice 2026-%04d, total 41.50 EUR; " % (n, n % 10_000)
    arg = (words * (BIG_FRAME_CHARS // len(words) + 1))[:BIG_FRAME_CHARS]
    return b'{"id":%d,"op":"tool","name":"echo","args":"%s"}\n' % (1000 + n, arg)


async def repeat_big_frames(run: Run) -> Any:
    """Tool requests just under the line limit, one after the other, as fast as the host answers."""
    answered = 0
    for n in range(BIG_FRAMES):
        run._writer.write(big_frame(n))  # type: ignore[attr-defined]
        await run._writer.drain()  # type: ignore[attr-defined]
        try:
            await run._reader.readuntil(b"\n")  # type: ignore[attr-defined]
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):  # the broker hung up
            break
        answered += 1
    return answered


# Written to the broker's socket from the guest before the guest itself says hello (the first
# connection is the one the broker reads; the guest's own is refused after it).
GARBAGE = {
    "text": b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n\n",
    "binary": bytes(range(256)) * 64 + b"\n",
    "deep": b"[" * 2_000_000 + b"]" * 1_000_000 + b"\n",
    "not_hello": b'{"id":0,"op":"done","output":"skipped the handshake"}\n',
}
SOCKET_IN_GUEST = "/run/runledger/broker.sock"


def _garbage_first(variant: str) -> AgentSpec:
    """The spec, after writing garbage to the broker from inside the guest (the guest loads the agent
    before it connects). On the host, where no broker socket exists at that path, nothing is written."""
    if os.path.exists(SOCKET_IN_GUEST):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(SOCKET_IN_GUEST)
        sock.sendall(GARBAGE[variant])
        GARBAGE_SOCKETS.append(sock)  # held open: the broker reads the garbage, not an end of stream
    return _spec(honest)


GARBAGE_SOCKETS: list[Any] = []


def _malformed(line: bytes) -> Any:
    async def send(run: Run) -> Any:
        await run.tool("echo", {"q": "before"})
        return await _raw(run, line)  # the broker hangs up: None

    return send


# -- specs (what load_agent loads by name) -------------------------------------------------------------------


def parent_spec() -> AgentSpec:
    return _spec(parent)


def victim_spec() -> AgentSpec:
    return _spec(victim)


def honest_spec() -> AgentSpec:
    return _spec(honest)


def secrets_spec() -> AgentSpec:
    return _spec(ask_for_secrets)


def lineage_spec() -> AgentSpec:
    return _spec(read_another_lineage)


def chosen_key_spec() -> AgentSpec:
    return _spec(choose_a_key)


def polite_key_spec() -> AgentSpec:
    return _spec(choose_a_key_politely)


def model_override_spec() -> AgentSpec:
    return _spec(override_the_model)


def many_tokens_spec() -> AgentSpec:
    return _spec(ask_for_many_tokens)


def never_read_spec() -> AgentSpec:
    return _spec(never_read)


def disk_spec() -> AgentSpec:
    return _spec(fill_the_disk)


def flood_events_spec() -> AgentSpec:
    return _spec(flood_events)


def flood_blobs_spec() -> AgentSpec:
    return _spec(flood_blobs)


def flood_bytes_spec() -> AgentSpec:
    return _spec(flood_bytes)


def deep_frames_spec() -> AgentSpec:
    return _spec(deep_frames)


def repeat_big_frames_spec() -> AgentSpec:
    return _spec(repeat_big_frames)


def malformed_spec(variant: str) -> AgentSpec:
    return _spec(_malformed(MALFORMED[variant]))


for _variant in MALFORMED:  # malformed_<variant>_spec, one factory per line above
    globals()[f"malformed_{_variant}_spec"] = lambda v=_variant: malformed_spec(v)


for _variant in GARBAGE:  # garbage_<variant>_spec: garbage on the channel before the guest's hello
    globals()[f"garbage_{_variant}_spec"] = lambda v=_variant: _garbage_first(v)
