"""What the run, step and diff pages show, read from the log through the viewer's connection.

A run's page reads the log, not the projection: it is the page of a live run, and it opens
content where the viewer's credentials can (the projection keeps content sealed). The state is
the shared fold's (``runledger.record.fold.fold``); the status is ``runledger runs``' (``broken``
with the fold's error when the fold refused an event). Only the lineage (forks and child runs of
the run) comes from the projection, which knows every run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from runledger.log.reader import RunLog
from runledger.ops.trace import GRAPH_THREAD_LABEL, continue_command, forgeries, record_status, started_labels
from runledger.protect.loading import load_run
from runledger.record.fold import Checkpoint, StepRecord, fold
from runledger.record.records import Quarantined, Recorded
from runledger.sandbox.diff import RunDiff, diff_runs
from runledger.ui.prices import PriceTable, usage
from runledger.ui.projection import ProjectionFollower
from runledger.ui.render import conversation
from runledger.ui.timeline import Timeline, build_timeline
from runledger.ui.viewers import Viewer

# payload fields that are what a step was given, and what it gave back
INPUT_FIELDS = ("request", "args", "input", "action")
OUTPUT_FIELDS = ("response", "output", "result", "value", "error", "usage", "approved", "by", "reason")


@dataclass
class Approval:
    step: int
    request_id: str
    action: str
    args: Any
    status: str  # pending | approved | denied
    requested_at: str
    decided_by: str | None = None
    reason: str | None = None
    decided_at: str | None = None


@dataclass
class Effect:
    step: int
    name: str
    key: str | None
    state: str  # committed | failed | simulated | in_doubt | intended
    output: Any
    error: Any


@dataclass
class LineageNode:
    run_id: str
    relation: str  # parent | this | fork | child | parent (child of)
    status: str | None = None
    note: str = ""
    children: list[LineageNode] = field(default_factory=list)


@dataclass
class RunView:
    log: RunLog
    cp: Checkpoint
    status: str
    fold_error: str | None
    timeline: Timeline
    approvals: list[Approval]
    effects: list[Effect]
    lineage: LineageNode
    cost: float
    priced: bool
    messages: int  # messages of the run in the stream (events and quarantined): what live updates watch

    @property
    def forgeries(self) -> list[Quarantined]:
        """Messages under the run's id that are not its own (runledger.ops.trace.forgeries): an alarm."""
        return forgeries(self.log)

    @property
    def live(self) -> bool:
        return self.status in ("running", "suspended", "unknown")

    @property
    def failing_step(self) -> int | None:
        """The step a failed run failed at: the one its ``run.failed`` names, else its last step that
        failed (an error, a failed effect, a denied approval). None for a run that has not failed."""
        cp = self.cp
        if cp.status != "failed":
            return None
        if cp.failed_step is not None and cp.failed_step in cp.steps:
            return int(cp.failed_step)
        failed = [n for n, s in cp.steps.items() if s.status in ("error", "failed", "denied")]
        return max(failed) if failed else None

    @property
    def graph_thread(self) -> bool:
        """A LangGraph thread's run: its graph drives it, so the page never resumes it (``continue_with``)."""
        return GRAPH_THREAD_LABEL in started_labels(self.log)

    @property
    def continue_with(self) -> str:
        """What continues the run (``runledger.ops.trace.continue_command``): its graph invoked on its
        thread for a LangGraph thread's run, else ``runledger resume`` with its agent's spec."""
        return continue_command(self.cp.run_id or self.log.run_id, started_labels(self.log))

    @property
    def resumable(self) -> str | None:
        """Why a resume would go on with this run now (None: it would not): its holder is gone (a crash),
        or it is suspended with nothing left to decide (an approval granted, an in-doubt key settled,
        and nobody has resumed it yet). A run failed on a retryable error needs an operator's retry
        first (``runledger retry``); a branch resumes in a sandbox (the page queues it)."""
        cp = self.cp
        if self.status == "stalled":
            return "the process that ran it is gone"
        if self.status == "suspended" and not cp.pending_approvals and not cp.in_doubt_keys:
            return "nothing is left to decide"
        return None


async def read_run(viewer: Viewer, run_id: str) -> tuple[RunLog, Checkpoint]:
    """The run as the viewer may read it. Raises RunNotFoundError (also for a run of another agent)."""
    log = await load_run(viewer.client, run_id, agent=viewer.agent, open_content=True)
    cp = fold(log.records, check_chain=False)
    if cp.erased is not None:
        from runledger.protect.erasure import erased_log

        log = erased_log(log)  # what the erasure made unreadable reads as erased, not as sealed
        cp = fold(log.records, check_chain=False)
    return log, cp


def approvals(cp: Checkpoint, records: list[Recorded]) -> list[Approval]:
    asked: dict[str, dict[str, Any]] = {}
    decided: dict[str, tuple[dict[str, Any], str]] = {}
    for rec in records:
        p = rec.event.payload
        if rec.event.type == "approval.requested":
            asked[p.get("request_id", "")] = {**p, "ts": rec.event.ts}
        elif rec.event.type == "approval.resolved":
            decided[p.get("request_id", "")] = (p, rec.event.ts)
    out = []
    for step in sorted(cp.steps):
        s = cp.steps[step]
        if s.kind != "approval" or s.request_id is None:
            continue
        request = asked.get(s.request_id, {})
        a = Approval(step, s.request_id, s.name, request.get("args"), s.status, request.get("ts", s.ts))
        if s.request_id in decided and s.status != "pending":
            p, ts = decided[s.request_id]
            a.decided_by, a.reason, a.decided_at = p.get("by"), p.get("reason"), ts
        out.append(a)
    return out


def effects(cp: Checkpoint) -> list[Effect]:
    out = []
    for step in sorted(cp.steps):
        s = cp.steps[step]
        if s.kind != "effect":
            continue
        state = "in_doubt" if s.key in cp.in_doubt_keys and s.status == "intended" else s.status
        out.append(Effect(step, s.name, s.key, state, s.output, s.error))
    return out


async def settled(viewer: Viewer, found: list[Effect]) -> list[Effect]:
    """``found`` with each effect in doubt on the run's record that its key's own subject has settled
    since (an operator's `effects resolve`) shown as the key holds it: ``committed``, or ``released``
    (resolved as not committed: the run's next resume acts again). A key the viewer cannot read stays
    as the record says."""
    from runledger.errors import LedgerError
    from runledger.sdk.effects import read_key

    for e in found:
        if e.state != "in_doubt" or e.key is None:
            continue
        try:
            state = await read_key(viewer.client, e.key, viewer.agent)
        except (LedgerError, TimeoutError):
            continue
        if state.status == "committed":
            e.state = "committed"
        elif state.status == "free":
            e.state = "released"
    return found


async def lineage(follower: ProjectionFollower, viewer: Viewer, cp: Checkpoint) -> LineageNode:
    """parent (a fork's, or a child's starter) -> this run -> its forks and child runs."""
    this = LineageNode(cp.run_id, "this", cp.status)
    scope, params = ("AND agent = ?", [viewer.agent]) if viewer.agent else ("", [])
    rows = (await follower.query(
        "SELECT run_id, status, parent_run_id, fork_step, fork_mode, child_of_run_id, child_of_step FROM runs "
        f"WHERE (parent_run_id = ? OR child_of_run_id = ?) {scope} ORDER BY started_at, run_id",
        [cp.run_id, cp.run_id, *params],
    )).rows  # fmt: skip
    seen = set()
    for run_id, status, parent, fork_step, mode, _child_of, child_step in rows:
        if parent == cp.run_id:
            this.children.append(LineageNode(run_id, "fork", status, f"forked at step {fork_step} ({mode})"))
        else:
            this.children.append(LineageNode(run_id, "child", status, f"started at step {child_step}"))
        seen.add(run_id)
    for s in sorted(cp.steps):  # child runs the projection has not seen yet
        child = cp.steps[s].child_run_id
        if child and child not in seen and cp.steps[s].kind == "child":
            this.children.append(LineageNode(child, "child", cp.steps[s].status, f"started at step {s}"))
    fork = cp.parent or {}
    if fork.get("forked_from"):
        note = f"forked at step {fork.get('fork_step')} ({fork.get('mode')})"
        return LineageNode(str(fork["forked_from"]), "parent", None, note, [this])
    if cp.child_of_run_id:
        return LineageNode(cp.child_of_run_id, "parent", None, f"started it at step {cp.child_of_step}", [this])
    return this


async def run_view(follower: ProjectionFollower, viewer: Viewer, prices: PriceTable, run_id: str) -> RunView:
    log, cp = await read_run(viewer, run_id)
    status, fold_error = record_status(log, cp)
    timeline = build_timeline(cp, log.records, prices, now_ms=time.time() * 1000.0)
    cost, priced = prices.run_cost(cp.steps.values())
    shown = await settled(viewer, effects(cp))
    return RunView(log, cp, status, fold_error, timeline, approvals(cp, log.records), shown,
                   await lineage(follower, viewer, cp), cost, priced,
                   len(log.records) + len(log.quarantined))  # fmt: skip


@dataclass
class StepEvent:
    type: str
    ts: str
    seq: int
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    other: dict[str, Any]
    conversation: list[dict[str, Any]] | None = None


@dataclass
class StepView:
    run_id: str
    agent: str
    step: StepRecord
    events: list[StepEvent]
    cost: float | None
    tokens_in: int
    tokens_out: int
    prev_step: int | None
    next_step: int | None


def step_view(log: RunLog, cp: Checkpoint, number: int, prices: PriceTable) -> StepView | None:
    step = cp.steps.get(number)
    if step is None:
        return None
    events = []
    for rec in log.records:
        p = rec.event.payload
        mine = p.get("step") == number or (
            rec.event.type == "approval.resolved"
            and step.request_id is not None
            and p.get("request_id") == step.request_id
        )
        if not mine:
            continue
        inputs = {k: p[k] for k in INPUT_FIELDS if k in p}
        outputs = {k: p[k] for k in OUTPUT_FIELDS if k in p}
        other = {k: v for k, v in p.items() if k not in inputs and k not in outputs}
        talk = conversation(p.get("request"), p.get("response")) if rec.event.type == "model.called" else None
        events.append(StepEvent(rec.event.type, rec.event.ts, rec.event.seq, inputs, outputs, other, talk))
    steps = sorted(cp.steps)
    at = steps.index(number)
    tokens_in, tokens_out = usage(step) if step.kind == "model" else (0, 0)
    return StepView(cp.run_id, cp.agent, step, events, prices.step_cost(step), tokens_in, tokens_out,
                    steps[at - 1] if at > 0 else None, steps[at + 1] if at + 1 < len(steps) else None)  # fmt: skip


@dataclass
class DiffView:
    diff: RunDiff
    parent: Checkpoint
    branch: Checkpoint
    cost: dict[str, float]  # parent / branch: whole run; parent_from_fork / branch_from_fork
    priced: bool


async def diff_view(viewer: Viewer, prices: PriceTable, parent_id: str, branch_id: str) -> DiffView:
    """``runledger diff PARENT BRANCH`` (``runledger.sandbox.diff.diff_runs``), with costs.
    Raises RunNotFoundError, SandboxError (not a branch of that parent)."""
    parent_log, parent = await read_run(viewer, parent_id)
    branch_log, branch = await read_run(viewer, branch_id)
    d = diff_runs(parent, branch, parent_log.records, branch_log.records)
    cost: dict[str, float] = {}
    priced = True
    for name, cp in (("parent", parent), ("branch", branch)):
        total, ok = prices.run_cost(cp.steps.values())
        after, _ = prices.run_cost(s for s in cp.steps.values() if s.step >= d.fork_step)
        cost[name], cost[f"{name}_from_fork"] = total, after
        priced = priced and ok
    return DiffView(d, parent, branch, cost, priced)
