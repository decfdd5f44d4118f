"""Diff a branch against its parent, step by step from the fork.

Both runs are folded with the shared fold; steps are aligned by number. The report
leads with the decision at the fork (the first step at or after the fork whose
output differs), then every step from the fork on (kind, name, output, status, tokens),
then outcome, tokens and the version-tuple delta.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from runledger.log.client import LedgerClient
from runledger.protect.runs import load_run
from runledger.record.fold import Checkpoint, StepRecord, fold
from runledger.sandbox.errors import SandboxError


@dataclass
class StepDiff:
    step: int
    parent: dict[str, Any] | None
    branch: dict[str, Any] | None
    same: bool


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _view(rec: StepRecord | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {"kind": rec.kind, "name": rec.name, "status": rec.status, "key": rec.key, "output": rec.output,
            "error": rec.error, "tokens": rec.tokens}  # fmt: skip


def _comparable(view: dict[str, Any] | None) -> Any:
    if view is None:
        return None
    output = view["output"]
    if isinstance(output, dict):
        output = {k: v for k, v in output.items() if k != "usage"}  # same decision, other token counts
    return (view["kind"], view["name"] if view["kind"] != "model" else "", view["status"], view["key"], output)


def diff_runs(parent: Checkpoint, branch: Checkpoint) -> RunDiff:
    fork = branch.parent or {}
    if fork.get("parent_run_id") != parent.run_id:
        raise SandboxError(f"run {branch.run_id} is not a branch of {parent.run_id}")
    fork_step = int(fork.get("fork_step", 0))
    delta = {
        k: [(parent.version or {}).get(k), (branch.version or {}).get(k)]
        for k in sorted(set(parent.version or {}) | set(branch.version or {}))
        if (parent.version or {}).get(k) != (branch.version or {}).get(k)
    }
    steps = []
    first = None
    for step in range(fork_step, max(parent.last_step, branch.last_step) + 1):
        a, b = _view(parent.steps.get(step)), _view(branch.steps.get(step))
        same = _comparable(a) == _comparable(b)
        if not same and first is None:
            first = step
        steps.append(StepDiff(step, a, b, same))
    return RunDiff(
        parent_run_id=parent.run_id, branch_run_id=branch.run_id, fork_step=fork_step,
        mode=str(fork.get("mode")), changed=fork.get("changed"), version_delta=delta, first_difference=first,
        steps=steps,
        outcome={"parent": parent.status, "branch": branch.status, "parent_output": parent.output,
                 "branch_output": branch.output, "branch_failure": branch.failure_reason},
        tokens={"parent": parent.spent["tokens"], "branch": branch.spent["tokens"]},
    )  # fmt: skip


async def diff(client: LedgerClient, parent_run_id: str, branch_run_id: str) -> RunDiff:
    parent = fold((await load_run(client, parent_run_id)).records, check_chain=False)
    branch = fold((await load_run(client, branch_run_id)).records, check_chain=False)
    return diff_runs(parent, branch)


def _short(value: Any, width: int = 70) -> str:
    text = " ".join(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render(d: RunDiff) -> str:
    lines = [f"branch {d.branch_run_id} of {d.parent_run_id}, forked at step {d.fork_step} ({d.mode}"
             + (f", changed {d.changed}" if d.changed else "") + ")"]  # fmt: skip
    for k, (a, b) in d.version_delta.items():
        lines.append(f"  version {k}: {_short(a, 40)} -> {_short(b, 40)}")
    if d.first_difference is None:
        lines.append("no step differs from the fork on")
    else:
        s = next(x for x in d.steps if x.step == d.first_difference)
        lines.append(f"first difference at step {s.step}:")
        lines.append(f"  parent: {_short(s.parent)}")
        lines.append(f"  branch: {_short(s.branch)}")
    lines.append("")
    for s in d.steps:
        mark = "=" if s.same else "≠"
        pa = f"{s.parent['kind']} {s.parent['name']} {s.parent['status']}" if s.parent else "-"
        br = f"{s.branch['kind']} {s.branch['name']} {s.branch['status']}" if s.branch else "-"
        lines.append(f"{mark} step {s.step:>3}  parent: {pa:<40} branch: {br}")
    o = d.outcome
    lines.append(f"\noutcome: parent {o['parent']}, branch {o['branch']}"
                 + (f" ({o['branch_failure']})" if o["branch_failure"] else ""))  # fmt: skip
    lines.append(f"tokens: parent {d.tokens['parent']:g}, branch {d.tokens['branch']:g}")
    return "\n".join(lines)
