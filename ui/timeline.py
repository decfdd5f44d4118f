"""A run's steps on a time axis: the Gantt chart of the run page.

Each step is a bar from when it started to when it ended, worked out from its events: a model or
tool call is recorded when it returns (``ts``), ``duration_ms`` after it started; an effect is
recorded when it is intended and again with its outcome; an approval when it is asked and when it
is decided; a child run when it starts and when it ends. A bar runs from the earliest of (first
event, last event minus the call's duration) to the latest of (last event, that start plus the
duration). Steps whose bars overlap (an agent's parallel calls, ``asyncio.gather``) form a group,
drawn side by side on consecutive rows and marked as parallel. Bars are coloured by kind (the
stylesheet) and carry duration, tokens and cost. Under each bar, what the step was given and what it
gave back, in one short line each (``gist``: a model call's last message and its reply, a call's
arguments and result, an error's type and message); the step page has them in full. The step a
failed run failed at is marked.
"""

from __future__ import annotations

import datetime as dt
import html
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup, escape

from runledger.record.fold import Checkpoint, StepRecord
from runledger.record.records import Recorded
from runledger.ui.prices import PriceTable
from runledger.ui.render import NONE, duration, short, usd

INPUT_FIELDS = ("request", "args", "input", "action")  # payload fields that are what a step was given
GIST = 90  # characters of a step's input or output shown under its bar


@dataclass
class Bar:
    step: int
    kind: str
    name: str
    status: str
    start_ms: float  # from the run's start
    end_ms: float
    duration_ms: float
    tokens: int
    cost: float | None
    given: str = ""  # what the step was given, in short
    gave: str = ""  # what it gave back (or its error), in short
    group: int = 0  # index of its group of overlapping steps
    group_size: int = 1  # >1: one of several parallel steps
    left_pct: float = 0.0
    width_pct: float = 0.0


@dataclass
class Timeline:
    bars: list[Bar] = field(default_factory=list)
    total_ms: float = 0.0
    ticks: list[tuple[float, str]] = field(default_factory=list)  # (left %, label)
    parallel_groups: int = 0  # groups of more than one step


def _parse(ts: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(ts).timestamp() * 1000.0
    except ValueError:
        return None


def step_times(records: Iterable[Recorded]) -> dict[int, tuple[float, float]]:
    """step -> (first, last) event time in epoch milliseconds."""
    out: dict[int, tuple[float, float]] = {}
    for rec in records:
        step = rec.event.payload.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        at = _parse(rec.event.ts)
        if at is None:
            continue
        first, last = out.get(step, (at, at))
        out[step] = (min(first, at), max(last, at))
    return out


def step_inputs(records: Iterable[Recorded]) -> dict[int, Any]:
    """step -> what its first event carrying one of ``INPUT_FIELDS`` says it was given."""
    out: dict[int, Any] = {}
    for rec in records:
        p = rec.event.payload
        step = p.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step in out:
            continue
        for name in INPUT_FIELDS:
            if name in p:
                out[step] = p[name]
                break
    return out


def gist(value: Any) -> str:
    """``value`` in one short line: a model request's last message, a model reply's text (or the
    tools it calls), anything else as compact JSON."""
    if isinstance(value, dict):
        messages = value.get("messages")
        if isinstance(messages, list) and messages:
            last = messages[-1]
            value = last.get("content", last) if isinstance(last, dict) else last
        elif value.get("content") or value.get("tool_calls"):
            calls = value.get("tool_calls")
            names = [c.get("name") or (c.get("function") or {}).get("name") for c in calls if isinstance(c, dict)] \
                if isinstance(calls, list) else []  # fmt: skip
            value = value.get("content") or f"calls {', '.join(str(n) for n in names)}"
    return "" if value is None else short(value, GIST)


def _gave(step: StepRecord) -> str:
    if step.error:
        err = step.error
        return short(f"{err.get('type', 'error')}: {err.get('message', '')}", GIST) if isinstance(err, dict) \
            else short(err, GIST)  # fmt: skip
    return gist(step.output)


def _label(ms: float) -> str:
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.1f} min"


def build_timeline(
    cp: Checkpoint, records: list[Recorded], prices: PriceTable, *, now_ms: float | None = None
) -> Timeline:
    """The bars of ``cp``'s steps. A step still waiting (a pending approval) runs to ``now_ms``."""
    times = step_times(records)
    given = step_inputs(records)
    run_start = _parse(cp.started_at) if cp.started_at else None
    starts = [t[0] for t in times.values()]
    origin = run_start if run_start is not None else (min(starts) if starts else 0.0)
    bars: list[Bar] = []
    for number in sorted(cp.steps):
        step: StepRecord = cp.steps[number]
        first, last = times.get(number, (origin, origin))
        duration = max(0.0, float(step.duration_ms or 0.0))
        start = min(first, last - duration)
        end = max(last, start + duration)
        if step.status in ("pending", "started", "intended") and now_ms is not None:
            end = max(end, now_ms)
        bars.append(Bar(number, step.kind, step.name, step.status, start - origin, end - origin, end - start,
                        step.tokens, prices.step_cost(step), gist(given.get(number)), _gave(step)))  # fmt: skip
    timeline = Timeline(bars)
    ends = [b.end_ms for b in bars]
    if cp.ended_at and (ended := _parse(cp.ended_at)) is not None:
        ends.append(ended - origin)
    total = max([1.0, *ends])
    timeline.total_ms = total
    _group(bars)
    timeline.parallel_groups = len({b.group for b in bars if b.group_size > 1})
    for bar in bars:
        bar.left_pct = max(0.0, min(100.0, 100.0 * bar.start_ms / total))
        bar.width_pct = max(0.3, min(100.0 - bar.left_pct, 100.0 * (bar.end_ms - bar.start_ms) / total))
    timeline.ticks = [(100.0 * i / 4, _label(total * i / 4)) for i in range(5)]
    return timeline


def _group(bars: list[Bar]) -> None:
    """Consecutive steps whose intervals overlap share a group (in step order, a sweep over ends)."""
    group, group_end = -1, float("-inf")
    for bar in bars:
        # Touching is not overlapping: a sequential call starts when the previous one returned.
        if bar.start_ms < group_end - 0.5:
            group_end = max(group_end, bar.end_ms)
        else:
            group, group_end = group + 1, bar.end_ms
        bar.group = group
    sizes: dict[int, int] = defaultdict(int)
    for bar in bars:
        sizes[bar.group] += 1
    for bar in bars:
        bar.group_size = sizes[bar.group]


def bar_rows(timeline: Timeline, run_id: str, failing: int | None = None) -> Markup:
    """The chart's rows as HTML, each with its line of inputs and outputs; the step ``failing`` (where
    a failed run failed) marked. Written here rather than in the template: a Jinja loop escapes
    every value it prints (about 20 a bar), which made a 1,000-step run's page spend as long
    rendering as reading the run; here only the texts are escaped (numbers cannot need it)."""
    run = escape(run_id)
    out = []
    for b in timeline.bars:
        kind, name, status = escape(b.kind), escape(b.name), escape(b.status)
        href = f"/runs/{run}/steps/{b.step}"
        extra = (f", {b.tokens} tokens" if b.tokens else "") + (f", {usd(b.cost)}" if b.cost is not None else "")
        facts = (f" · {b.tokens} tok" if b.tokens else "") + (f" · {usd(b.cost)}" if b.cost is not None else "")
        fails = b.step == failing
        mark = '<span class="failed-here">✖ failed here</span> ' if fails else ""
        ident = ' id="failing-step"' if fails else ""
        out.append(
            f'<div class="row{" parallel" if b.group_size > 1 else ""}{" failing" if fails else ""}" '
            f'data-step="{b.step}" data-group="{b.group}"{ident}>'
            f'<a class="label" href="{href}">{b.step} · {kind} <strong>{name}</strong></a>'
            f'<div class="track"><a class="bar kind-{kind} st-{status}" href="{href}" '
            f'style="left: {b.left_pct:.3f}%; width: {b.width_pct:.3f}%" '
            f'title="step {b.step} {kind} {name} {status}: {b.duration_ms:.1f} ms{extra}"></a></div>'
            f'<span class="facts">{mark}{status} · {duration(b.duration_ms / 1000)}{facts}</span></div>'
        )
        if b.given or b.gave:
            # Text, not attributes: only <, > and & need escaping (JSON's quotes stay one byte each).
            given, gave = html.escape(b.given, quote=False) or NONE, html.escape(b.gave, quote=False) or NONE
            err = " err" if b.status in ("error", "failed") else ""
            out.append(f'<div class="io-line{" failing" if fails else ""}" data-step="{b.step}">'
                       f'<span class="in">{given}</span><span class="arrow">→</span>'
                       f'<span class="out{err}">{gave}</span></div>')  # fmt: skip
    return Markup("\n".join(out))
