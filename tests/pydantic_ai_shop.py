"""A Pydantic AI refund agent for the tests of ``runledger.integrations.pydantic_ai``: its model is
Pydantic AI's own ``FunctionModel`` (look the order up, look again after the tool's ``ModelRetry``,
refund, answer), its ``refund`` tool an effect keyed ``refund:<order>``.

The witnesses are the model function's list of answered calls (each the length of the history it
was given) and each tool's own log. In a process of its own (``tests.pydantic_ai_shop:spec``, as
tests/integration/test_pydantic_ai.py starts it) they are also appended to files in the directory
``$PYAI_SHOP_LOG`` (``model.log``, ``tools.log``), so a SIGKILLed process leaves them behind;
``$PYAI_SHOP_DELAY_S`` makes each model and tool call take that long.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runledger import NOT_FOUND, AgentSpec, EffectContext, SyncRun, sync_agent
from runledger.integrations.pydantic_ai import (
    Effect,
    PydanticAIModel,
    RunledgerDurability,
    agent_spec,
    declared_tools,
    recording,
)


class Crash(BaseException):
    """A crash in flight: nothing catches it, nothing records it (as a SIGKILL would)."""


@dataclass
class Shop:
    crash_at_call: int | None = None  # the model call (1-based) that crashes instead of answering
    log_dir: Path | None = None
    delay_s: float = 0.0  # each model call and tool call takes this long (``$PYAI_SHOP_DELAY_S``)
    answered: list[int] = field(default_factory=list)  # per answered model call: the history's length
    tool_log: list[str] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)

    def _log(self, name: str, line: str) -> None:
        if self.log_dir is not None:
            with open(self.log_dir / name, "a") as f:
                f.write(line + "\n")

    def model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if self.crash_at_call == len(self.answered) + 1:
            raise Crash
        time.sleep(self.delay_s)  # a model that takes its time: room for a kill at a random moment
        self.answered.append(len(messages))
        self._log("model.log", str(len(messages)))
        # By the history's length: ask, ask again after the retry prompt, refund, answer.
        if len(messages) in (1, 3):
            call_id = f"c{len(messages)}"
            return ModelResponse(parts=[ToolCallPart("lookup", {"order": "o-1"}, tool_call_id=call_id)])
        if len(messages) == 5:
            return ModelResponse(parts=[ToolCallPart("refund", {"order": "o-1", "amount": 5}, tool_call_id="c5")])
        last = messages[-1].parts[-1]
        return ModelResponse(parts=[TextPart(f"done: {getattr(last, 'content', '')}")])

    def refunded(self, key: str) -> Any:
        """The refund's reconcile: what the "payments service" (the tool log) knows of ``key``."""
        order = key.removeprefix("refund:")
        return f"refunded 5 on {order}" if f"refund {order}" in self.tool_log else NOT_FOUND

    def agent(self) -> Agent[None, str]:
        refund_effect = Effect(key=lambda a: f"refund:{a['order']}", reconcile=self.refunded)
        durability = RunledgerDurability(effects={"refund": refund_effect})
        agent = Agent(FunctionModel(self.model), name="shop", capabilities=[durability])

        @agent.tool_plain
        def lookup(order: str) -> dict[str, Any]:
            """Look an order up."""
            time.sleep(self.delay_s)
            self.tool_log.append(f"lookup {order}")
            self._log("tools.log", f"lookup {order}")
            if self.tool_log.count(f"lookup {order}") == 1:
                raise ModelRetry("the order service was busy, ask again")  # a control-flow signal, recorded
            return {"order": order, "total": 10}

        @agent.tool_plain
        async def refund(order: str, amount: int) -> str:
            """Refund an order."""
            ctx = EffectContext.current()
            self.keys.append(ctx.key if ctx is not None else None)
            await asyncio.sleep(self.delay_s)
            self.tool_log.append(f"refund {order}")
            self._log("tools.log", f"refund {order}")
            return f"refunded {amount} on {order}"

        return agent


def _shop() -> Shop:
    log = os.environ.get("PYAI_SHOP_LOG")
    shop = Shop(log_dir=Path(log) if log else None, delay_s=float(os.environ.get("PYAI_SHOP_DELAY_S", "0")))
    if log:  # a resumed process's lookup knows the calls an earlier process made
        tools = Path(log) / "tools.log"
        shop.tool_log = tools.read_text().splitlines() if tools.exists() else []
    return shop


def spec() -> AgentSpec:
    """The shop in a process of its own: its witnesses in ``$PYAI_SHOP_LOG``."""
    return agent_spec(_shop().agent(), agent_version="v1")


def sync_spec_of(shop: Shop) -> AgentSpec:
    """The shop's agent called with Pydantic AI's blocking ``agent.run_sync`` from a blocking agent function."""
    agent = shop.agent()
    durability = RunledgerDurability.from_agent(agent)
    assert durability is not None

    @sync_agent
    def handle(run: SyncRun) -> Any:
        with recording(run):
            return agent.run_sync(str(run.input)).output

    tools = declared_tools(agent, durability.effects)
    return AgentSpec("shop", handle, PydanticAIModel(), agent_version="v1", tools=tools)


def sync_spec() -> AgentSpec:
    """``sync_spec_of`` the shop in a process of its own, as ``spec``."""
    return sync_spec_of(_shop())
