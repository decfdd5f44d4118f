"""Pydantic AI agents written as their users write them, for the resume tests of
``runledger.integrations.pydantic_ai``: a model whose tool calls' argument dicts are *not* in
alphabetical order, with whole-number floats in them, and tools whose results carry the same.

Two models drive the same tools:

- ``function_spec``: Pydantic AI's ``FunctionModel`` with a policy that counts (``count`` with
  ``{"tag": ..., "n": ...}``), charges (``charge``, an effect keyed ``charge:<order>``, with
  ``{"order": ..., "amount": 30.0}``), counts again and answers: four model requests, each after the
  previous one's tool call, so every later request carries the earlier arguments as Pydantic AI
  serialises them;
- ``testmodel_spec``: Pydantic AI's own ``TestModel``, which calls every tool with arguments it makes from
  the tools' schemas (in the signature's order: ``{"tag": ..., "n": ...}``) and then answers.

The witness is each tool's own log, ``$PYAI_COUNTER_LOG/tools.log`` (a line a real execution,
appended before the tool returns, so a SIGKILLed process leaves it behind); ``$PYAI_COUNTER_DELAY_S``
makes each tool call take that long (room for a kill at a random moment).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from runledger import NOT_FOUND, AgentSpec, EffectContext
from runledger.integrations.pydantic_ai import Effect, PydanticAIModel, RunledgerDurability, agent_spec

# The policy's tool calls, one a model request, argument dicts as a provider's SDK hands them over.
CALLS = [
    ("count", {"tag": "a1", "n": 1}),
    ("charge", {"order": "o-1", "amount": 30.0}),
    ("count", {"tag": "b2", "n": 2}),
]


def policy(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    asked = sum(1 for m in messages if m.kind == "response")
    if asked < len(CALLS):
        name, args = CALLS[asked]
        return ModelResponse(parts=[ToolCallPart(name, dict(args), tool_call_id=f"call-{asked}")])
    last = messages[-1].parts[-1]
    return ModelResponse(parts=[TextPart(f"done: {getattr(last, 'content', '')}")])


def _log() -> Path | None:
    log = os.environ.get("PYAI_COUNTER_LOG")
    return Path(log) / "tools.log" if log else None


def _witness(line: str) -> None:
    time.sleep(float(os.environ.get("PYAI_COUNTER_DELAY_S", "0")))
    log = _log()
    if log is not None:
        with open(log, "a") as f:
            f.write(line + "\n")


def charged(key: str) -> Any:
    """The charge's reconcile: what the "payments service" (the witness log) knows of ``key``."""
    log = _log()
    for line in log.read_text().splitlines() if log is not None and log.exists() else []:
        kind, order, amount, done_key = line.split(" ")
        if kind == "charge" and done_key == key:
            return {"order": order, "charged": float(amount), "currency": "EUR"}
    return NOT_FOUND


def build(model: Any) -> Agent[None, str]:
    # ``$PYAI_COUNTER_NO_RECONCILE``: the charge has no reconcile, so a kill after it acted leaves it in doubt.
    reconcile = None if os.environ.get("PYAI_COUNTER_NO_RECONCILE") else charged
    charge_effect = Effect(key=lambda a: f"charge:{a['order']}", effect_class="irreversible", reconcile=reconcile)
    agent = Agent(model, name="counter", capabilities=[RunledgerDurability(effects={"charge": charge_effect})])

    @agent.tool_plain
    def count(tag: str, n: int) -> dict[str, Any]:
        """Count a tag (a read tool): its result is an unsorted dict with a whole-number float."""
        _witness(f"count {tag} {n} -")
        return {"tag": tag, "n": n, "weight": float(n), "seen": {"z": 1, "a": 2.0}}

    @agent.tool_plain
    def charge(order: str, amount: float) -> dict[str, Any]:
        """Charge an order (an effect, keyed by the order)."""
        ctx = EffectContext.current()
        _witness(f"charge {order} {amount} {ctx.key if ctx is not None else '-'}")
        return {"order": order, "charged": amount, "currency": "EUR"}

    return agent


def function_spec() -> AgentSpec:
    return agent_spec(build(FunctionModel(policy, model_name="counter-policy")), agent_version="v1")


def testmodel_spec() -> AgentSpec:
    return agent_spec(build(TestModel()), agent_version="v1")


def cautious(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Another model's policy, for a counterfactual of the model: it answers at once, charging nothing,
    with what it was shown (the count of tools it was offered, the last tool result it saw)."""
    last = messages[-1].parts[-1]
    return ModelResponse(
        parts=[TextPart(f"cautious ({len(info.function_tools)} tools): {getattr(last, 'content', '')}")]
    )


def cautious_model() -> PydanticAIModel:
    return PydanticAIModel(FunctionModel(cautious, model_name="counter-cautious"))
