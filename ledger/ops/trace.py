"""Trace replay: read runs back and render them, executing nothing."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from runledger.log.client import LedgerClient
from runledger.log.reader import RunLog, decode_records, read_raw
from runledger.log.subjects import parse_run_subject
from runledger.protect.capture import client_opener
from runledger.record.fold import Checkpoint, fold
from runledger.record.records import Recorded


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
        parent=(cp.parent or {}).get("parent_run_id"),
        error=(cp.error or {}).get("message"),
    )


async def list_runs(client: LedgerClient, *, status: str | None = None, agent: str | None = None) -> list[RunSummary]:
    """Every run (optionally of one agent / in one status), oldest first.

    Reads the whole run part of the log: fine for an operator's terminal; analysts
    query the DuckDB projection instead.
    """
    subject_filter = f"ledger.run.{agent}.>" if agent else "ledger.run.>"
    good, _bad = decode_records(await read_raw(client, subject_filter))
    by_run: dict[str, list[Recorded]] = defaultdict(list)
    for rec in good:
        if parse_run_subject(rec.subject):
            by_run[rec.event.run_id].append(rec)
    out = []
    opener = client_opener(client)
    for records in by_run.values():
        summary = summarize(fold(records, check_chain=False))
        if summary.error is not None:
            # Error messages are content (sealed per run): open the one this listing shows.
            summary.error = await opener.open_text(summary.error, strict=False)
        if status is None or summary.status == status:
            out.append(summary)
    return sorted(out, key=lambda s: (s.started_at or "", s.run_id))


def _short(value: Any, width: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _detail(ev_type: str, p: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(name, input, output) of an event for the timeline."""
    if ev_type == "model.called":
        last = (p.get("request", {}).get("messages") or [{}])[-1]
        out = p.get("error") or (p.get("response") or {}).get("content", "")
        return p["model"], str(last.get("content", "")), out if isinstance(out, str) else json.dumps(out)
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
    if ev_type == "run.completed":
        return "", "", p.get("output")
    if ev_type == "run.failed":
        return p["reason"], "", f"{p['error']['type']}: {p['error']['message']}"
    return "", "", {k: v for k, v in p.items() if k != "step"} or ""


def render_run(log: RunLog, cp: Checkpoint, *, step: int | None = None, width: int = 60) -> str:
    """A readable timeline of a run; with ``step``, the full record of that step."""
    lines = [
        f"run {cp.run_id}  agent {cp.agent}  status {cp.status}  attempts {cp.attempts}",
        "version " + json.dumps(cp.version, sort_keys=True),
        "spent   "
        + "  ".join(
            f"{b} {cp.spent[b]:g}/{'-' if cp.limits.get(b) is None else format(cp.limits[b], 'g')}"
            for b in ("turns", "tokens", "seconds")
        ),
    ]
    if cp.parent:
        lines.append(
            f"forked  from {cp.parent['parent_run_id']} at step {cp.parent['fork_step']} "
            f"({cp.parent['mode']}, changed {cp.parent.get('changed')})"
        )
    if cp.pending_approvals:
        lines.append("pending approvals " + ", ".join(sorted(cp.pending_approvals)))
    if cp.in_doubt_keys:
        lines.append("effects in doubt  " + ", ".join(cp.in_doubt_keys))
    for q in log.quarantined:
        lines.append(f"QUARANTINED stream seq {q.stream_seq}: {q.reason}")
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
