"""A recorded LangGraph thread re-run in real Docker sandboxes: re-driven from the record, live, and
as a counterfactual with a changed model whose decision at the fork ``runledger diff`` shows.

The thread is the example's (examples/langgraph_support): it stops at the reviewer's interrupt,
is resumed by a second invocation with ``Command(resume=...)``, and refunds once. In the sandbox
the same graph runs on an in-memory saver, its model and tool calls served by the broker by step
number, the recorded first input and resume value given to it from the parent's record. The
guest imports LangGraph: the image is the sandbox image with the ``langgraph`` extra's layer."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from runledger.cli import main
from runledger.examples.langgraph_support import agent as support
from runledger.examples.langgraph_support.agent import ORDERS, handle
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.integrations.langgraph import RunledgerSaver, thread_run_id
from runledger.log.client import LedgerClient
from runledger.log.server import ServerState
from runledger.protect.loading import load_run
from runledger.record.fold import Checkpoint, fold
from runledger.sandbox.containers import SandboxPolicy, SandboxPool
from runledger.sandbox.diff import diff, render
from runledger.sandbox.errors import RerunRequestError
from runledger.sandbox.image import find_image
from runledger.sandbox.rerun import Rerunner, RerunRequest
from tests.integration.sandbox.owned import containers_of

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(600)]
AGENT = "runledger.examples.langgraph_support.agent:spec"
STRICT = "runledger.examples.langgraph_support.agent:strict_model"


@pytest.fixture(scope="session")
def langgraph_image(docker: Any) -> str:
    return find_image(docker, ["langgraph"])  # built before the tests: `runledger sandbox build --extra langgraph`


@pytest.fixture
async def lg_rerunner(docker: Any, langgraph_image: str, client: LedgerClient) -> AsyncIterator[Rerunner]:
    # The guest imports LangGraph and LangChain (~8 s on a busy machine, ~75 MiB): a longer time
    # limit than the refund agent's, the default memory limit.
    pool = SandboxPool(docker, SandboxPolicy(image=langgraph_image, timeout_s=120), size=0)
    try:
        yield Rerunner(client, pool)
    finally:
        await pool.close()
        leftovers = containers_of(docker, os.getpid())
        assert leftovers == [], "a sandbox container was left behind"


async def record_thread(client: LedgerClient, thread: str, order: str = "order-8891") -> Checkpoint:
    """The example's thread as a person drives it: it waits for the reviewer, then is approved."""
    assert (await handle(client, thread, order))["status"] == "waiting"
    done = await handle(client, thread, order, approve=True)
    assert done["status"] == "completed" and "Refunded" in done["answer"], done
    return fold((await load_run(client, thread_run_id(thread), agent="langgraph")).records)


def kinds(cp: Checkpoint) -> list[tuple[str, str | None]]:
    return [(cp.steps[s].kind, cp.steps[s].name) for s in sorted(cp.steps)]


THREAD_STEPS = [("model", "scripted-support-1"), ("tool", "lookup_order"), ("model", "scripted-support-1"),
                ("effect", "refund"), ("model", "scripted-support-1")]  # fmt: skip


class CountingOrders(dict[str, Any]):
    """The example's order table, counting the lookups its read tool makes on the host."""

    lookups = 0

    def get(self, key: str, default: Any = None) -> Any:
        type(self).lookups += 1
        return super().get(key, default)


async def test_counterfactual_model_decides_differently_at_the_fork_and_diff_shows_it(
    client: LedgerClient,
    nats_server: ServerState,
    lg_rerunner: Rerunner,
    payments: PaymentsService,
    capsys: pytest.CaptureFixture[str],
) -> None:
    parent = await record_thread(client, "lg-cf")
    assert kinds(parent) == THREAD_STEPS
    assert len(payments.calls()) == 1
    request = RerunRequest(
        parent_run_id="lg-cf", agent=AGENT, mode="counterfactual", fork_step=2, base_mode="live",
        change={"model": STRICT},
    )  # fmt: skip
    result = await lg_rerunner.rerun(request)
    assert result.status == "completed", result.error
    assert result.output["thread"] == "lg-cf" and "photo" in result.output["answer"], result.output
    assert len(payments.calls()) == 1  # the branch refunded nothing

    branch = fold((await load_run(client, result.run_id)).records)
    assert branch.parent is not None and branch.parent["changed"] == "model"
    assert kinds(branch) == [*THREAD_STEPS[:2], ("model", "scripted-strict-1")]
    assert branch.input["thread_id"] == "lg-cf"
    assert [next(iter(i)) for i in branch.input["invocations"]] == ["input", "resume"]  # from the parent's record

    d = await diff(client, "lg-cf", result.run_id)
    assert d.changed == "model"
    assert d.version_delta["model"] == ["scripted-support-1", "scripted-strict-1"]
    assert d.first_difference == 2
    assert d.fork_decision is not None and not d.fork_decision.same
    assert (d.fork_decision.parent_step, d.fork_decision.branch_step) == (2, 2)
    assert d.fork_decision.parent is not None and d.fork_decision.branch is not None
    assert [c["name"] for c in d.fork_decision.parent["output"]["tool_calls"]] == ["refund"]
    assert d.fork_decision.branch["output"]["tool_calls"] == []
    assert "photo" in d.fork_decision.branch["output"]["content"]
    # The strict branch ends at its answer: the thread's refund and its last answer are removed.
    assert [(s.op, s.parent_step, s.branch_step) for s in d.steps] == [
        ("changed", 2, 2), ("removed", 3, None), ("removed", 4, None),
    ]  # fmt: skip

    assert await asyncio.to_thread(main, ["diff", "lg-cf", result.run_id, "--nats", nats_server.url]) == 0
    shown = capsys.readouterr().out
    assert "changed model" in shown and "decision at the fork:" in shown
    assert "first difference at step 2" in shown
    assert '  parent step 2: scripted-support-1: calls refund({"amount": 49.9, "order": "order-8891"})' in shown
    assert "  branch step 2: scripted-strict-1: Please send us a photo" in shown
    assert render(d).splitlines()[0] in shown


async def test_redrive_and_live_reexecution_of_the_thread(
    client: LedgerClient, lg_rerunner: Rerunner, payments: PaymentsService, monkeypatch: pytest.MonkeyPatch
) -> None:
    await record_thread(client, "lg-rd")
    parent_out = fold((await load_run(client, "lg-rd")).records).output
    monkeypatch.setattr(support, "ORDERS", CountingOrders(ORDERS))

    # Deterministic re-drive from the top: every model call live (the same scripted model decides
    # the same), the lookup and the refund served from the record, the reviewer's recorded answer
    # given to the interrupt.
    redrive = await lg_rerunner.rerun(RerunRequest(parent_run_id="lg-rd", agent=AGENT, mode="redrive", fork_step=0))
    assert redrive.status == "completed", redrive.error
    assert redrive.output == parent_out
    assert CountingOrders.lookups == 0
    assert len(payments.calls()) == 1
    cp = fold((await load_run(client, redrive.run_id)).records)
    assert kinds(cp) == THREAD_STEPS and cp.steps[3].status == "committed"
    assert (await diff(client, "lg-rd", redrive.run_id)).first_difference is None

    # Re-driven from the last step: steps 0-3 are served only if the guest's graph asks for exactly
    # what the thread recorded (kind, name, arguments digest; model step 2's prompt holds the reply
    # of step 0 rebuilt from the record and the lookup's served result), the effect by its key.
    late = await lg_rerunner.rerun(RerunRequest(parent_run_id="lg-rd", agent=AGENT, mode="redrive", fork_step=4))
    assert late.status == "completed", late.error
    assert late.output == parent_out
    assert (await diff(client, "lg-rd", late.run_id)).first_difference is None
    assert CountingOrders.lookups == 0 and len(payments.calls()) == 1

    # Live re-execution from the top: the lookup runs on the host, the refund's key is committed
    # with the same arguments, so the record answers it and the payments service sees nothing.
    live = await lg_rerunner.rerun(RerunRequest(parent_run_id="lg-rd", agent=AGENT, mode="live", fork_step=0))
    assert live.status == "completed", live.error
    assert live.output == parent_out
    assert CountingOrders.lookups == 1
    assert len(payments.calls()) == 1
    cp = fold((await load_run(client, live.run_id)).records)
    assert kinds(cp) == THREAD_STEPS
    assert cp.steps[3].status == "committed" and cp.steps[3].key == "refund:order-8891"


async def test_trace_replay_shows_the_thread_and_runs_nothing(
    client: LedgerClient,
    nats_server: ServerState,
    lg_rerunner: Rerunner,
    payments: PaymentsService,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await record_thread(client, "lg-tr")
    with pytest.raises(RerunRequestError, match="trace replay executes nothing"):
        await lg_rerunner.rerun(RerunRequest(parent_run_id="lg-tr", agent=AGENT, mode="replay"))
    assert await asyncio.to_thread(main, ["show", "lg-tr", "--nats", nats_server.url]) == 0
    shown = capsys.readouterr().out
    for line in ("graph.checkpointed", "model.called", "lookup_order", "effect.committed", "run.completed"):
        assert line in shown
    assert len(payments.calls()) == 1


async def test_a_thread_recorded_without_the_graphs_spec_is_refused_with_a_clear_error(
    client: LedgerClient, lg_rerunner: Rerunner, payments: PaymentsService
) -> None:
    saver = RunledgerSaver(client)  # no agent=spec(): the thread records no version of the graph's code
    graph = support.build_graph(saver)
    config: Any = {"configurable": {"thread_id": "lg-plain"}}
    await graph.ainvoke({"messages": [("user", "Where is my parcel?")]}, config)
    request = RerunRequest(parent_run_id="lg-plain", agent=AGENT, mode="redrive", fork_step=0)
    with pytest.raises(Exception, match="version") as caught:
        await lg_rerunner.rerun(request)
    assert "lg-plain" in str(caught.value)
    assert json.dumps(payments.calls()) == "[]"
