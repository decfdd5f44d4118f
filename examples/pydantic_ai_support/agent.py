"""A Pydantic AI support agent that runs durably on runledger: each model request and tool call is a
step of a run, the refund an effect applied at most once, and a crashed run resumes from the record.

    python -m runledger.examples.pydantic_ai_support.agent --nats URL --run R-1 "Refund order-8891, it arrived broken."
    python -m runledger.examples.pydantic_ai_support.agent --nats URL --run R-1 --resume   # answered from the record

From the ``runledger`` program (``runledger up`` prints the URL)::

    runledger run --agent runledger.examples.pydantic_ai_support.agent:spec --input '"Refund order-8891"'
    RUNLEDGER_CRASH_AT=step:2:recorded runledger run --agent ... --run-id R-2 --input ...   # killed mid-run
    runledger resume R-2 --agent runledger.examples.pydantic_ai_support.agent:spec        # no call repeated

The model is Pydantic AI's own ``FunctionModel`` with a scripted policy (look the order up, refund
it, answer), so the example runs offline; ``--model openai:gpt-4o`` (or ``$PYDANTIC_AI_MODEL``) runs
the same agent on a real model, which Pydantic AI builds from the name (its provider's package and
API key as Pydantic AI needs them; neither is recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runledger import NOT_FOUND, AgentSpec, EffectContext, connect
from runledger.integrations.pydantic_ai import Effect, RunledgerDurability, agent_spec
from runledger.sdk.lifecycle import resume_run, start_run

NAME = "pydantic-ai-support"
ORDERS = {"order-8891": {"order": "order-8891", "total": 42.0, "status": "delivered"}}
REFUNDS: dict[str, dict[str, Any]] = {}  # the "payments service": refunds by idempotency key


def policy(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A scripted model: look the order up, refund it in full, then say so."""
    last = messages[-1].parts[-1]
    if last.part_kind == "user-prompt":
        order = next((o for o in ORDERS if o in str(last.content)), "order-8891")
        return ModelResponse(parts=[ToolCallPart("lookup_order", {"order": order})])
    if last.part_kind == "tool-return" and last.tool_name == "lookup_order":
        found = last.content if isinstance(last.content, dict) else {}
        args = {"order": found.get("order", "order-8891"), "amount": found.get("total", 0)}
        return ModelResponse(parts=[ToolCallPart("refund", args)])
    return ModelResponse(parts=[TextPart(f"Done: {getattr(last, 'content', '')}")])


def refunded(key: str) -> Any:
    """The refund's reconcile: ask the payments service whether the key was refunded."""
    return REFUNDS.get(key, NOT_FOUND)


def build_agent(model: Any = None) -> Agent[None, str]:
    # The refund is an effect: claimed on its business identity before it acts, never twice.
    refund_effect = Effect(key=lambda a: f"refund:{a['order']}", effect_class="irreversible", reconcile=refunded)
    durability = RunledgerDurability(effects={"refund": refund_effect})
    agent = Agent(
        model or FunctionModel(policy, model_name="support-policy"),
        name=NAME,
        instructions="You are a support agent. Look the order up before you refund it.",
        capabilities=[durability],
    )

    @agent.tool_plain
    def lookup_order(order: str) -> dict[str, Any]:
        """Look an order up by its number."""
        return ORDERS.get(order, {"order": order, "error": "not found"})

    @agent.tool_plain
    def refund(order: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        ctx = EffectContext.current()
        key = ctx.key if ctx is not None else f"refund:{order}"  # the service's idempotency key
        return REFUNDS.setdefault(key, {"refund_id": f"rf-{len(REFUNDS) + 1}", "order": order, "amount": amount})

    return agent


def spec(model: str | None = None) -> AgentSpec:
    """The agent as a runledger agent: ``$PYDANTIC_AI_MODEL`` (or ``model``) names a real model."""
    return agent_spec(build_agent(model or os.environ.get("PYDANTIC_AI_MODEL")), agent_version="v1")


async def main_async(args: argparse.Namespace) -> None:
    agent = spec(args.model)
    async with await connect(args.nats) as client:
        if args.resume:
            result = await resume_run(client, agent, args.run)
        else:
            result = await start_run(client, agent, args.question, run_id=args.run)
    print(result.status, json.dumps(result.output) if result.status == "completed" else result.error)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("question", nargs="?", default="Please refund order-8891, it arrived broken.")
    parser.add_argument("--nats", required=True, help="the ledger's NATS URL")
    parser.add_argument("--run", required=True, help="the run id")
    parser.add_argument("--resume", action="store_true", help="resume the run instead of starting it")
    parser.add_argument("--model", default=None, help="a Pydantic AI model name (default: the scripted policy)")
    asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
