"""When a LangGraph thread's graph comes to rest, read from what its checkpointer is given.

LangGraph tells a checkpointer nothing about how an invocation ended: the end of a graph, an
error and an interrupt reach only the caller (and LangChain callbacks). What a checkpointer does
see is enough to tell the three apart, and ``RunledgerSaver`` records each as the outcome of the
thread's run (``run.completed``, ``run.failed``, ``run.suspended``) as soon as it sees it:

- **Completed**: a root checkpoint that schedules nothing. Pregel runs a node when a channel it
  is triggered by was updated in the last step; a checkpoint names those updates
  (``updated_channels``). A node's triggers are the channels of its ``versions_seen`` entry once it
  has run, and, for a graph built with ``StateGraph`` or ``@entrypoint``, always channels named
  ``branch:to:<node>``, ``join:...``, ``__start__`` or the ``Send`` channel ``__pregel_tasks``. A
  checkpoint whose updates hold none of those is the last one of its invocation.
- **Failed**: a root task's ``__error__`` write (LangGraph saves it once the task's retries are
  spent, then raises).
- **Suspended**: a root task's ``__interrupt__`` write (``interrupt()`` in a node, or in a subgraph:
  the parent's task writes it too).

- **Suspended at a breakpoint**: a static breakpoint (``interrupt_before`` / ``interrupt_after`` at
  compile time) reaches no checkpointer: LangGraph saves the checkpoint that schedules the node,
  then stops without a write. Its own signal is a ``GraphCallbackHandler``'s ``on_interrupt``
  (status ``interrupt_before`` / ``interrupt_after``, the checkpoint's id), which reaches the
  handlers in the graph's config: ``saver.watch(graph)`` puts the saver's there
  (``BreakpointHandler``), and the run ends ``suspended`` (reason: the status, request id: the
  checkpoint). Resuming (``graph.invoke(None, config)``) runs the scheduled tasks against that
  checkpoint: their writes re-open the run (``Outcome.breakpoint``).

What it cannot see: a breakpoint of a graph that is not watched, and an error outside every task
(the recursion limit), leave the run ``running``; its next invocation goes on from the same
record. A node error handler that catches an error after its ``__error__`` write makes the run
``failed``, then running again at the next checkpoint.

Rejected for breakpoints: a LangChain configure hook adding the handler to every callback manager
of the process (graph lifecycle events reach only the handlers in the graph's config, not hooked
ones, and it would watch every chain of every library); the breakpoints passed to the saver as
well as to ``compile`` (two lists to keep equal); reading them off the graph through the config
LangGraph hands the saver (``__pregel_runtime`` holds no graph, and it is private).

An invocation after an outcome (new input, ``Command(resume=...)``, a retry with ``None``, a state
update) re-opens the run (``run.resumed``), as a resumed process does. What arrives after the
outcome from the invocation that ended is appended without re-opening it (``continues_outcome``):
LangGraph saves checkpoints and writes from background tasks, so an earlier step's checkpoint can
reach the saver after a later step's interrupt, the last step's writes after the last checkpoint,
and a parallel task's writes after its sibling's interrupt. Checkpoint ids are time-ordered
(uuid6, as LangGraph's own savers order them), so a checkpoint, or writes against one, older than
the outcome's is the ended invocation's; writes against the outcome's own checkpoint are, unless
they resume it (``__resume__``) or come from the task that failed or interrupted (a retry).

Rejected: a LangChain callback handler registered for every runnable of the process (it would
observe the graph's ``on_chain_end``, but only by watching every chain of every library the
process runs, and by guessing which run is which thread's); asking the user to call
``saver.acomplete`` (the issue this module closes: threads stayed ``running``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runledger import Event, RunCompleted, RunFailed, RunSuspended, error_info

try:  # langgraph 1.1 and later: graph lifecycle callbacks
    from langgraph.callbacks import GraphCallbackHandler, GraphInterruptEvent
except ImportError:  # pragma: no cover - older langgraph: ``watch`` says what to upgrade
    GraphCallbackHandler = object  # type: ignore[assignment,misc]
    GraphInterruptEvent = Any  # type: ignore[assignment,misc]

ERROR = "__error__"
INTERRUPT = "__interrupt__"
RESUME = "__resume__"
# Channels that trigger nodes in every StateGraph and functional-API graph.
_TRIGGERS = frozenset({"__start__", "__pregel_tasks"})
_TRIGGER_PREFIXES = ("branch:to:", "join:")


@dataclass(frozen=True)
class Outcome:
    """How an invocation ended: ``status`` (``completed`` | ``failed`` | ``suspended``), the
    checkpoint it was seen on (the last one, or the one the failing or interrupted tasks ran from),
    the tasks whose writes ended it (``by``), and the value that tells why (the error, or the
    interrupts)."""

    status: str
    checkpoint_id: str
    by: frozenset[str] = frozenset()
    value: Any = None
    # A static breakpoint: no task of ``checkpoint_id`` ran, so writes against it are the resume's.
    breakpoint: bool = False


def rests(header: Mapping[str, Any]) -> bool:
    """Whether the root checkpoint whose scheduling fields are ``header`` (a checkpoint without its
    values) schedules no task: its invocation's last checkpoint. False when it does not say which
    channels its step updated (checkpoints older than LangGraph 1.0)."""
    updated = header.get("updated_channels")
    if updated is None:
        return False
    seen = header.get("versions_seen") or {}
    triggers = {channel for node, versions in seen.items() if node != INTERRUPT for channel in versions or {}}
    return not any(c in triggers or c in _TRIGGERS or c.startswith(_TRIGGER_PREFIXES) for c in updated)


def outcome_of_writes(checkpoint_id: str, task_id: str, writes: Sequence[tuple[str, Any]]) -> Outcome | None:
    """The outcome a root task's ``writes`` against ``checkpoint_id`` report: an error wins over an
    interrupt (LangGraph raises the error); None when they report neither."""
    for channel, value in writes:
        if channel == ERROR:
            return Outcome("failed", checkpoint_id, frozenset({task_id}), value)
    interrupts = [value for channel, value in writes if channel == INTERRUPT]
    if interrupts:
        return Outcome("suspended", checkpoint_id, frozenset({task_id}), interrupts)
    return None


def continues_outcome(
    ended: Outcome, checkpoint_id: str, task_id: str | None = None, channels: Sequence[str] = ()
) -> bool:
    """Whether a checkpoint (``task_id`` None) or writes of ``task_id`` to ``channels`` against
    ``checkpoint_id``, arriving after ``ended`` was recorded, belong to the invocation that ended
    rather than to a new one (see the module docstring)."""
    if task_id is None:
        return checkpoint_id <= ended.checkpoint_id
    if checkpoint_id != ended.checkpoint_id:
        return checkpoint_id < ended.checkpoint_id
    return not ended.breakpoint and RESUME not in channels and task_id not in ended.by


def interrupt_ids(interrupts: Sequence[Any]) -> list[str]:
    """The ids of the interrupts in ``interrupts`` (``__interrupt__`` write values: lists of
    ``Interrupt``)."""
    found: list[str] = []
    for value in interrupts:
        for item in value if isinstance(value, list | tuple) else [value]:
            found.append(str(getattr(item, "id", "") or ""))
    return [i for i in found if i]


def outcome_event(outcome: Outcome, checkpoint_id: str, last_step: int) -> RunCompleted | RunFailed | RunSuspended:
    """The event that records ``outcome``, seen on ``checkpoint_id`` of a run whose last step is
    ``last_step``: ``run.completed`` (output: the last checkpoint's id), ``run.failed`` (the task's
    error and traceback) or ``run.suspended`` (reason ``interrupt``, request id: the interrupt ids)."""
    if outcome.status == "completed":
        return RunCompleted(output={"checkpoint_id": checkpoint_id})
    if outcome.status == "failed":
        exc = outcome.value if isinstance(outcome.value, BaseException) else RuntimeError(str(outcome.value))
        return RunFailed.of("exception", error_info(exc))
    ids = interrupt_ids(outcome.value) or [checkpoint_id]
    return RunSuspended(step=last_step, request_id=",".join(ids), reason="interrupt")


BREAKPOINTS = ("interrupt_before", "interrupt_after")


class BreakpointHandler(GraphCallbackHandler):
    """LangGraph's graph lifecycle callback for a root graph stopped at a static breakpoint: calls
    ``suspend(checkpoint_id, status)`` from the thread LangGraph calls it on (the invoking thread of a
    sync graph, an executor's thread for an async one: never the saver's loop). Interrupts raised
    by ``interrupt()`` and subgraphs' are left to the writes that report them; every LangChain event
    is ignored (the handler rides in the graph's callbacks)."""

    ignore_llm = ignore_retry = ignore_chain = ignore_agent = ignore_retriever = True
    ignore_chat_model = ignore_custom_event = True

    def __init__(self, suspend: Callable[[str, str], None]) -> None:
        super().__init__()
        self.suspend = suspend

    def on_interrupt(self, event: GraphInterruptEvent) -> None:
        if event.status in BREAKPOINTS and not event.checkpoint_ns:
            self.suspend(str(event.checkpoint_id), str(event.status))


_RECORDED: dict[str, type[RunCompleted | RunFailed | RunSuspended]] = {
    c.TYPE: c for c in (RunCompleted, RunFailed, RunSuspended)
}


def recorded_outcome(events: Sequence[Event]) -> RunCompleted | RunFailed | RunSuspended | None:
    """The outcome a run's ``events`` end at (its last ``run.completed``, ``run.failed`` or
    ``run.suspended`` not followed by ``run.resumed``), as the event to record it again: what a
    process that re-opens a resting run only to tidy it (a deletion) records after, so the run stays
    at rest. None while the run is running."""
    found: RunCompleted | RunFailed | RunSuspended | None = None
    for ev in events:
        if ev.type in _RECORDED:
            try:
                found = _RECORDED[ev.type].model_validate(ev.payload)
            except ValueError:  # content this process cannot open: not restored
                found = None
        elif ev.type in ("run.resumed", "run.started", "run.retried"):
            found = None
    return found
