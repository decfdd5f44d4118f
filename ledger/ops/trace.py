"""Trace replay: read runs back and render them, executing nothing.

A run's status here is the projection's (``runs.status``): the fold with the chain checked
(``fold_until_refused``), and ``broken``, with the fold error, when the fold refused an event
(a gap where an event was quarantined, a forked chain, a value it cannot use). Such a run
cannot be resumed; ``runledger verify RUN`` names the bad event.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from runledger.errors import (
    ConfigurationError,
    EventDecodeError,
    LedgerError,
    RunNotFoundError,
    RunOfAnotherAgentError,
)
from runledger.log.client import LedgerClient
from runledger.log.reader import RunLog, decode_records, read_raw
from runledger.log.subjects import parse_run_subject
from runledger.protect.capture import client_opener
from runledger.protect.loading import load_run
from runledger.record.events import decode_fast
from runledger.record.fold import BROKEN, Checkpoint, fold_until_refused, quarantine_error, split_refused
from runledger.record.records import Quarantined, Recorded
from runledger.sdk.holder import is_gone

STALLED = "stalled"  # a running run whose holder is gone (live_status)


@dataclass
class RunSummary:
    run_id: str
    agent: str
    status: str
    started_at: str | None
    ended_at: str | None
    steps: int
    tokens: int
    pending_approvals: list[str]
    in_doubt: list[str]
    parent: str | None
    error: str | None
    fold_error: str | None = None  # set for a broken run (status "broken"): where and why the fold stopped
    retryable: bool = False  # failed on a retryable error: `runledger resume RUN --retry` continues it
    child_of: str | None = None  # a child run (run.child): the run that started it, at step child_of_step
    child_of_step: int | None = None
    # Keys the run's record leaves in doubt that their own subject has settled since (an operator's
    # `effects resolve`): no longer in doubt; the run's next resume records the outcome.
    settled: list[str] = field(default_factory=list)
    # The run's name as its framework's user wrote it (a LangGraph thread id): ``thread_label``.
    thread: str | None = None
    # Its run.started labels (``langgraph.thread_id``...): ``continue_command`` reads how it goes on.
    labels: dict[str, str] = field(default_factory=dict)
    # Messages under the run's id that are not the run's: refused from their writers (another agent
    # under the id, a worker on the run, a forged decision) or bytes that are no event off its own
    # subject. Left out of the run, and an alarm (`runledger verify RUN` names each and exits 7).
    forgeries: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def summarize(cp: Checkpoint) -> RunSummary:
    return RunSummary(
        run_id=cp.run_id,
        agent=cp.agent,
        status=cp.status,
        started_at=cp.started_at,
        ended_at=cp.ended_at,
        steps=cp.last_step + 1,
        tokens=int(cp.spent["tokens"]),
        pending_approvals=sorted(cp.pending_approvals),
        in_doubt=list(cp.in_doubt_keys),
        parent=(cp.parent or {}).get("forked_from"),
        error=(cp.error or {}).get("message"),
        retryable=cp.status == "failed" and cp.failure_retryable,
        child_of=cp.child_of_run_id,
        child_of_step=cp.child_of_step,
    )


async def list_runs(client: LedgerClient, *, status: str | None = None, agent: str | None = None) -> list[RunSummary]:
    """Every run (optionally of one agent / in one status), oldest first.

    Reads the whole run part of the log: fine for an operator's terminal; analysts
    query the DuckDB projection instead.
    """
    own = getattr(client, "agent", None)  # an agent's login reads its own runs only
    if own is not None and agent not in (None, own):
        raise ConfigurationError(f"the agent {own!r} credentials list only agent {own!r}'s runs, not {agent!r}'s")
    agent = agent or own
    subject_filter = f"ledger.run.{agent}.>" if agent else "ledger.run.>"
    good, bad = decode_records(await read_raw(client, subject_filter))
    by_run: dict[str, list[Recorded]] = defaultdict(list)
    for rec in good:
        parsed = parse_run_subject(rec.subject)
        if parsed:  # grouped by the subject's run id, as resume and the projection group them
            by_run[parsed[1]].append(rec)
    garbage: dict[str, list[Quarantined]] = defaultdict(list)
    for q in bad:
        parsed = parse_run_subject(q.subject)
        if parsed:
            garbage[parsed[1]].append(q)
    out = []
    opener = client_opener(client)
    for run_id, records in by_run.items():
        cp, error = fold_until_refused(records)
        # The run's own subject: its first accepted event's (``read_run``'s ``RunLog.subject``).
        accepted, refused = split_refused(records)
        own_subject = (accepted or records)[0].subject
        error = first_break(run_id, own_subject, records, garbage.get(run_id, []), cp, error)
        summary = summarize(cp)
        summary.forgeries = len(refused) + sum(q.subject != own_subject for q in garbage.get(run_id, []))
        summary.run_id = summary.run_id or run_id  # no run.started folded: the run is named by its subject
        summary.agent = summary.agent or records[0].event.agent
        first = records[0].event
        summary.labels = dict(first.payload.get("labels") or {}) if first.type == "run.started" else {}
        summary.thread = thread_label(summary.labels)
        if error is not None:  # as the projection's runs row: the state before the refused event
            summary.status, summary.fold_error, summary.error = BROKEN, error, error
        elif summary.error is not None:
            # Error messages are content (sealed per run): open the one this listing shows.
            summary.error = await opener.open_text(summary.error, strict=False)
        summary.status = live_status(summary.status, cp.holder)
        if summary.in_doubt:
            await _settle_in_doubt(client, summary)
        if status is None or summary.status == status:
            out.append(summary)
    return sorted(out, key=lambda s: (s.started_at or "", s.run_id))


def with_branches(runs: list[RunSummary], branches: bool) -> list[tuple[RunSummary, int]]:
    """``runs`` as ``runledger runs`` lists them, each with its depth under its fork parent: without
    ``branches``, the recorded runs only (a re-run's branch, ``parent`` set, is left out: a sweep makes
    many); with it, every branch right after its parent (depth 1, a branch of a branch 2...), in start
    order among its siblings. A branch whose parent is not listed stands at depth 0."""
    if not branches:
        return [(r, 0) for r in runs if not r.parent]
    listed = {r.run_id for r in runs}
    children: dict[str, list[RunSummary]] = defaultdict(list)
    for r in runs:
        if r.parent and r.parent in listed and r.parent != r.run_id:
            children[r.parent].append(r)
    out: list[tuple[RunSummary, int]] = []
    seen: set[str] = set()

    def visit(r: RunSummary, depth: int) -> None:
        if r.run_id in seen:  # a cycle of forged parents cannot loop the listing
            return
        seen.add(r.run_id)
        out.append((r, depth))
        for child in children.get(r.run_id, []):
            visit(child, depth + 1)

    for r in runs:
        if not (r.parent and r.parent in listed and r.parent != r.run_id):
            visit(r, 0)
    out.extend((r, 0) for r in runs if r.run_id not in seen)
    return out


def thread_label(labels: dict[str, str]) -> str | None:
    """The name a run's ``run.started`` labels give it as its framework's user wrote it: the value of
    a label ``thread_id`` or ``<framework>.thread_id`` (a LangGraph thread's run records
    ``langgraph.thread_id``, whose run id is a digest when the thread id cannot stand in a subject)."""
    for key in sorted(labels):
        if key == "thread_id" or key.endswith(".thread_id"):
            return str(labels[key])
    return None


GRAPH_THREAD_LABEL = "langgraph.thread_id"


def started_labels(log: RunLog) -> dict[str, str]:
    """The labels the run's ``run.started`` records (none when it records no start)."""
    first = log.records[0].event if log.records else None
    return dict(first.payload.get("labels") or {}) if first is not None and first.type == "run.started" else {}


def continue_command(run_id: str, labels: dict[str, str]) -> str:
    """What continues run ``run_id`` after a crash or a decision, as its ``run.started`` ``labels`` say
    it runs: a LangGraph thread's run (label ``langgraph.thread_id``, RunledgerSaver's) goes on as
    LangGraph recovers a thread, its graph invoked with None on the thread (the saver re-opens the
    run, fenced); any other run with ``runledger resume`` and its agent's spec."""
    thread = labels.get(GRAPH_THREAD_LABEL)
    if thread is None:
        return f"`runledger resume {run_id} --agent MODULE:ATTR`"
    config = json.dumps({"configurable": {"thread_id": str(thread)}})
    return f"`graph.invoke(None, {config})` on its LangGraph graph (compiled with its RunledgerSaver)"


async def find_run(client: LedgerClient, ref: str) -> str:
    """The run whose thread label (``thread_label``) is ``ref``, the latest started when several are
    (a thread deleted and used again records on a new run): what ``runledger show`` looks for when
    no run has the id ``ref``. Raises RunNotFoundError."""
    found = [r for r in await list_runs(client) if r.thread == ref]
    if not found:
        raise RunNotFoundError(ref)
    return max(found, key=lambda r: (r.started_at or "", r.run_id)).run_id


async def load_named_run(client: LedgerClient, ref: str) -> RunLog:
    """The run ``ref`` names, content opened (``load_run``): the run of that id, else the run whose
    thread label is ``ref`` (``find_run``). Raises RunNotFoundError, or ConfigurationError when
    ``ref`` is neither a valid run id nor a recorded thread id."""
    try:
        return await load_run(client, ref)
    except (RunNotFoundError, ConfigurationError) as exc:  # no such run, or no run id at all
        try:
            found = await find_run(client, ref)  # a thread id as its user wrote it (LangGraph's)
        except RunNotFoundError:
            if isinstance(exc, ConfigurationError):
                raise ConfigurationError(f"{exc}; nor does a run record a thread of that id") from None
            raise exc from None
    return await load_run(client, found)


async def _settle_in_doubt(client: LedgerClient, summary: RunSummary) -> None:
    """Move the keys of ``summary.in_doubt`` that their own subject no longer holds claimed (resolved
    by an operator, or settled by another run) to ``summary.settled``. The run's record says "in
    doubt" until a resume records the outcome; the key's subject is the truth about the key."""
    from runledger.sdk.effects import read_key

    still = []
    for key in summary.in_doubt:
        try:
            state = await read_key(client, key, summary.agent or None)
        except (LedgerError, TimeoutError):
            still.append(key)  # a key this connection cannot read stays as the run's record says
            continue
        if state.status == "claimed":
            still.append(key)
        else:
            summary.settled.append(key)
    summary.in_doubt = still


def _short(value: Any, width: int) -> str:
    if value == {"$erased": True}:  # runledger.protect.erasure.ERASED
        return "«erased»"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _calls(tool_calls: Any) -> str:
    """A model turn's tool calls as ``name(arguments)``, in order: OpenAI's shape (``function``
    with ``name`` and ``arguments``) or a framework's (``name`` and ``args``); sealed or unknown
    shapes as JSON."""
    if not isinstance(tool_calls, list):
        return json.dumps(tool_calls, ensure_ascii=False, sort_keys=True)
    shown = []
    for call in tool_calls:
        fn = call.get("function") if isinstance(call, dict) else None
        fn = fn if isinstance(fn, dict) else call if isinstance(call, dict) and "name" in call else None
        if fn is None:
            shown.append(json.dumps(call, ensure_ascii=False, sort_keys=True))
            continue
        args = fn.get("arguments", fn.get("args", ""))
        args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, sort_keys=True)
        shown.append(f"{fn.get('name', '?')}({args})")
    return ", ".join(shown)


def _detail(ev_type: str, p: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(name, input, output) of an event for the timeline."""
    if ev_type == "model.called":
        last = (p.get("request", {}).get("messages") or [{}])[-1]
        response = p.get("response") or {}
        out = p.get("error") or response.get("content", "")
        out = out if isinstance(out, str) else json.dumps(out)
        if not p.get("error") and response.get("tool_calls"):  # a turn that asks for tools shows them
            out = " ".join(filter(None, [out, "→ " + _calls(response["tool_calls"])]))
        return p["model"], str(last.get("content", "")), out
    if ev_type == "tool.called":
        return p["name"], p.get("args"), p.get("error") or p.get("output")
    if ev_type.startswith("effect."):
        return p.get("key", ""), p.get("args", ""), p.get("result", p.get("error", ""))
    if ev_type.startswith("approval."):
        return p.get("action", p.get("request_id", "")), p.get("args", ""), p.get("approved", "")
    if ev_type in ("clock.read", "random.drawn"):
        return "", "", p["value"]
    if ev_type == "run.started":
        return p["agent"], p.get("input"), ""
    if ev_type == "child.started":
        return p["agent"], p["run_id"], ""
    if ev_type == "child.completed":
        return p["run_id"], "", p.get("output")
    if ev_type == "child.failed":
        return p["run_id"], p["reason"], f"{p['error']['type']}: {p['error']['message']}"
    if ev_type in ("graph.checkpointed", "graph.writes_saved"):  # runledger.integrations.langgraph
        name = f"{p.get('checkpoint_ns') or 'root'} …{p['checkpoint_id'][-12:]}"
        if ev_type == "graph.writes_saved":
            return name, f"task …{p['task_id'][-12:]}", p.get("channels", [])
        parent = p.get("parent_checkpoint_id")
        lineage = f"{'fork of' if p.get('forked') else 'after'} …{parent[-12:]}" if parent else "first"
        return name, f"{lineage} ({p.get('source')} {p.get('graph_step')})", p.get("channels", [])
    if ev_type == "workflow.checkpointed":  # runledger.integrations.agent_framework
        parent = p.get("previous_checkpoint_id")
        lineage = f"{'fork of' if p.get('forked') else 'after'} …{parent[-12:]}" if parent else "first"
        return f"{p['workflow_name']} …{p['checkpoint_id'][-12:]}", lineage, f"superstep {p.get('iteration_count')}"
    if ev_type == "workflow.checkpoint_deleted":
        return f"{p['workflow_name']} …{p['checkpoint_id'][-12:]}", "", "deleted"
    if ev_type == "graph.checkpoints_deleted":
        deleted = sum(len(ids) for ids in (p.get("checkpoints") or {}).values())
        return p.get("reason", ""), f"{deleted} checkpoint(s)", p.get("run_ids") or ""
    if ev_type == "run.completed":
        return "", "", p.get("output")
    if ev_type == "run.failed":
        return p["reason"], "", f"{p['error']['type']}: {p['error']['message']}"
    return "", "", {k: v for k, v in p.items() if k != "step"} or ""


@dataclass
class ChildNode:
    """A child run (``run.child``) of a run, as ``show`` draws the tree: the parent's step, the
    child's id and agent, its own status (``not started`` when it never recorded ``run.started``,
    ``broken`` when its record is), and its own children."""

    step: int
    run_id: str
    agent: str
    status: str
    children: list[ChildNode]

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "children": [c.to_dict() for c in self.children]}


def child_steps(cp: Checkpoint) -> list[tuple[int, str, str, str]]:
    """(step, child run id, agent, status as this run recorded it) of every child step of ``cp``."""
    return [
        (n, rec.child_run_id, rec.name, rec.status)
        for n, rec in sorted(cp.steps.items())
        if rec.kind == "child" and rec.child_run_id
    ]


async def child_tree(client: LedgerClient, cp: Checkpoint, *, depth: int = 8) -> list[ChildNode]:
    """The child runs of ``cp``'s run, each read and folded for its own status, down to ``depth`` levels.

    A branch's child steps name the parent's child runs they were served from (a re-run never starts one)."""
    nodes = []
    for step, run_id, agent, recorded in child_steps(cp):
        try:
            log = await load_run(client, run_id, open_content=False)
        except RunOfAnotherAgentError:
            nodes.append(ChildNode(step, run_id, agent, "another agent's: not readable with these credentials", []))
            continue
        except RunNotFoundError:
            nodes.append(ChildNode(step, run_id, agent, "not started" if recorded == "started" else recorded, []))
            continue
        child, error = fold_until_refused(log.records)
        below = await child_tree(client, child, depth=depth - 1) if depth > 1 else []
        nodes.append(ChildNode(step, run_id, agent, BROKEN if error is not None else child.status, below))
    return nodes


def _tree_lines(nodes: list[ChildNode], indent: str = "  ") -> list[str]:
    lines = []
    for node in nodes:
        lines.append(f"{indent}step {node.step:<4} {node.run_id}  agent {node.agent}  {node.status}")
        lines.extend(_tree_lines(node.children, indent + "    "))
    return lines


def record_status(log: RunLog, cp: Checkpoint) -> tuple[str, str | None]:
    """The status of the run ``log`` holds, as ``runs`` and the projection show it, and the fold
    error: (``broken``, why) when the fold with the chain checked refuses one of its events, else
    (``cp.status``, None). ``cp`` is the caller's fold of the same records (``show`` folds without
    the chain check, to show everything it can)."""
    folded, error = fold_until_refused(log.records)
    error = first_break(log.run_id, log.subject, log.records, log.quarantined, folded, error)
    return (BROKEN, error) if error is not None else (live_status(cp.status, cp.holder), None)


def first_break(
    run_id: str,
    own_subject: str,
    records: list[Recorded],
    quarantined: list[Quarantined],
    folded: Checkpoint,
    fold_error: str | None,
) -> str | None:
    """Where the run's record breaks first, in stream order, as the projection finds it: the fold's
    refusal (``fold_error``, where ``fold_until_refused`` stopped with ``folded``) or bytes on the run's
    own subject that are not a valid event (``quarantine_error``), whichever comes first; None when
    neither. A valid event refused from its writer (a forgery or a stray, which ``read_run`` also
    quarantines) decodes, and never breaks the run. Bytes before the run's first event are judged by
    the gap they leave (the projection has no run to break yet)."""
    first = records[0].stream_seq if records else 0
    for q in quarantined:
        if q.subject != own_subject or q.stream_seq < first:
            continue
        try:
            decode_fast(q.raw)
        except EventDecodeError:
            error = quarantine_error(run_id, own_subject, q.subject, q.stream_seq)
            if fold_error is None:
                return error
            stopped_at = next((r.stream_seq for r in records if r.stream_seq > folded.last_stream_seq), 0)
            return error if q.stream_seq < stopped_at else fold_error
    return fold_error


def forgeries(log: RunLog) -> list[Quarantined]:
    """The messages under ``log``'s run id that are not the run's (what ``verify`` calls forgeries and
    exits 7 for): valid events refused from their writers, and bytes that are no event off the run's own
    subject. Bytes that are no event on its own subject are a break of the run, not a forgery."""
    found = []
    for q in log.quarantined:
        if q.subject != log.subject:
            found.append(q)
            continue
        try:
            decode_fast(q.raw)
        except EventDecodeError:
            continue
        found.append(q)
    return found


def live_status(status: str, holder: str | None) -> str:
    """``status``, or ``stalled`` for a ``running`` run whose holder (the process that started or last
    resumed it, ``run.started`` / ``run.resumed`` ``holder``) is certainly gone: it ran on this host
    and no process with its pid and start time exists (runledger.sdk.holder.is_gone). A holder on
    another host, or a run recorded before holders were, is not judged: it stays ``running``. Not
    part of the fold (it asks the machine, not the record); a stalled run is resumed like a crashed one."""
    if status == "running" and is_gone(holder):
        return STALLED
    return status


def render_run(
    log: RunLog, cp: Checkpoint, *, step: int | None = None, width: int = 60, children: list[ChildNode] | None = None
) -> str:
    """A readable timeline of a run; with ``step``, the full record of that step.

    Every event is listed; the status is ``record_status``'s (``broken`` with the fold error
    when the record is broken). A child run names its parent; a run with child runs lists them:
    as the tree ``children`` (``child_tree``: each child's own status, and its children), else as
    this run recorded them."""
    status, error = record_status(log, cp)
    lines = [
        f"run {cp.run_id or log.run_id}  agent {cp.agent or log.agent}  status {status}  attempts {cp.attempts}",
        "version " + json.dumps(cp.version, sort_keys=True),
        "spent   "
        + "  ".join(
            f"{b} {cp.spent[b]:g}/{'-' if cp.limits.get(b) is None else format(cp.limits[b], 'g')}"
            for b in ("turns", "tokens", "seconds")
        ),
    ]
    if error is not None:
        lines.append(f"BROKEN  {error}: the record cannot be folded past this event (resume refuses the run)")
    if status == STALLED:
        how = continue_command(cp.run_id or log.run_id, started_labels(log))
        lines.append(f"stalled its process is gone (crashed?): {how} continues it")
    if cp.parent:
        lines.append(
            f"forked  from {cp.parent['forked_from']} at step {cp.parent['fork_step']} "
            f"({cp.parent['mode']}, changed {cp.parent.get('changed')})"
        )
    if cp.child_of_run_id:
        lines.append(f"child   of {cp.child_of_run_id} at step {cp.child_of_step}")
    if children:
        lines.append("children")
        lines.extend(_tree_lines(children))
    elif child_steps(cp):
        lines.append("children (as this run recorded them)")
        lines.extend(f"  step {n:<4} {run_id}  agent {agent}  {status}" for n, run_id, agent, status in child_steps(cp))
    if cp.pending_approvals:
        lines.append("pending approvals " + ", ".join(sorted(cp.pending_approvals)))
    if cp.in_doubt_keys:
        lines.append("effects in doubt  " + ", ".join(cp.in_doubt_keys))
    for q in log.quarantined:
        lines.append(f"QUARANTINED stream seq {q.stream_seq} on {q.subject}: {q.reason}")
    for subject, count in sorted(log.unread.items()):
        lines.append(f"UNREAD {count} messages on {subject}: another agent's under this run id, which these "
                     "credentials may not read (only one agent's run under an id is genuine: its first)")  # fmt: skip
    if step is not None:
        events = [r.event for r in log.records if r.event.step == step]
        if not events:
            lines.append(f"(run has no step {step}; it has steps 0..{cp.last_step})")
        for ev in events:
            lines.append(f"\n#{ev.seq} {ev.type} at {ev.ts}")
            lines.append(json.dumps(ev.payload, indent=2, ensure_ascii=False, sort_keys=True))
        return "\n".join(lines)
    lines.append("")
    lines.append(f"{'seq':>4} {'step':>4}  {'type':<18} {'name':<16} {'in':<{width // 2}}  out")
    for rec in log.records:
        ev, p = rec.event, rec.event.payload
        name, inp, out = _detail(ev.type, p)
        extra = ""
        if "duration_ms" in p:
            extra += f"  {p['duration_ms']:.1f}ms"
        if ev.type == "model.called":
            u = p.get("usage") or {}
            extra += f"  {u.get('input_tokens', 0)}+{u.get('output_tokens', 0)} tok"
        lines.append(
            f"{ev.seq:>4} {('' if ev.step is None else ev.step):>4}  {ev.type:<18} {_short(name, 16):<16} "
            f"{_short(inp, width // 2) if inp not in ('', None) else '':<{width // 2}}  "
            f"{_short(out, width) if out not in ('', None) else ''}{extra}"
        )
    lines.append("\n(`runledger show RUN --step K` prints a step's full inputs and outputs; --json all of it)")
    return "\n".join(lines)
