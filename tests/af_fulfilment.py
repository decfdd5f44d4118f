"""A Microsoft Agent Framework workflow of three executors, each with a side effect, checkpointed on the ledger.

``python -m tests.af_fulfilment URL WITNESS ORDER`` fulfils ``ORDER``: ``reserve`` -> ``charge`` -> ``ship``,
one superstep each. Each executor's side effect is an effect of the run (``storage.effect`` with the key
``<executor>:<order>``) whose function appends a line to the ``WITNESS`` file: the count of real calls.
With a checkpoint of the order's workflow in the ledger it resumes from the latest one through the
framework's API (``workflow.run(checkpoint_id=...)``), else it starts with the order. Prints the outputs
as JSON. ``AF_HOLD_AFTER=<executor>`` (tests' named crash point): after that executor's side effect,
write ``<WITNESS>.held`` and block, so a kill lands after the effect and before its superstep's checkpoint.
``AF_PLAIN=1``: the side effects are plain calls, not effects (what "once" needs, shown by its absence).
A claim a kill left without an outcome is reconciled from the witness (the external system's own record);
its lease is 1 s, so a resume settles it without waiting long.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, Never

from agent_framework import Executor, Workflow, WorkflowBuilder, WorkflowContext, handler

from runledger import NOT_FOUND, connect
from runledger.integrations.agent_framework import RunledgerCheckpointStorage

# Each executor's own work before and after its side effect. Most of a superstep comes after the side
# effect, before its checkpoint: the window where a kill makes the framework run the executor again.
BEFORE_S, AFTER_S = 0.05, 0.3


def workflow_name(order: str) -> str:
    return f"fulfil-{order}"


class _Step(Executor):
    """An executor whose side effect is the effect ``<id>:<order>``, recorded in the witness file."""

    def __init__(self, id: str, storage: RunledgerCheckpointStorage, witness: Path) -> None:
        super().__init__(id=id)
        self.storage = storage
        self.witness = witness

    async def act(self, order: str) -> Any:
        await asyncio.sleep(BEFORE_S)

        def side_effect(args: dict[str, Any]) -> dict[str, Any]:
            with self.witness.open("a") as f:  # one line a real call, on disk before the effect is recorded
                f.write(json.dumps({"executor": self.id, "order": args["order"]}) + "\n")
                f.flush()
                os.fsync(f.fileno())
            return {"done": self.id, "order": args["order"]}

        def reconcile(key: str) -> Any:  # a claim a kill left without an outcome: did the call happen?
            done = self.witness.read_text().splitlines() if self.witness.exists() else []
            mine = {"executor": self.id, "order": order}
            return {"done": self.id, "order": order} if any(json.loads(x) == mine for x in done) else NOT_FOUND

        args = {"order": order}
        if os.environ.get("AF_PLAIN"):
            result = side_effect(args)
        else:
            key = f"{self.id}:{order}"
            result = await self.storage.effect(self.id, args, key=key, fn=side_effect, reconcile=reconcile, lease_s=1.0)
        if os.environ.get("AF_HOLD_AFTER") == self.id:
            Path(f"{self.witness}.held").write_text(self.id)
            await asyncio.Event().wait()  # held here until killed: after the effect, before the checkpoint
        await asyncio.sleep(AFTER_S)
        return result


class Reserve(_Step):
    @handler
    async def run(self, order: str, ctx: WorkflowContext[str]) -> None:
        await self.act(order)
        await ctx.send_message(order)


class Charge(_Step):
    @handler
    async def run(self, order: str, ctx: WorkflowContext[str]) -> None:
        await self.act(order)
        await ctx.send_message(order)


class Ship(_Step):
    @handler
    async def run(self, order: str, ctx: WorkflowContext[Never, str]) -> None:
        shipped = await self.act(order)
        await ctx.yield_output(f"{shipped['order']} shipped")


def build(order: str, storage: RunledgerCheckpointStorage, witness: Path) -> Workflow:
    reserve, charge, ship = (
        Reserve("reserve", storage, witness),
        Charge("charge", storage, witness),
        Ship("ship", storage, witness),
    )
    builder = WorkflowBuilder(name=workflow_name(order), start_executor=reserve, checkpoint_storage=storage)
    return builder.add_edge(reserve, charge).add_edge(charge, ship).build()


async def fulfil(url: str, witness: Path, order: str) -> list[Any]:
    client = await connect(url)
    try:
        storage = RunledgerCheckpointStorage(client)
        workflow = build(order, storage, witness)
        latest = await storage.get_latest(workflow_name=workflow_name(order))
        if latest is None:
            result = await workflow.run(order)
        else:
            result = await workflow.run(checkpoint_id=latest.checkpoint_id)
        return list(result.get_outputs())
    finally:
        await client.close()


if __name__ == "__main__":
    outputs = asyncio.run(fulfil(sys.argv[1], Path(sys.argv[2]), sys.argv[3]))
    print(json.dumps(outputs))
