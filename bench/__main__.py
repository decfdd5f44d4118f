"""The benchmark suite: ``python -m bench all`` (or one or more parts) writes docs/benchmarks.md.

    python -m bench all                 # every part, ~15 minutes on a 2-core machine
    python -m bench record resume       # some parts; the other parts' sections are kept from the last run
    python -m bench all --quick         # a smoke run (a handful of steps) into a temp dir, numbers meaningless
    python -m bench all --skip rerun --out /tmp/b   # leave a part out, write elsewhere
    python -m bench --list

Every part runs in this process, one after the other, against servers it starts itself
(an embedded nats-server in a temp dir, sqlite files, containers), and returns a
``bench.report.Section``. The report is ``OUT/benchmarks.md``, the plots are
``OUT/benchmarks/*.png`` and the sections as JSON ``OUT/benchmarks/results.json`` (which is
how a run of one part keeps the others' sections). A part that cannot run here (no Docker)
is reported as not run, with the reason; a part that raises is reported as failed and the
suite goes on (the exit status is then 1).

Adding a part: write ``bench/NAME.py`` with ``run_suite(opts: SuiteOptions) -> Section`` and
append a ``Part`` to ``PARTS`` below (its position is its place in the run and the report;
rerun is last because it sizes its cold re-drives to the time left).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import Goal, Section, SuiteOptions, load_average, machine, not_run, now_utc, render

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 15 * 60


@dataclass(frozen=True)
class Part:
    name: str
    module: str
    about: str
    # How to run it; default: the module's ``run_suite(opts) -> Section``. A part whose
    # module has another shape gets an adapter here (``load``).
    runner: Callable[[SuiteOptions], Section] | None = None


def _load_part(opts: SuiteOptions) -> Section:
    """bench/load.py (another issue's) returns a dict and prints its own report: wrap it in a Section."""
    load = importlib.import_module("bench.load")
    results = load.run_suite(quick=opts.quick)
    section = Section(part="load", title="many concurrent agents, on one node and a 3-node cluster")
    doc = (load.__doc__ or "").split("\n\n")  # its docstring states the workload; the first line is a title
    section.workload = "\n\n".join(p.strip() for p in doc[1:] if p.strip() and not p.strip().startswith("python -m"))
    runs = results.get("results", results) if isinstance(results, dict) else results
    if hasattr(load, "report"):
        section.blocks.append(load.report(runs))
    if hasattr(load, "plot"):
        path = opts.plot_dir / "load.png"
        load.plot(runs, path)
        section.plots.append(path)
    section.goals.extend(load_goals(runs))
    section.data = {"results": runs}
    return section


# The SDK's CPU per step over the raw client's CPU per message at 10 and 50 agents on one node,
# from the round before this one (docs/benchmarks.md of 2026-12-02: 0.67 / 0.097 ms and
# 0.56 / 0.062 ms). Halving the SDK's CPU per step is judged on this ratio, which a busier or
# slower machine changes far less than it changes either CPU figure.
CPU_RATIO_BEFORE = {10: 0.67 / 0.097, 50: 0.56 / 0.062}


# Why the load goals are missed on a 2-core machine (the SDK process profiled at 10 agents).
WHY_LOAD = (
    "the agents' process is CPU-bound: ~1.1-1.3 ms of CPU a step (1.4 events, each redacted, sealed, hashed "
    "and fenced) against 0.14-0.19 ms a raw message, with the server on the other core; throughput follows "
    "the SDK's CPU per step, not the log."
)
WHY_CPU = (
    "the cuts made (redaction's hint check 0.64x a tool step's protection, the key bucket looked up once a "
    "connection 0.66x a run's protector, an effect's context lookup 37 -> 0.6 us, no second protect pass "
    "on an effect's events, msgspec canonical JSON) leave a spread: content protection 23%, building events "
    "12%, the publish path 13%, nats-py's flusher 7%, effects 12% (2 of 20 steps), starting and ending runs "
    "6%; no single cost is left whose removal halves it."
)


def load_goals(runs: list[dict[str, Any]]) -> list[Goal]:
    """Issue 31's goals on one node: events/s at least 0.9x raw, the SDK's CPU per step halved."""
    node = next((r for r in runs if r.get("target") == "node"), None)
    levels = {lv["agents"]: lv for lv in node["levels"]} if node else {}
    goals = []
    for agents in (10, 50):
        lv = levels.get(agents)
        if lv is None:
            goals.append(Goal(f"under load, at least 0.9x raw events/s at {agents} agents on one node", None,
                              "not measured (a quick run measures fewer levels)."))  # fmt: skip
            continue
        ratio = lv["events_s_over_raw"]
        goals.append(Goal(
            f"under load, at least 0.9x raw events/s at {agents} agents on one node", ratio >= 0.9,
            f"events/s / raw msg/s = {ratio:.2f}x ({lv['events_s']:,.0f} against {lv['raw_msgs_s']:,.0f}).", WHY_LOAD,
        ))  # fmt: skip
        cpu = lv["client_cpu_ms_per_step"] / lv["raw_client_cpu_ms_per_msg"] if lv["raw_client_cpu_ms_per_msg"] else 0
        before = CPU_RATIO_BEFORE[agents]
        goals.append(Goal(
            f"SDK CPU per step halved at {agents} agents (against the raw client's CPU per message)",
            0 < cpu <= before / 2,
            f"SDK CPU {lv['client_cpu_ms_per_step']:.3f} ms a step, raw {lv['raw_client_cpu_ms_per_msg']:.3f} ms "
            f"a message: {cpu:.1f}x, against {before:.1f}x the round before ({cpu / before:.2f} of it; goal 0.5).",
            WHY_CPU,
        ))  # fmt: skip
    return goals


PARTS: list[Part] = [
    Part(
        "record",
        "bench.record",
        "a recorded step: SDK vs raw js.publish vs LangGraph (Sqlite, Postgres, Runledger savers), DBOS, eventsourcing",
    ),
    Part("resume", "bench.resume", "resuming 10/100/1,000-step runs vs loading LangGraph, DBOS, eventsourcing state"),
    Part("project", "bench.project", "DuckDB rebuild rate vs a raw stream read; analyst queries over 1,000,000 events"),
    Part("protect", "bench.protect", "what redaction and sealing cost per step"),
    Part("channel", "bench.channel", "the sandbox channel: unix socket vs attached stdio (Docker)"),
    Part("load", "bench.load", "concurrent agents on a node and a 3-node cluster vs raw publish", runner=_load_part),
    Part("ui", "bench.ui", "the page's server time: the run list over 100,000 runs, a 1,000-step run's page"),
    Part("replay", "bench.replay", "200 exported runs replayed in-process by the pytest replayer (runledger.testing)"),
    Part("cli", "bench.cli", "runledger --help, runs, show RUN as fresh processes, beside python -c pass"),
    Part("rerun", "bench.rerun", "200 re-drives, warm pool vs cold containers (Docker)"),
]


def _runner(part: Part) -> Callable[[SuiteOptions], Section]:
    if part.runner is not None:
        return part.runner
    module = importlib.import_module(part.module)
    fn: Callable[[SuiteOptions], Section] = module.run_suite
    return fn


def available(part: Part) -> str:
    """ "" when the part can be imported, else why not (a part still being written, a missing extra)."""
    try:
        module = importlib.import_module(part.module)
    except ImportError as exc:
        return f"{part.module} cannot be imported ({exc}); `pip install -e '.[dev,bench]'`?"
    if part.runner is None and not hasattr(module, "run_suite"):
        return f"{part.module} has no run_suite()"
    return ""


def run_part(part: Part, opts: SuiteOptions) -> Section:
    started, load = now_utc(), load_average()
    t0 = time.monotonic()
    missing = available(part)
    if missing:
        section = not_run(part.name, part.about, missing)
    else:
        try:
            section = _runner(part)(opts)
        except Exception as exc:  # one broken part must not sink the others; it is reported and fails the run
            traceback.print_exc()
            section = Section(part=part.name, title=part.about, status="failed", reason=f"{type(exc).__name__}: {exc}")
    section.seconds = time.monotonic() - t0
    section.started, section.load = started, load
    return section


def _relative(section: Section, out: Path) -> Section:
    section.plots = [Path(os.path.relpath(p, out)) if p.is_absolute() else p for p in section.plots]
    return section


def _previous(results: Path, quick: bool) -> dict[str, Section]:
    """The sections of the last run into the same place (a quick run's are never mixed with a real run's)."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        last = json.loads(results.read_text())
        if ("QUICK" in last["header"]) == quick:
            return {s["part"]: Section.from_json(s) for s in last["sections"]}
    return {}


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"load average: {load_average()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = [p.name for p in PARTS]
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"all, or some of: {', '.join(names)}")
    parser.add_argument("--quick", action="store_true", help="a smoke run: a handful of steps, numbers meaningless")
    parser.add_argument("--skip", nargs="+", default=[], choices=names, metavar="PART", help="leave these out")
    parser.add_argument("--out", type=Path, help="where benchmarks.md goes (default docs/; --quick: a temp dir)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds the whole run may take (rerun fits)")
    parser.add_argument("--list", action="store_true", help="list the parts and exit")
    args = parser.parse_args(argv)
    if args.list or not args.parts:
        for p in PARTS:
            missing = available(p)
            print(f"{p.name:8} {p.about}" + (f"  [not available: {missing}]" if missing else ""))
        if not args.list:
            print("\nusage: python -m bench all | PART... [--quick] [--skip PART...] [--out DIR]", file=sys.stderr)
            return 2
        return 0
    unknown = [n for n in args.parts if n != "all" and n not in names]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}: use all or some of {', '.join(names)}")
    chosen = [p for p in PARTS if ("all" in args.parts or p.name in args.parts) and p.name not in args.skip]
    out: Path = args.out or (Path(tempfile.gettempdir()) / "runledger-bench-quick" if args.quick else ROOT / "docs")
    plot_dir = (out / "benchmarks").resolve()
    plot_dir.mkdir(parents=True, exist_ok=True)
    results_file = plot_dir / "results.json"

    t0 = time.monotonic()
    opts = SuiteOptions(quick=args.quick, plot_dir=plot_dir, deadline=t0 + args.budget - 20)
    uptime_before = _uptime()
    ran: dict[str, Section] = {}
    for part in chosen:
        print(f"[bench] {part.name}: {part.about} (load {load_average()})", file=sys.stderr, flush=True)
        section = _relative(run_part(part, opts), out.resolve())
        print(f"[bench] {part.name}: {section.status} in {section.seconds:.0f} s {section.reason}", file=sys.stderr)
        ran[part.name] = section
        for goal in section.goals:
            mark = {True: "met", False: "MISSED", None: "not judged"}[goal.met]
            print(f"[bench]   {mark}: {goal.text}. {goal.detail}", file=sys.stderr)
    total = time.monotonic() - t0
    # The other parts' sections are read now, not before the parts ran: another run of some parts that
    # ended meanwhile (a part takes minutes) is kept, not overwritten with what was there before it.
    sections = {**_previous(results_file, args.quick), **ran}
    ordered = [sections[p.name] for p in PARTS if p.name in sections]
    header = {
        "generated": now_utc(),
        "command": "python -m bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "this run took": f"{total:.0f} s for {', '.join(p.name for p in chosen)} "
        f"({'within' if total <= args.budget else 'over'} the budget of {args.budget:.0f} s)",
        "uptime before": uptime_before,
        "uptime after": _uptime(),
        **machine(),
    }
    if args.quick:
        header = {"QUICK": "a smoke run with a handful of steps: the numbers mean nothing", **header}
    report = out / "benchmarks.md"
    report.write_text(render(ordered, header, out.resolve()))
    results_file.write_text(
        json.dumps({"header": header, "sections": [s.to_json() for s in ordered]}, indent=1, default=str) + "\n"
    )
    print(f"[bench] wrote {report} and {plot_dir}/ in {total:.0f} s", file=sys.stderr)
    return 1 if any(sections[p.name].status == "failed" for p in chosen) else 0


if __name__ == "__main__":
    sys.exit(main())
