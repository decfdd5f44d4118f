"""Diff a branch against its parent, from the fork.

Both runs are folded with the shared fold. The report leads with the decision at the
fork (the first model call at or after the fork step in each run, side by side), then
the effects the branch simulated because their key was committed with other arguments
(both digests), then every step from the fork on, aligned by (kind, name) rather than by
step number: a sequence alignment (``difflib.SequenceMatcher``) of the two runs' steps,
so a call the branch inserts or drops shows as one inserted or removed step and the
steps after it still line up with their counterparts. Each aligned entry is ``equal``,
``changed`` (same kind and name, different arguments, output, status or key),
``inserted`` (the branch only) or ``removed`` (the parent only). Then outcome, tokens and
the version-tuple delta.

The ``--json`` form is ``RunDiff.to_dict()``. Its older keys keep their meaning:
``first_difference`` is the step of the first entry that is not equal (the branch's step,
or the parent's for a removed one), and each of ``steps`` has ``step``, ``parent``,
``branch`` and ``same``; added are ``op``, ``parent_step`` and ``branch_step`` on each
step, ``fork_decision``, ``args_differ`` and ``alignment`` (the count of each op).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from runledger.log.client import LedgerClient
from runledger.protect.capture import is_placeholder
from runledger.protect.loading import load_run
from runledger.record.canonical import JCS_CHAIN_FORMAT, canonical_json
from runledger.record.digests import PLAIN_DIGESTS
from runledger.record.fold import Checkpoint, StepRecord, fold
from runledger.record.records import Recorded
from runledger.sandbox.branch import args_differ_marker
from runledger.sandbox.errors import SandboxError

Op = Literal["equal", "changed", "inserted", "removed"]
_DIGEST = re.compile(r"[0-9a-f]{64}")
OPS: tuple[Op, ...] = ("equal", "changed", "inserted", "removed")


@dataclass
class StepDiff:
    step: int  # the branch's step, or the parent's when the branch has no counterpart
    parent: dict[str, Any] | None
    branch: dict[str, Any] | None
    same: bool
    op: Op = "equal"
    parent_step: int | None = None
    branch_step: int | None = None


@dataclass
class ForkDecision:
    """The first model call at or after the fork in each run: the decision the re-run re-made."""

    parent_step: int | None
    branch_step: int | None
    parent: dict[str, Any] | None
    branch: dict[str, Any] | None
    same: bool


@dataclass
class ArgsDiffer:
    """An effect the branch simulated because its key was committed with other arguments."""

    step: int
    name: str
    key: str | None
    args_digest: str | None  # the branch's
    committed_args_digest: str | None  # the committing claim's
    parent_step: int | None = None  # the parent's step that committed the key, if the parent did


@dataclass
class RunDiff:
    parent_run_id: str
    branch_run_id: str
    fork_step: int
    mode: str
    changed: str | None
    version_delta: dict[str, list[Any]]
    first_difference: int | None
    steps: list[StepDiff] = field(default_factory=list)
    outcome: dict[str, Any] = field(default_factory=dict)
    tokens: dict[str, float] = field(default_factory=dict)
    fork_decision: ForkDecision | None = None
    args_differ: list[ArgsDiffer] = field(default_factory=list)
    alignment: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _view(rec: StepRecord | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    view = {"kind": rec.kind, "name": rec.name, "status": rec.status, "key": rec.key, "output": rec.output,
            "error": rec.error, "tokens": rec.tokens, "args_digest": rec.args_digest or None}  # fmt: skip
    marker = args_differ_marker(rec.output) if rec.kind == "effect" and rec.status == "simulated" else None
    if marker is not None:
        view["reason"] = marker["reason"]
        view["args_digest"] = _digest(marker.get("args_digest"))
        view["committed_args_digest"] = _digest(marker.get("committed_args_digest"))
    return view


def _digest(value: Any) -> str | None:
    """A digest read from content (the marker is a result, so the capture policy went over it): only
    an intact one. A redactor may, rarely, take a run of digits in a hex digest for a card number."""
    return value if isinstance(value, str) and _DIGEST.fullmatch(value) else None


def _comparable(view: dict[str, Any] | None) -> Any:
    if view is None:
        return None
    output = view["output"]
    if isinstance(output, dict):
        output = {k: v for k, v in output.items() if k != "usage"}  # same decision, other token counts
    return (view["kind"], view["name"] if view["kind"] != "model" else "", view["status"], view["key"], output)


# What each tool or effect step of the parent and of the branch was called with (``step_args``).
StepArgs = tuple[Mapping[int, str], Mapping[int, str]]


def step_args(records: Iterable[Recorded]) -> dict[int, str]:
    """What each tool or effect step of a run was called with, as its record holds it opened: the
    canonical JSON of the arguments with each redaction token's run-keyed hex dropped (one secret
    recorded by two runs compares equal: ``without_token_keys``). Steps whose arguments are not open
    (sealed, erased, hashed) are left out."""
    from runledger.protect.redaction import without_token_keys  # (loaded only when keyed runs are compared)

    out: dict[int, str] = {}
    for rec in records:
        p = rec.event.payload
        if rec.event.type not in _ARGS_EVENTS or not isinstance(p.get("step"), int) or "args" not in p:
            continue
        value = p["args"]
        if is_placeholder(value) or (isinstance(value, dict) and "$erased" in value):
            continue
        try:
            out[p["step"]] = without_token_keys(canonical_json(value, JCS_CHAIN_FORMAT).decode("utf-8"))
        except (TypeError, ValueError):
            continue
    return out


_ARGS_EVENTS = frozenset({"tool.called", "effect.intended", "effect.simulated"})


def _same_args(a: StepRecord, b: StepRecord, args: StepArgs | None) -> bool:
    """Whether a tool or an effect was called with the same arguments in both runs (part of what it
    did; a model call is judged by its output: its request differs whenever anything before it
    does). Plain digests compare (both runs recorded digest scheme 1); keyed ones are each under
    their own run's key, so the opened arguments compare instead; when neither can be had (content
    sealed from this reader), the arguments are not judged."""
    if a.kind not in ("tool", "effect"):
        return True
    if args is None:  # both runs' digests are plain
        return (a.args_digest or None) == (b.args_digest or None)
    theirs, ours = args[0].get(a.step), args[1].get(b.step)
    return True if theirs is None or ours is None else theirs == ours


def _align_key(rec: StepRecord) -> tuple[str, str]:
    """What two steps must share to be counterparts: kind and name (a model call's name is the
    model, which a counterfactual changes: any two model calls are counterparts)."""
    return rec.kind, "" if rec.kind == "model" else rec.name


def align(parent: list[StepRecord], branch: list[StepRecord], args: StepArgs | None = None) -> list[StepDiff]:
    """The two step sequences aligned on (kind, name), each entry marked equal, changed, inserted or removed
    (``args``: what each step was called with, when the runs' digests do not compare, None when they do:
    ``_same_args``)."""
    matcher = difflib.SequenceMatcher(None, [_align_key(r) for r in parent], [_align_key(r) for r in branch],
                                      autojunk=False)  # fmt: skip
    out: list[StepDiff] = []

    def pair(a: StepRecord | None, b: StepRecord | None) -> None:
        va, vb = _view(a), _view(b)
        same = a is not None and b is not None and _comparable(va) == _comparable(vb) and _same_args(a, b, args)
        op: Op
        if a is None:
            op = "inserted"
        elif b is None:
            op = "removed"
        else:
            op = "equal" if same else "changed"
        a_step, b_step = (None if a is None else a.step), (None if b is None else b.step)
        step = b_step if b_step is not None else a_step if a_step is not None else -1
        out.append(StepDiff(step, va, vb, same, op, a_step, b_step))

    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for a, b in zip(parent[i1:i2], branch[j1:j2], strict=True):
                pair(a, b)
        else:  # replace, delete, insert: no counterparts of the same kind and name in this stretch
            for a in parent[i1:i2]:
                pair(a, None)
            for b in branch[j1:j2]:
                pair(None, b)
    return out


def _from(cp: Checkpoint, step: int) -> list[StepRecord]:
    return [cp.steps[s] for s in sorted(cp.steps) if s >= step]


def _fork_decision(parent: list[StepRecord], branch: list[StepRecord]) -> ForkDecision | None:
    a = next((r for r in parent if r.kind == "model"), None)
    b = next((r for r in branch if r.kind == "model"), None)
    if a is None and b is None:
        return None
    va, vb = _view(a), _view(b)
    return ForkDecision(a.step if a else None, b.step if b else None, va, vb, _comparable(va) == _comparable(vb))


def _args_differ(steps: list[StepDiff], parent: Checkpoint) -> list[ArgsDiffer]:
    committed = {r.key: r for r in parent.steps.values() if r.kind == "effect" and r.status == "committed"}
    found = []
    for s in steps:
        b = s.branch
        if b is None or b.get("reason") is None or s.branch_step is None:
            continue
        by_parent = committed.get(b["key"])
        # The committing claim's digest, else (unreadable in the marker) the parent's claim of the
        # key: structure, recorded in the clear.
        committed_digest = b.get("committed_args_digest") or (by_parent.args_digest if by_parent else None)
        found.append(ArgsDiffer(s.branch_step, b["name"], b["key"], b.get("args_digest"), committed_digest,
                                by_parent.step if by_parent else None))  # fmt: skip
    return found


def diff_runs(
    parent: Checkpoint,
    branch: Checkpoint,
    parent_records: Iterable[Recorded] = (),
    branch_records: Iterable[Recorded] = (),
) -> RunDiff:
    """The branch against its parent from the fork. ``parent_records`` / ``branch_records``: the runs'
    records with content opened (as far as the reader may), whose arguments are compared where the
    runs' digests do not compare (keyed, each under its own run's key)."""
    fork = branch.parent or {}
    if fork.get("forked_from") != parent.run_id:
        raise SandboxError(f"run {branch.run_id} is not a branch of {parent.run_id}")
    fork_step = int(fork.get("fork_step", 0))
    delta = {
        k: [(parent.version or {}).get(k), (branch.version or {}).get(k)]
        for k in sorted(set(parent.version or {}) | set(branch.version or {}))
        if (parent.version or {}).get(k) != (branch.version or {}).get(k)
    }
    after_a, after_b = _from(parent, fork_step), _from(branch, fork_step)
    plain = parent.digest_scheme == branch.digest_scheme == PLAIN_DIGESTS
    args = None if plain else (step_args(parent_records), step_args(branch_records))
    steps = align(after_a, after_b, args)
    first = next((s.step for s in steps if not s.same), None)
    return RunDiff(
        parent_run_id=parent.run_id, branch_run_id=branch.run_id, fork_step=fork_step,
        mode=str(fork.get("mode")), changed=fork.get("changed"), version_delta=delta, first_difference=first,
        steps=steps,
        outcome={"parent": parent.status, "branch": branch.status, "parent_output": parent.output,
                 "branch_output": branch.output, "branch_failure": branch.failure_reason},
        tokens={"parent": parent.spent["tokens"], "branch": branch.spent["tokens"]},
        fork_decision=_fork_decision(after_a, after_b),
        args_differ=_args_differ(steps, parent),
        alignment={op: sum(1 for s in steps if s.op == op) for op in OPS},
    )  # fmt: skip


async def diff(client: LedgerClient, parent_run_id: str, branch_run_id: str) -> RunDiff:
    parent_log, branch_log = await load_run(client, parent_run_id), await load_run(client, branch_run_id)
    parent = fold(parent_log.records, check_chain=False)
    branch = fold(branch_log.records, check_chain=False)
    return diff_runs(parent, branch, parent_log.records, branch_log.records)


def _short(value: Any, width: int = 70) -> str:
    text = " ".join(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _decision(view: dict[str, Any] | None) -> str:
    """A model call's output as the decision it is: its content (or error), not its token counts."""
    if view is None:
        return "-"
    if view["error"]:
        return f"{view['name']} error: {_short(view['error'].get('message'), 90)}"
    output = view["output"]
    calls = ""
    if isinstance(output, dict):
        # A tool-calling model decides by its calls (often with no text at all): both are the decision.
        named = [c for c in output.get("tool_calls") or [] if isinstance(c, dict)]
        calls = ", ".join(f"{c.get('name') or (c.get('function') or {}).get('name')}"
                          f"({_short(c.get('args', (c.get('function') or {}).get('arguments')), 60)})"
                          for c in named)  # fmt: skip
        output = output.get("content", {k: v for k, v in output.items() if k != "usage"})
    if isinstance(output, str):  # the model's text as it said it
        text = " ".join(output.split())
        text = text if len(text) <= 100 else text[:99] + "…"
    else:
        text = _short(output, 100)
    if calls:
        text = f"{text} calls {calls}" if text else f"calls {calls}"
    return f"{view['name']}: {text}"


def _brief(view: dict[str, Any] | None, width: int = 110) -> str:
    """A step in one line, what it did first: kind, name, status, key, then output or error."""
    if view is None:
        return "-"
    head = f"{view['kind']} {view['name']} {view['status']}" + (f" key {view['key']}" if view["key"] else "")
    output = view["output"]
    if isinstance(output, dict):
        output = {k: v for k, v in output.items() if k != "usage"}
    rest = _short(view["error"] if view["error"] else output, max(20, width - len(head) - 2))
    return f"{head}: {rest}"


def _line(view: dict[str, Any] | None) -> str:
    if view is None:
        return "-"
    return f"{view['kind']} {view['name']} {view['status']}" + (f" ({view['reason']})" if view.get("reason") else "")


_MARK: dict[str, str] = {"equal": "=", "changed": "≠", "inserted": "+", "removed": "-"}


def render(d: RunDiff) -> str:
    lines = [f"branch {d.branch_run_id} of {d.parent_run_id}, forked at step {d.fork_step} ({d.mode}"
             + (f", changed {d.changed}" if d.changed else "") + ")"]  # fmt: skip
    for k, (a, b) in d.version_delta.items():
        lines.append(f"  version {k}: {_short(a, 40)} -> {_short(b, 40)}")
    fd = d.fork_decision
    if fd is not None:
        lines.append("decision at the fork" + (" (the same in both)" if fd.same else "") + ":")
        lines.append(f"  parent step {'-' if fd.parent_step is None else fd.parent_step}: {_decision(fd.parent)}")
        lines.append(f"  branch step {'-' if fd.branch_step is None else fd.branch_step}: {_decision(fd.branch)}")
    first = next((s for s in d.steps if not s.same), None)
    if first is None:
        lines.append("no step differs from the fork on")
    else:
        lines.append(f"first difference at step {first.step} ({first.op}):")
        lines.append(f"  parent: {_brief(first.parent)}")
        lines.append(f"  branch: {_brief(first.branch)}")
    if d.args_differ:
        lines.append("effects whose key was committed with other arguments (simulated, not served as committed):")
        for e in d.args_differ:
            lines.append(f"  step {e.step} {e.name} key {e.key}: args {e.args_digest or '? (unreadable)'}, "
                         f"committed with {e.committed_args_digest or '? (unreadable)'}")  # fmt: skip
    counts = ", ".join(f"{d.alignment.get(op, 0)} {op}" for op in OPS)
    lines.append(f"\nsteps from the fork, aligned by kind and name: {counts}")
    for s in d.steps:
        pa = f"{'' if s.parent_step is None else s.parent_step:>3} {_line(s.parent)}"
        br = f"{'' if s.branch_step is None else s.branch_step:>3} {_line(s.branch)}"
        lines.append(f"{_MARK[s.op]} parent: {pa:<44} branch: {br}")
    o = d.outcome
    lines.append(f"\noutcome: parent {o['parent']}, branch {o['branch']}"
                 + (f" ({o['branch_failure']})" if o["branch_failure"] else ""))  # fmt: skip
    lines.append(f"tokens: parent {d.tokens['parent']:g}, branch {d.tokens['branch']:g}")
    return "\n".join(lines)
