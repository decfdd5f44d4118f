# Copyright (c) Microsoft. All rights reserved. (MIT License: github.com/microsoft/agent-framework)
# ruff: noqa
"""Microsoft Agent Framework's own checkpoint test cases, copied, run against runledger's storage.

Copied from microsoft/agent-framework at 5eb3eb745e16324ac7bffb1dbe006d8f13c8d993,
python/packages/core/tests/workflow/: every storage and workflow case of test_checkpoint.py (the
``test_memory_checkpoint_storage_*`` and ``test_workflow_*`` cases; the ``WorkflowCheckpoint``
dataclass cases test no storage, the ``test_file_checkpoint_storage_*`` ones repeat the memory cases
plus file-system details), all of test_checkpoint_validation.py, and the three storage cases of
test_checkpoint_unrestricted_pickle.py. Test bodies and helpers are unchanged (the file was cut with
``ast`` by function, not edited, and renamed ``test_*`` to ``case_*`` so that pytest collects them only through
the test that runs them); only this header and the imports differ: the names
``InMemoryCheckpointStorage`` and ``FileCheckpointStorage`` are bound to factories of
``RunledgerCheckpointStorage`` on the current test's ledger (``STORAGES.client``). Each in-memory
storage gets an agent of its own (a fresh, empty storage, as the framework's is) and allows the
cases' own types; file storages on the
same directory share one (what one saves, the other reads). tests/integration/test_agent_framework.py
runs each case.
"""

import hashlib
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest
from agent_framework import (
    WorkflowBuilder,
    WorkflowCheckpoint,
    WorkflowCheckpointException,
    WorkflowContext,
    WorkflowEvent,
    WorkflowExecutor,
    WorkflowRunState,
    handler,
)
from agent_framework._workflows._checkpoint_encoding import _PICKLE_MARKER, _TYPE_MARKER
from agent_framework._workflows._executor import Executor
from agent_framework._workflows._runner_context import WorkflowMessage
from typing_extensions import Never

from runledger import LedgerClient
from runledger.integrations.agent_framework import RunledgerCheckpointStorage


class _Storages:
    """The ledger the cases' storages are made on (set by the test for each case) and a counter."""

    client: LedgerClient | None = None
    made = 0


STORAGES = _Storages()


def InMemoryCheckpointStorage() -> RunledgerCheckpointStorage:  # noqa: N802 (the framework's name)
    assert STORAGES.client is not None, "set STORAGES.client to the test's connected client"
    STORAGES.made += 1
    # An in-memory storage holds objects and restricts no type: the cases' own types are allowed,
    # as the file-storage twins of these cases allow them (allowed_checkpoint_types).
    own = [
        f"{__name__}:{t}"
        for t in ("_TestToolApprovalRequest", "_TestExecutorState", "_TestApprovalRequest", "_TestCustomData")
    ]
    return RunledgerCheckpointStorage(STORAGES.client, agent=f"af-case-{STORAGES.made}", allowed_checkpoint_types=own)


def FileCheckpointStorage(  # noqa: N802 (the framework's name)
    storage_path: str, *, allowed_checkpoint_types: list[str] | None = None
) -> RunledgerCheckpointStorage:
    assert STORAGES.client is not None, "set STORAGES.client to the test's connected client"
    agent = "af-dir-" + hashlib.sha256(str(storage_path).encode()).hexdigest()[:16]
    return RunledgerCheckpointStorage(STORAGES.client, agent=agent, allowed_checkpoint_types=allowed_checkpoint_types)


# -- test_checkpoint.py --------------------------------------------------------------------------------


@dataclass
class _TestToolApprovalRequest:
    """Request data for tool approval in tests."""

    tool_name: str
    arguments: dict[str, Any]
    timestamp: datetime


@dataclass
class _TestExecutorState:
    """Executor state for tests."""

    counter: int
    history: list[str]


@dataclass
class _TestApprovalRequest:
    """Approval request data for tests."""

    action: str
    params: tuple[Any, ...]


@dataclass
class _TestCustomData:
    """Custom data for tests."""

    name: str
    value: int
    tags: list[str]


async def case_memory_checkpoint_storage_save_and_load():
    storage = InMemoryCheckpointStorage()
    checkpoint = WorkflowCheckpoint(
        workflow_name="test-workflow",
        graph_signature_hash="test-hash",
        messages={"executor1": [{"data": "hello"}]},  # type: ignore[arg-type, list-item]  # ty: ignore[invalid-argument-type]  # raw dict for serialization test
        pending_request_info_events={"req123": {"data": "test"}},  # type: ignore[arg-type, dict-item]  # ty: ignore[invalid-argument-type]  # raw dict for serialization test
    )

    # Save checkpoint
    saved_id = await storage.save(checkpoint)
    assert saved_id == checkpoint.checkpoint_id

    # Load checkpoint
    loaded_checkpoint = await storage.load(checkpoint.checkpoint_id)
    assert loaded_checkpoint is not None
    assert loaded_checkpoint.checkpoint_id == checkpoint.checkpoint_id
    assert loaded_checkpoint.workflow_name == checkpoint.workflow_name
    assert loaded_checkpoint.graph_signature_hash == checkpoint.graph_signature_hash
    assert loaded_checkpoint.messages == checkpoint.messages
    assert loaded_checkpoint.pending_request_info_events == checkpoint.pending_request_info_events


async def case_memory_checkpoint_storage_load_nonexistent():
    storage = InMemoryCheckpointStorage()

    with pytest.raises(WorkflowCheckpointException):
        await storage.load("nonexistent-id")


async def case_memory_checkpoint_storage_list():
    storage = InMemoryCheckpointStorage()

    # Create checkpoints for different workflows
    checkpoint1 = WorkflowCheckpoint(workflow_name="workflow-1", graph_signature_hash="hash-1")
    checkpoint2 = WorkflowCheckpoint(workflow_name="workflow-1", graph_signature_hash="hash-2")
    checkpoint3 = WorkflowCheckpoint(workflow_name="workflow-2", graph_signature_hash="hash-3")

    await storage.save(checkpoint1)
    await storage.save(checkpoint2)
    await storage.save(checkpoint3)

    # Test list_ids for workflow-1
    workflow1_checkpoint_ids = await storage.list_checkpoint_ids(workflow_name="workflow-1")
    assert len(workflow1_checkpoint_ids) == 2
    assert checkpoint1.checkpoint_id in workflow1_checkpoint_ids
    assert checkpoint2.checkpoint_id in workflow1_checkpoint_ids

    # Test list for workflow-1 (returns objects)
    workflow1_checkpoints = await storage.list_checkpoints(workflow_name="workflow-1")
    assert len(workflow1_checkpoints) == 2
    assert all(isinstance(cp, WorkflowCheckpoint) for cp in workflow1_checkpoints)
    assert {cp.checkpoint_id for cp in workflow1_checkpoints} == {checkpoint1.checkpoint_id, checkpoint2.checkpoint_id}

    # Test list_ids for workflow-2
    workflow2_checkpoint_ids = await storage.list_checkpoint_ids(workflow_name="workflow-2")
    assert len(workflow2_checkpoint_ids) == 1
    assert checkpoint3.checkpoint_id in workflow2_checkpoint_ids

    # Test list for workflow-2 (returns objects)
    workflow2_checkpoints = await storage.list_checkpoints(workflow_name="workflow-2")
    assert len(workflow2_checkpoints) == 1
    assert workflow2_checkpoints[0].checkpoint_id == checkpoint3.checkpoint_id

    # Test list_ids for non-existent workflow
    empty_checkpoint_ids = await storage.list_checkpoint_ids(workflow_name="nonexistent-workflow")
    assert len(empty_checkpoint_ids) == 0

    # Test list for non-existent workflow
    empty_checkpoints = await storage.list_checkpoints(workflow_name="nonexistent-workflow")
    assert len(empty_checkpoints) == 0


async def case_memory_checkpoint_storage_delete():
    storage = InMemoryCheckpointStorage()
    checkpoint = WorkflowCheckpoint(workflow_name="test-workflow", graph_signature_hash="test-hash")

    # Save checkpoint
    await storage.save(checkpoint)
    assert await storage.load(checkpoint.checkpoint_id) is not None

    # Delete checkpoint
    result = await storage.delete(checkpoint.checkpoint_id)
    assert result is True

    # Verify deletion
    with pytest.raises(WorkflowCheckpointException):
        await storage.load(checkpoint.checkpoint_id)

    # Try to delete again
    result = await storage.delete(checkpoint.checkpoint_id)
    assert result is False


async def case_memory_checkpoint_storage_get_latest():
    import asyncio

    storage = InMemoryCheckpointStorage()

    # Create checkpoints with small delays to ensure different timestamps
    checkpoint1 = WorkflowCheckpoint(workflow_name="workflow-1", graph_signature_hash="hash-1")
    await asyncio.sleep(0.01)
    checkpoint2 = WorkflowCheckpoint(workflow_name="workflow-1", graph_signature_hash="hash-2")
    await asyncio.sleep(0.01)
    checkpoint3 = WorkflowCheckpoint(workflow_name="workflow-2", graph_signature_hash="hash-3")

    await storage.save(checkpoint1)
    await storage.save(checkpoint2)
    await storage.save(checkpoint3)

    # Test get_latest for workflow-1
    latest = await storage.get_latest(workflow_name="workflow-1")
    assert latest is not None
    assert latest.checkpoint_id == checkpoint2.checkpoint_id

    # Test get_latest for workflow-2
    latest2 = await storage.get_latest(workflow_name="workflow-2")
    assert latest2 is not None
    assert latest2.checkpoint_id == checkpoint3.checkpoint_id

    # Test get_latest for non-existent workflow
    latest_none = await storage.get_latest(workflow_name="nonexistent-workflow")
    assert latest_none is None


async def case_workflow_checkpoint_chaining_via_previous_checkpoint_id():
    """Test that consecutive checkpoints created by a workflow are properly chained via previous_checkpoint_id."""
    from typing_extensions import Never

    from agent_framework import WorkflowBuilder, WorkflowContext, handler
    from agent_framework._workflows._executor import Executor

    class StartExecutor(Executor):
        @handler
        async def run(self, message: str, ctx: WorkflowContext[str]) -> None:
            await ctx.send_message(message, target_id="middle")

    class MiddleExecutor(Executor):
        @handler
        async def process(self, message: str, ctx: WorkflowContext[str]) -> None:
            await ctx.send_message(message + "-processed", target_id="finish")

    class FinishExecutor(Executor):
        @handler
        async def finish(self, message: str, ctx: WorkflowContext[Never, str]) -> None:  # type: ignore[valid-type]
            await ctx.yield_output(message + "-done")

    storage = InMemoryCheckpointStorage()

    start = StartExecutor(id="start")
    middle = MiddleExecutor(id="middle")
    finish = FinishExecutor(id="finish")

    workflow = (
        WorkflowBuilder(max_iterations=10, start_executor=start, checkpoint_storage=storage)
        .add_edge(start, middle)
        .add_edge(middle, finish)
        .build()
    )

    # Run workflow - this creates checkpoints at each superstep
    _ = [event async for event in workflow.run("hello", stream=True)]

    # Get all checkpoints sorted by timestamp
    checkpoints = sorted(await storage.list_checkpoints(workflow_name=workflow.name), key=lambda c: c.timestamp)

    # Should have multiple checkpoints (one initial + one per superstep)
    assert len(checkpoints) >= 2, f"Expected at least 2 checkpoints, got {len(checkpoints)}"

    # Verify chaining: first checkpoint has no previous
    assert checkpoints[0].previous_checkpoint_id is None

    # Subsequent checkpoints should chain to the previous one
    for i in range(1, len(checkpoints)):
        assert checkpoints[i].previous_checkpoint_id == checkpoints[i - 1].checkpoint_id, (
            f"Checkpoint {i} should chain to checkpoint {i - 1}"
        )


async def case_workflow_checkpoint_ancestry_preserved_after_resume():
    """Resuming from a checkpoint must preserve ancestry: future checkpoints chain back to the resumed one."""
    from typing_extensions import Never

    from agent_framework import WorkflowBuilder, WorkflowContext, handler
    from agent_framework._workflows._executor import Executor

    class StartExecutor(Executor):
        @handler
        async def run(self, message: str, ctx: WorkflowContext[str]) -> None:
            await ctx.send_message(message, target_id="middle")

    class MiddleExecutor(Executor):
        @handler
        async def process(self, message: str, ctx: WorkflowContext[str]) -> None:
            await ctx.send_message(message + "-processed", target_id="finish")

    class FinishExecutor(Executor):
        @handler
        async def finish(self, message: str, ctx: WorkflowContext[Never, str]) -> None:  # type: ignore[valid-type]
            await ctx.yield_output(message + "-done")

    storage = InMemoryCheckpointStorage()

    def _build_workflow() -> Any:
        start = StartExecutor(id="start")
        middle = MiddleExecutor(id="middle")
        finish = FinishExecutor(id="finish")
        return (
            WorkflowBuilder(
                name="resume-ancestry-test",
                max_iterations=10,
                start_executor=start,
                checkpoint_storage=storage,
            )
            .add_edge(start, middle)
            .add_edge(middle, finish)
            .build()
        )

    # First run: produce an initial chain of checkpoints
    workflow = _build_workflow()
    workflow_name = workflow.name
    _ = [event async for event in workflow.run("hello", stream=True)]

    initial_checkpoints = sorted(await storage.list_checkpoints(workflow_name=workflow_name), key=lambda c: c.timestamp)
    assert len(initial_checkpoints) >= 3, (
        f"Need at least 3 initial checkpoints to pick a middle one, got {len(initial_checkpoints)}"
    )
    initial_ids = {cp.checkpoint_id for cp in initial_checkpoints}

    # Pick an intermediate checkpoint to resume from (not the first, not the last)
    resume_from = initial_checkpoints[len(initial_checkpoints) // 2]

    # Resume on a fresh workflow instance (same graph signature) and run to completion
    resumed_workflow = _build_workflow()
    assert resumed_workflow.name == workflow_name
    _ = [event async for event in resumed_workflow.run(checkpoint_id=resume_from.checkpoint_id, stream=True)]

    # Inspect new checkpoints created after resuming
    all_checkpoints = sorted(await storage.list_checkpoints(workflow_name=workflow_name), key=lambda c: c.timestamp)
    new_checkpoints = [cp for cp in all_checkpoints if cp.checkpoint_id not in initial_ids]
    assert new_checkpoints, "Resuming from an intermediate checkpoint should produce new checkpoints"

    # The very first checkpoint created after resuming must chain back to the resumed checkpoint
    assert new_checkpoints[0].previous_checkpoint_id == resume_from.checkpoint_id, (
        "First post-resume checkpoint must chain to the checkpoint that was resumed from; "
        f"got previous_checkpoint_id={new_checkpoints[0].previous_checkpoint_id!r}, "
        f"expected {resume_from.checkpoint_id!r}"
    )

    # Subsequent post-resume checkpoints must continue chaining
    for i in range(1, len(new_checkpoints)):
        assert new_checkpoints[i].previous_checkpoint_id == new_checkpoints[i - 1].checkpoint_id, (
            f"Post-resume checkpoint {i} should chain to checkpoint {i - 1}"
        )

    # Walking the chain backwards from the most recent checkpoint must reach the original root
    # without breaks (i.e. the full ancestry across the resume boundary is intact).
    checkpoints_by_id = {cp.checkpoint_id: cp for cp in all_checkpoints}
    chain: list[str] = []
    cursor: str | None = new_checkpoints[-1].checkpoint_id
    while cursor is not None:
        chain.append(cursor)
        cursor = checkpoints_by_id[cursor].previous_checkpoint_id
    # Chain must include the resumed-from checkpoint and terminate at the original root
    assert resume_from.checkpoint_id in chain
    assert chain[-1] == initial_checkpoints[0].checkpoint_id
    assert checkpoints_by_id[chain[-1]].previous_checkpoint_id is None


async def case_workflow_entry_checkpoint_records_input_and_replays():
    """The entry checkpoint records the run's raw input, enabling a full replay from the start executor.

    The first checkpoint is created before any executor runs and captures the input
    message seeded onto the start executor's internal self-edge. Restoring it on a fresh instance
    re-delivers that input to the start executor, so the entire run - including the start executor -
    replays and produces the same output.
    """
    from typing_extensions import Never

    from agent_framework import WorkflowBuilder, WorkflowContext, handler
    from agent_framework._workflows._const import INTERNAL_SOURCE_ID
    from agent_framework._workflows._executor import Executor

    class StartExecutor(Executor):
        @handler
        async def run(self, message: str, ctx: WorkflowContext[str]) -> None:
            await ctx.send_message(message + "-start", target_id="finish")

    class FinishExecutor(Executor):
        @handler
        async def finish(self, message: str, ctx: WorkflowContext[Never, str]) -> None:  # type: ignore[valid-type]
            await ctx.yield_output(message + "-done")

    storage = InMemoryCheckpointStorage()

    def _build_workflow() -> Any:
        start = StartExecutor(id="start")
        finish = FinishExecutor(id="finish")
        return (
            WorkflowBuilder(
                name="entry-replay-test",
                max_iterations=10,
                start_executor=start,
                checkpoint_storage=storage,
            )
            .add_edge(start, finish)
            .build()
        )

    # First run.
    workflow = _build_workflow()
    workflow_name = workflow.name
    first_outputs = (await workflow.run("hello")).get_outputs()
    assert first_outputs == ["hello-start-done"]

    # The entry checkpoint is created before any executor runs.
    checkpoints = await storage.list_checkpoints(workflow_name=workflow_name)
    entry = [cp for cp in checkpoints if cp.iteration_count == 0]
    assert len(entry) == 1, "A fresh checkpointed run must create exactly one entry checkpoint at iteration 0"
    entry_cp = entry[0]
    assert entry_cp.previous_checkpoint_id is None

    # The raw input is recorded as an in-flight message on the start executor's internal self-edge.
    seeded = entry_cp.messages.get(INTERNAL_SOURCE_ID("start"))
    assert seeded is not None and len(seeded) == 1, "Entry checkpoint must record the seeded input message"
    assert seeded[0].data == "hello"

    # Restore the entry checkpoint on a fresh instance: the start executor replays from the raw input
    # and the whole run reproduces the original output.
    replay_workflow = _build_workflow()
    replay_outputs = (await replay_workflow.run(checkpoint_id=entry_cp.checkpoint_id)).get_outputs()
    assert replay_outputs == first_outputs


async def case_workflow_one_checkpoint_per_superstep_lineage_and_replay():
    """A checkpointed run yields exactly one checkpoint per superstep plus the entry checkpoint,
    forms a single unbroken lineage, and can be replayed from any pre-terminal checkpoint.

    - Count: checkpoints == (# supersteps) + 1 (the iteration-0 entry checkpoint), with contiguous
      iteration counts ``0..N`` (no gaps or duplicates).
    - Lineage: the entry checkpoint has no parent and every later checkpoint chains to its predecessor.
    - Replay: restoring any non-terminal checkpoint on a fresh instance reproduces the final output.
    """
    from typing_extensions import Never

    from agent_framework import WorkflowBuilder, WorkflowContext, handler
    from agent_framework._workflows._executor import Executor

    class StartExecutor(Executor):
        @handler
        async def run(self, message: str, ctx: WorkflowContext[str]) -> None:
            await ctx.send_message(message + "-start", target_id="middle")

    class MiddleExecutor(Executor):
        @handler
        async def process(self, message: str, ctx: WorkflowContext[str]) -> None:
            await ctx.send_message(message + "-middle", target_id="finish")

    class FinishExecutor(Executor):
        @handler
        async def finish(self, message: str, ctx: WorkflowContext[Never, str]) -> None:  # type: ignore[valid-type]
            await ctx.yield_output(message + "-done")

    storage = InMemoryCheckpointStorage()

    def _build_workflow() -> Any:
        start = StartExecutor(id="start")
        middle = MiddleExecutor(id="middle")
        finish = FinishExecutor(id="finish")
        return (
            WorkflowBuilder(
                name="per-superstep-test",
                max_iterations=10,
                start_executor=start,
                checkpoint_storage=storage,
            )
            .add_edge(start, middle)
            .add_edge(middle, finish)
            .build()
        )

    # First run: count supersteps via the emitted control-plane events.
    workflow = _build_workflow()
    workflow_name = workflow.name
    events = [event async for event in workflow.run("hello", stream=True)]
    first_outputs = [event.data for event in events if event.type == "output"]
    superstep_count = sum(1 for event in events if event.type == "superstep_completed")
    assert first_outputs == ["hello-start-middle-done"]
    assert superstep_count == 3, "start -> middle -> finish converges in three supersteps"

    checkpoints = sorted(
        await storage.list_checkpoints(workflow_name=workflow_name),
        key=lambda c: c.iteration_count,
    )

    # Count: one checkpoint per superstep plus the entry checkpoint, with contiguous iteration counts.
    assert len(checkpoints) == superstep_count + 1
    assert [cp.iteration_count for cp in checkpoints] == list(range(superstep_count + 1))

    # Lineage: the entry checkpoint has no parent; every later checkpoint chains to its predecessor.
    assert checkpoints[0].previous_checkpoint_id is None
    for prev, cur in zip(checkpoints, checkpoints[1:]):
        assert cur.previous_checkpoint_id == prev.checkpoint_id, (
            f"Checkpoint at iteration {cur.iteration_count} must chain to iteration {prev.iteration_count}"
        )

    # Replay: restoring any non-terminal checkpoint reproduces the final output. The terminal
    # checkpoint (highest iteration) is the converged state with no work left, so it is excluded.
    for cp in checkpoints[:-1]:
        replay_workflow = _build_workflow()
        replay_outputs = (await replay_workflow.run(checkpoint_id=cp.checkpoint_id)).get_outputs()
        assert replay_outputs == first_outputs, (
            f"Replay from the checkpoint at iteration {cp.iteration_count} must reproduce the final output"
        )


async def case_workflow_response_entry_checkpoint_records_response_and_replays():
    """Delivering responses records a response-entry checkpoint that captures the responses in-flight,
    making a human-in-the-loop continuation fully replayable.

    The response-entry checkpoint is created before the runner processes the responses. It sits at
    the same iteration as the pending-request (IDLE) checkpoint but is a distinct checkpoint that
    chains from it and carries the delivered response as an in-flight message (with no pending
    requests). Resuming from it on a fresh instance re-delivers the response and reproduces the output.
    """
    from typing_extensions import Never

    from agent_framework import WorkflowBuilder, WorkflowContext, WorkflowRunState, handler, response_handler
    from agent_framework._workflows._executor import Executor
    from agent_framework._workflows._request_info_mixin import RequestInfoMixin

    class HilExecutor(Executor, RequestInfoMixin):
        @handler
        async def start(self, message: str, ctx: WorkflowContext) -> None:
            await ctx.request_info(message, response_type=str, request_id="req1")

        @response_handler
        async def on_response(
            self,
            original_request: str,
            response: str,
            ctx: WorkflowContext[Never, str],  # type: ignore[valid-type]
        ) -> None:
            await ctx.yield_output(f"{original_request}->{response}")

    storage = InMemoryCheckpointStorage()

    def _build_workflow() -> Any:
        hil = HilExecutor(id="hil")
        return WorkflowBuilder(
            name="response-entry-test",
            max_iterations=10,
            start_executor=hil,
            checkpoint_storage=storage,
        ).build()

    # First run: pauses at IDLE_WITH_PENDING_REQUESTS awaiting the response.
    workflow = _build_workflow()
    workflow_name = workflow.name
    result = await workflow.run("approve")
    request_events = result.get_request_info_events()
    assert len(request_events) == 1
    request_id = request_events[0].request_id
    assert result.get_final_state() == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS

    checkpoints_before = await storage.list_checkpoints(workflow_name=workflow_name)
    before_ids = {cp.checkpoint_id for cp in checkpoints_before}
    # The last checkpoint before responding sits at the pending-request boundary and records the request.
    pending_cp = max(checkpoints_before, key=lambda c: c.iteration_count)
    assert pending_cp.pending_request_info_events

    # Deliver the response; the workflow completes.
    final = await workflow.run(responses={request_id: "yes"})
    assert final.get_outputs() == ["approve->yes"]

    checkpoints_after = await storage.list_checkpoints(workflow_name=workflow_name)
    new_checkpoints = [cp for cp in checkpoints_after if cp.checkpoint_id not in before_ids]

    # The response-entry checkpoint sits at the SAME iteration as the pending-request checkpoint,
    # chains from it, has no pending requests (they were answered), and records the response in-flight.
    response_entry = next(cp for cp in new_checkpoints if cp.iteration_count == pending_cp.iteration_count)
    assert response_entry.checkpoint_id != pending_cp.checkpoint_id
    assert response_entry.previous_checkpoint_id == pending_cp.checkpoint_id
    assert not response_entry.pending_request_info_events
    assert response_entry.messages, "Response-entry checkpoint must record the delivered response in-flight"

    # Resuming from the response-entry checkpoint replays the continuation and reproduces the output.
    replay_workflow = _build_workflow()
    replay_outputs = (await replay_workflow.run(checkpoint_id=response_entry.checkpoint_id)).get_outputs()
    assert replay_outputs == ["approve->yes"]


async def case_memory_checkpoint_storage_roundtrip_json_native_types():
    """Test that JSON-native types (str, int, float, bool, None) roundtrip correctly."""
    storage = InMemoryCheckpointStorage()

    checkpoint = WorkflowCheckpoint(
        workflow_name="test-workflow",
        graph_signature_hash="test-hash",
        state={
            "string": "hello world",
            "integer": 42,
            "negative_int": -100,
            "float": 3.14159,
            "negative_float": -2.71828,
            "bool_true": True,
            "bool_false": False,
            "null_value": None,
            "zero": 0,
            "empty_string": "",
        },
    )

    await storage.save(checkpoint)
    loaded = await storage.load(checkpoint.checkpoint_id)

    assert loaded.state == checkpoint.state


async def case_memory_checkpoint_storage_roundtrip_datetime():
    """Test that datetime objects roundtrip correctly."""
    storage = InMemoryCheckpointStorage()

    now = datetime.now(timezone.utc)
    specific_datetime = datetime(2025, 6, 15, 10, 30, 45, 123456, tzinfo=timezone.utc)

    checkpoint = WorkflowCheckpoint(
        workflow_name="test-workflow",
        graph_signature_hash="test-hash",
        state={
            "current_time": now,
            "specific_time": specific_datetime,
            "nested": {"created_at": now, "updated_at": specific_datetime},
        },
    )

    await storage.save(checkpoint)
    loaded = await storage.load(checkpoint.checkpoint_id)

    assert loaded.state["current_time"] == now
    assert loaded.state["specific_time"] == specific_datetime
    assert loaded.state["nested"]["created_at"] == now
    assert loaded.state["nested"]["updated_at"] == specific_datetime


async def case_memory_checkpoint_storage_roundtrip_dataclass():
    """Test that dataclass objects roundtrip correctly."""
    storage = InMemoryCheckpointStorage()

    custom_obj = _TestCustomData(name="test", value=42, tags=["a", "b", "c"])

    checkpoint = WorkflowCheckpoint(
        workflow_name="test-workflow",
        graph_signature_hash="test-hash",
        state={
            "custom_data": custom_obj,
            "nested": {"inner_data": custom_obj},
        },
    )

    await storage.save(checkpoint)
    loaded = await storage.load(checkpoint.checkpoint_id)

    assert loaded.state["custom_data"] == custom_obj
    assert loaded.state["custom_data"].name == "test"
    assert loaded.state["custom_data"].value == 42
    assert loaded.state["custom_data"].tags == ["a", "b", "c"]
    assert loaded.state["nested"]["inner_data"] == custom_obj
    assert isinstance(loaded.state["custom_data"], _TestCustomData)


async def case_memory_checkpoint_storage_roundtrip_tuple_and_set():
    """Test that tuples and frozensets roundtrip correctly (type preserved in memory)."""
    storage = InMemoryCheckpointStorage()

    original_tuple = (1, "two", 3.0, None)
    original_frozenset = frozenset({1, 2, 3})

    checkpoint = WorkflowCheckpoint(
        workflow_name="test-workflow",
        graph_signature_hash="test-hash",
        state={
            "my_tuple": original_tuple,
            "my_frozenset": original_frozenset,
            "nested_tuple": {"inner": (10, 20, 30)},
        },
    )

    await storage.save(checkpoint)
    loaded = await storage.load(checkpoint.checkpoint_id)

    # In-memory storage preserves exact types (no JSON serialization)
    assert loaded.state["my_tuple"] == original_tuple
    assert isinstance(loaded.state["my_tuple"], tuple)
    assert loaded.state["my_frozenset"] == original_frozenset
    assert isinstance(loaded.state["my_frozenset"], frozenset)
    assert loaded.state["nested_tuple"]["inner"] == (10, 20, 30)
    assert isinstance(loaded.state["nested_tuple"]["inner"], tuple)


async def case_memory_checkpoint_storage_roundtrip_complex_nested_structures():
    """Test complex nested structures with mixed types roundtrip correctly."""
    storage = InMemoryCheckpointStorage()

    # Create complex nested structure mixing JSON-native and non-native types
    complex_state = {
        "level1": {
            "level2": {
                "level3": {
                    "deep_string": "hello",
                    "deep_int": 123,
                    "deep_datetime": datetime(2025, 1, 1, tzinfo=timezone.utc),
                    "deep_tuple": (1, 2, 3),
                }
            },
            "list_of_dicts": [
                {"a": 1, "b": datetime(2025, 2, 1, tzinfo=timezone.utc)},
                {"c": 2, "d": (4, 5, 6)},
            ],
        },
        "mixed_list": [
            "string",
            42,
            3.14,
            True,
            None,
            datetime(2025, 3, 1, tzinfo=timezone.utc),
            (7, 8, 9),
        ],
    }

    checkpoint = WorkflowCheckpoint(
        workflow_name="test-workflow",
        graph_signature_hash="test-hash",
        state=complex_state,
    )

    await storage.save(checkpoint)
    loaded = await storage.load(checkpoint.checkpoint_id)

    # Verify deep nested values
    assert loaded.state["level1"]["level2"]["level3"]["deep_string"] == "hello"
    assert loaded.state["level1"]["level2"]["level3"]["deep_int"] == 123
    assert loaded.state["level1"]["level2"]["level3"]["deep_datetime"] == datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert loaded.state["level1"]["level2"]["level3"]["deep_tuple"] == (1, 2, 3)
    assert isinstance(loaded.state["level1"]["level2"]["level3"]["deep_tuple"], tuple)

    # Verify list of dicts
    assert loaded.state["level1"]["list_of_dicts"][0]["a"] == 1
    assert loaded.state["level1"]["list_of_dicts"][0]["b"] == datetime(2025, 2, 1, tzinfo=timezone.utc)
    assert loaded.state["level1"]["list_of_dicts"][1]["d"] == (4, 5, 6)
    assert isinstance(loaded.state["level1"]["list_of_dicts"][1]["d"], tuple)

    # Verify mixed list with correct types
    assert loaded.state["mixed_list"][0] == "string"
    assert loaded.state["mixed_list"][1] == 42
    assert loaded.state["mixed_list"][5] == datetime(2025, 3, 1, tzinfo=timezone.utc)
    assert loaded.state["mixed_list"][6] == (7, 8, 9)
    assert isinstance(loaded.state["mixed_list"][6], tuple)


async def case_memory_checkpoint_storage_roundtrip_messages_with_complex_data():
    """Test that messages dict with Message objects roundtrips correctly."""
    storage = InMemoryCheckpointStorage()

    msg1 = WorkflowMessage(
        data={"text": "hello", "timestamp": datetime(2025, 1, 1, tzinfo=timezone.utc)},
        source_id="source",
        target_id="target",
    )
    msg2 = WorkflowMessage(
        data=(1, 2, 3),
        source_id="s2",
        target_id=None,
    )
    msg3 = WorkflowMessage(
        data="simple string",
        source_id="s3",
        target_id="t3",
    )

    messages = {
        "executor1": [msg1, msg2],
        "executor2": [msg3],
    }

    checkpoint = WorkflowCheckpoint(
        workflow_name="test-workflow",
        graph_signature_hash="test-hash",
        messages=messages,
    )

    await storage.save(checkpoint)
    loaded = await storage.load(checkpoint.checkpoint_id)

    # Verify messages structure and types
    assert len(loaded.messages["executor1"]) == 2
    loaded_msg1 = loaded.messages["executor1"][0]
    loaded_msg2 = loaded.messages["executor1"][1]
    loaded_msg3 = loaded.messages["executor2"][0]

    # Verify Message type is preserved
    assert isinstance(loaded_msg1, WorkflowMessage)
    assert isinstance(loaded_msg2, WorkflowMessage)
    assert isinstance(loaded_msg3, WorkflowMessage)

    # Verify Message fields
    assert loaded_msg1.data["text"] == "hello"
    assert loaded_msg1.data["timestamp"] == datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert loaded_msg1.source_id == "source"
    assert loaded_msg1.target_id == "target"

    assert loaded_msg2.data == (1, 2, 3)
    assert isinstance(loaded_msg2.data, tuple)
    assert loaded_msg2.source_id == "s2"
    assert loaded_msg2.target_id is None

    assert loaded_msg3.data == "simple string"
    assert loaded_msg3.source_id == "s3"
    assert loaded_msg3.target_id == "t3"


async def case_memory_checkpoint_storage_roundtrip_pending_request_info_events():
    """Test that pending_request_info_events with WorkflowEvent objects roundtrip correctly."""
    storage = InMemoryCheckpointStorage()

    # Create request_info events using the proper WorkflowEvent factory
    event1 = WorkflowEvent.request_info(
        request_id="req123",
        source_executor_id="executor1",
        request_data="What is your name?",
        response_type=str,
    )
    event2 = WorkflowEvent.request_info(
        request_id="req456",
        source_executor_id="executor2",
        request_data=_TestToolApprovalRequest(
            tool_name="search",
            arguments={"query": "test"},
            timestamp=datetime(2025, 1, 1, tzinfo=timezone.utc),
        ),
        response_type=bool,
    )

    pending_events = {
        "req123": event1,
        "req456": event2,
    }

    checkpoint = WorkflowCheckpoint(
        workflow_name="test-workflow",
        graph_signature_hash="test-hash",
        pending_request_info_events=pending_events,  # type: ignore[arg-type]
    )

    await storage.save(checkpoint)
    loaded = await storage.load(checkpoint.checkpoint_id)

    # Verify WorkflowEvent type is preserved
    loaded_event1 = loaded.pending_request_info_events["req123"]
    loaded_event2 = loaded.pending_request_info_events["req456"]

    assert isinstance(loaded_event1, WorkflowEvent)
    assert isinstance(loaded_event2, WorkflowEvent)

    # Verify event1 fields
    assert loaded_event1.type == "request_info"
    assert loaded_event1.request_id == "req123"
    assert loaded_event1.source_executor_id == "executor1"
    assert loaded_event1.data == "What is your name?"
    assert loaded_event1.response_type is str

    # Verify event2 fields with complex data
    assert loaded_event2.type == "request_info"
    assert loaded_event2.request_id == "req456"
    assert loaded_event2.source_executor_id == "executor2"
    assert isinstance(loaded_event2.data, _TestToolApprovalRequest)
    assert loaded_event2.data.tool_name == "search"
    assert loaded_event2.data.arguments == {"query": "test"}
    assert loaded_event2.data.timestamp == datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert loaded_event2.response_type is bool


async def case_memory_checkpoint_storage_roundtrip_full_checkpoint():
    """Test complete WorkflowCheckpoint roundtrip with all fields populated using proper types."""
    storage = InMemoryCheckpointStorage()

    # Create proper WorkflowMessage objects
    msg1 = WorkflowMessage(data="msg1", source_id="s", target_id="t")
    msg2 = WorkflowMessage(data=datetime(2025, 1, 1, tzinfo=timezone.utc), source_id="a", target_id="b")

    # Create proper WorkflowEvent for pending request
    pending_event = WorkflowEvent.request_info(
        request_id="req1",
        source_executor_id="exec1",
        request_data=_TestApprovalRequest(action="approve", params=(1, 2, 3)),
        response_type=bool,
    )

    checkpoint = WorkflowCheckpoint(
        checkpoint_id="full-test-checkpoint",
        workflow_name="comprehensive-test",
        graph_signature_hash="hash-abc123",
        previous_checkpoint_id="previous-checkpoint-id",
        timestamp=datetime(2025, 6, 15, 12, 0, 0, tzinfo=timezone.utc).isoformat(),
        messages={
            "exec1": [msg1],
            "exec2": [msg2],
        },
        state={
            "user_data": {"name": "test", "created": datetime(2025, 1, 1, tzinfo=timezone.utc)},
            "_executor_state": {
                "exec1": _TestExecutorState(counter=5, history=["a", "b", "c"]),
            },
        },
        pending_request_info_events={
            "req1": pending_event,
        },
        iteration_count=10,
        metadata={
            "superstep": 5,
            "started_at": datetime(2025, 6, 15, 11, 0, 0, tzinfo=timezone.utc),
        },
        version="1.0",
    )

    await storage.save(checkpoint)
    loaded = await storage.load(checkpoint.checkpoint_id)

    # Verify all scalar fields
    assert loaded.checkpoint_id == checkpoint.checkpoint_id
    assert loaded.workflow_name == checkpoint.workflow_name
    assert loaded.graph_signature_hash == checkpoint.graph_signature_hash
    assert loaded.previous_checkpoint_id == checkpoint.previous_checkpoint_id
    assert loaded.timestamp == checkpoint.timestamp
    assert loaded.iteration_count == checkpoint.iteration_count
    assert loaded.version == checkpoint.version

    # Verify complex nested state data
    assert loaded.state["user_data"]["created"] == datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert loaded.state["_executor_state"]["exec1"].counter == 5
    assert loaded.state["_executor_state"]["exec1"].history == ["a", "b", "c"]
    assert isinstance(loaded.state["_executor_state"]["exec1"], _TestExecutorState)

    # Verify messages are proper Message objects
    loaded_msg1 = loaded.messages["exec1"][0]
    loaded_msg2 = loaded.messages["exec2"][0]
    assert isinstance(loaded_msg1, WorkflowMessage)
    assert isinstance(loaded_msg2, WorkflowMessage)
    assert loaded_msg1.data == "msg1"
    assert loaded_msg1.source_id == "s"
    assert loaded_msg2.data == datetime(2025, 1, 1, tzinfo=timezone.utc)

    # Verify pending events are proper WorkflowEvent objects
    loaded_event = loaded.pending_request_info_events["req1"]
    assert isinstance(loaded_event, WorkflowEvent)
    assert loaded_event.type == "request_info"
    assert loaded_event.request_id == "req1"
    assert isinstance(loaded_event.data, _TestApprovalRequest)
    assert loaded_event.data.params == (1, 2, 3)

    # Verify metadata
    assert loaded.metadata["superstep"] == 5
    assert loaded.metadata["started_at"] == datetime(2025, 6, 15, 11, 0, 0, tzinfo=timezone.utc)


async def case_memory_checkpoint_storage_roundtrip_bytes():
    """Test that bytes objects roundtrip correctly."""
    storage = InMemoryCheckpointStorage()

    binary_data = b"\x00\x01\x02\xff\xfe\xfd"
    unicode_bytes = "Hello 世界".encode()

    checkpoint = WorkflowCheckpoint(
        workflow_name="test-workflow",
        graph_signature_hash="test-hash",
        state={
            "binary_data": binary_data,
            "unicode_bytes": unicode_bytes,
            "nested": {"inner_bytes": binary_data},
        },
    )

    await storage.save(checkpoint)
    loaded = await storage.load(checkpoint.checkpoint_id)

    assert loaded.state["binary_data"] == binary_data
    assert loaded.state["unicode_bytes"] == unicode_bytes
    assert loaded.state["nested"]["inner_bytes"] == binary_data
    assert isinstance(loaded.state["binary_data"], bytes)


async def case_memory_checkpoint_storage_roundtrip_empty_collections():
    """Test that empty collections roundtrip correctly (types preserved in memory)."""
    storage = InMemoryCheckpointStorage()

    checkpoint = WorkflowCheckpoint(
        workflow_name="test-workflow",
        graph_signature_hash="test-hash",
        state={
            "empty_dict": {},
            "empty_list": [],
            "empty_tuple": (),
            "nested_empty": {"inner_dict": {}, "inner_list": []},
        },
        messages={},
        pending_request_info_events={},
    )

    await storage.save(checkpoint)
    loaded = await storage.load(checkpoint.checkpoint_id)

    assert loaded.state["empty_dict"] == {}
    assert loaded.state["empty_list"] == []
    # In-memory storage preserves exact types (no JSON serialization)
    assert loaded.state["empty_tuple"] == ()
    assert isinstance(loaded.state["empty_tuple"], tuple)
    assert loaded.state["nested_empty"]["inner_dict"] == {}
    assert loaded.messages == {}
    assert loaded.pending_request_info_events == {}


# -- test_checkpoint_validation.py ----------------------------------------------------------------------


class StartExecutor(Executor):
    @handler
    async def run(self, message: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(message, target_id="finish")


class FinishExecutor(Executor):
    @handler
    async def finish(self, message: str, ctx: WorkflowContext[Never, str]) -> None:  # zuban: ignore
        await ctx.yield_output(message)


def build_workflow(storage: InMemoryCheckpointStorage, finish_id: str = "finish"):
    start = StartExecutor(id="start")
    finish = FinishExecutor(id=finish_id)

    builder = WorkflowBuilder(max_iterations=3, start_executor=start, checkpoint_storage=storage).add_edge(
        start, finish
    )
    return builder.build()


async def case_resume_fails_when_graph_mismatch() -> None:
    storage = InMemoryCheckpointStorage()
    workflow = build_workflow(storage, finish_id="finish")

    # Run once to create checkpoints
    _ = [event async for event in workflow.run("hello", stream=True)]  # noqa: F841

    checkpoints = await storage.list_checkpoints(workflow_name=workflow.name)
    assert checkpoints, "expected at least one checkpoint to be created"
    target_checkpoint = checkpoints[-1]

    # Build a structurally different workflow (different finish executor id)
    mismatched_workflow = build_workflow(storage, finish_id="finish_alt")

    with pytest.raises(WorkflowCheckpointException, match="Workflow graph has changed"):
        _ = [
            event
            async for event in mismatched_workflow.run(
                checkpoint_id=target_checkpoint.checkpoint_id,
                checkpoint_storage=storage,
                stream=True,
            )
        ]


async def case_resume_succeeds_when_graph_matches() -> None:
    storage = InMemoryCheckpointStorage()
    workflow = build_workflow(storage, finish_id="finish")
    _ = [event async for event in workflow.run("hello", stream=True)]  # noqa: F841

    checkpoints = sorted(await storage.list_checkpoints(workflow_name=workflow.name), key=lambda c: c.timestamp)
    target_checkpoint = checkpoints[0]

    resumed_workflow = build_workflow(storage, finish_id="finish")

    events = [
        event
        async for event in resumed_workflow.run(
            checkpoint_id=target_checkpoint.checkpoint_id,
            checkpoint_storage=storage,
            stream=True,
        )
    ]

    assert any(event.type == "status" and event.state == WorkflowRunState.IDLE for event in events)


class SubStartExecutor(Executor):
    @handler
    async def run(self, message: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(message)


class SubFinishExecutor(Executor):
    @handler
    async def finish(self, message: str, ctx: WorkflowContext[Never, str]) -> None:  # zuban: ignore
        await ctx.yield_output(message)


def build_sub_workflow(sub_finish_id: str = "sub_finish"):
    sub_start = SubStartExecutor(id="sub_start")
    sub_finish = SubFinishExecutor(id=sub_finish_id)
    return WorkflowBuilder(start_executor=sub_start).add_edge(sub_start, sub_finish).build()


def build_parent_workflow(storage: InMemoryCheckpointStorage, sub_finish_id: str = "sub_finish"):
    sub_workflow = build_sub_workflow(sub_finish_id=sub_finish_id)
    sub_executor = WorkflowExecutor(sub_workflow, id="sub_wf", allow_direct_output=True)

    start = StartExecutor(id="start")
    finish = FinishExecutor(id="finish")

    builder = (
        WorkflowBuilder(max_iterations=3, start_executor=start, checkpoint_storage=storage)
        .add_edge(start, sub_executor)
        .add_edge(sub_executor, finish)
    )
    return builder.build()


async def case_resume_succeeds_when_sub_workflow_matches() -> None:
    storage = InMemoryCheckpointStorage()
    workflow = build_parent_workflow(storage, sub_finish_id="sub_finish")

    _ = [event async for event in workflow.run("hello", stream=True)]

    checkpoints = await storage.list_checkpoints(workflow_name=workflow.name)
    assert checkpoints, "expected at least one checkpoint to be created"
    target_checkpoint = checkpoints[-1]

    resumed_workflow = build_parent_workflow(storage, sub_finish_id="sub_finish")

    events = [
        event
        async for event in resumed_workflow.run(
            checkpoint_id=target_checkpoint.checkpoint_id,
            checkpoint_storage=storage,
            stream=True,
        )
    ]

    assert any(event.type == "status" and event.state == WorkflowRunState.IDLE for event in events)


async def case_resume_fails_when_sub_workflow_changes() -> None:
    storage = InMemoryCheckpointStorage()
    workflow = build_parent_workflow(storage, sub_finish_id="sub_finish")

    _ = [event async for event in workflow.run("hello", stream=True)]

    checkpoints = await storage.list_checkpoints(workflow_name=workflow.name)
    assert checkpoints, "expected at least one checkpoint to be created"
    target_checkpoint = checkpoints[-1]

    # Build parent with a structurally different sub-workflow (different executor id inside)
    mismatched_workflow = build_parent_workflow(storage, sub_finish_id="sub_finish_alt")

    with pytest.raises(WorkflowCheckpointException, match="Workflow graph has changed"):
        _ = [
            event
            async for event in mismatched_workflow.run(
                checkpoint_id=target_checkpoint.checkpoint_id,
                checkpoint_storage=storage,
                stream=True,
            )
        ]


# -- test_checkpoint_unrestricted_pickle.py ------------------------------------------------------------


@dataclass
class _AllowedTestState:
    """Test dataclass that will be explicitly allowed."""

    name: str
    value: int


async def case_file_storage_blocks_unlisted_user_type():
    """FileCheckpointStorage blocks user types not in allowed_checkpoint_types."""
    from agent_framework import WorkflowCheckpoint

    with tempfile.TemporaryDirectory() as tmpdir:
        # Save with a storage that allows the type
        type_key = f"{_AllowedTestState.__module__}:{_AllowedTestState.__qualname__}"
        save_storage = FileCheckpointStorage(tmpdir, allowed_checkpoint_types=[type_key])

        checkpoint = WorkflowCheckpoint(
            workflow_name="test",
            graph_signature_hash="hash",
            state={"data": _AllowedTestState(name="test", value=1)},
        )
        await save_storage.save(checkpoint)

        # Load with a storage that does NOT allow the type
        load_storage = FileCheckpointStorage(tmpdir)
        with pytest.raises(WorkflowCheckpointException, match="deserialization blocked"):
            await load_storage.load(checkpoint.checkpoint_id)


async def case_file_storage_allows_listed_user_type():
    """FileCheckpointStorage allows user types listed in allowed_checkpoint_types."""
    from agent_framework import WorkflowCheckpoint

    with tempfile.TemporaryDirectory() as tmpdir:
        type_key = f"{_AllowedTestState.__module__}:{_AllowedTestState.__qualname__}"
        storage = FileCheckpointStorage(tmpdir, allowed_checkpoint_types=[type_key])

        checkpoint = WorkflowCheckpoint(
            workflow_name="test",
            graph_signature_hash="hash",
            state={"data": _AllowedTestState(name="allowed", value=99)},
        )
        await storage.save(checkpoint)
        loaded = await storage.load(checkpoint.checkpoint_id)

        assert isinstance(loaded.state["data"], _AllowedTestState)
        assert loaded.state["data"].name == "allowed"
        assert loaded.state["data"].value == 99


async def case_file_storage_round_trips_marker_shaped_dict_state() -> None:
    """FileCheckpointStorage preserves marker-shaped dictionaries as user data."""
    from agent_framework import WorkflowCheckpoint

    with tempfile.TemporaryDirectory() as tmpdir:
        storage = FileCheckpointStorage(tmpdir)
        state_data = {
            _PICKLE_MARKER: "some_value",
            _TYPE_MARKER: "some_type",
        }
        checkpoint = WorkflowCheckpoint(
            workflow_name="test",
            graph_signature_hash="hash",
            state={"data": state_data},
        )
        checkpoint_id = await storage.save(checkpoint)

        loaded = await storage.load(checkpoint_id)

        assert loaded.state["data"] == state_data
