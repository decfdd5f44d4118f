"""The command line's start: ``runledger --help``, ``runs`` and ``show RUN`` beside ``python -c pass``.

Workload: an embedded nats-server in a temp home holding the demo's five runs (``runledger demo``'s
refund agent: refunds, a question, an unknown order that fails, a refund approved and resumed).
Each command is a fresh process, as a user types it: the installed ``runledger`` script, the server
found the way the CLI finds it (``$RUNLEDGER_HOME/server.json``), bytecode cached (a private
``PYTHONPYCACHEPREFIX``, warmed once: what an installed package has) and the entry points' cache
warm; and again as this repository's development environment runs them ("compiled": an editable
install under ``PYTHONDONTWRITEBYTECODE=1`` compiles runledger's own modules at every call). Rounds
interleave every command (and the baseline's, when ``$RUNLEDGER_BENCH_CLI_BASELINE`` names the
``runledger`` script of another checkout), so a busy moment hits all alike; each ratio to
``python -c pass`` is taken within its round. Wall time with ``time.perf_counter``, CPU (user +
system) from the children's ``getrusage``.

    RUNLEDGER_BENCH_CLI_BASELINE=/path/to/old/.venv/bin/runledger python -m bench cli
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import server
from bench.report import Goal, Section, SuiteOptions, Table, num, ratio_cell, ratio_stats

GOALS_S = {"--help": 0.25, "runs": 0.5, "show RUN": 0.5}
BASELINE_ENV = "RUNLEDGER_BENCH_CLI_BASELINE"
WHY = (
    "a command that reads the log starts the core's dependencies: asyncio, the NATS client, pydantic (and the "
    "event models built on it), msgspec, cryptography; by the importtime profile below, the largest imports "
    "are {top}. On a busy machine the wall time also waits for a core: compare the ratios to `python -c pass`, "
    "measured in the same rounds."
)


def _record(url: str) -> str:
    """The demo's runs on the server at ``url``; returns a completed run's id (for ``show``)."""
    from runledger.examples.refund_agent.demo import main as demo
    from runledger.log.client import connect
    from runledger.ops.trace import list_runs

    before = dict(os.environ)
    try:
        asyncio.run(demo(url, show=lambda line: None))
    finally:  # the demo points its agent at its payments service through the environment: not the suite's
        for name in set(os.environ) - set(before):
            del os.environ[name]
        os.environ.update(before)

    async def completed() -> str:
        client = await connect(url)
        try:
            return next(r.run_id for r in await list_runs(client) if r.status == "completed")
        finally:
            await client.close()

    return asyncio.run(completed())


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one process (its exit code must be 0)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _commands(script: str, run_id: str) -> dict[str, list[str]]:
    return {"--help": [script, "--help"], "runs": [script, "runs"], "show RUN": [script, "show", run_id]}


def measure(
    env: dict[str, str], run_id: str, rounds: int, *, compiled: bool = True, warm: bool = True
) -> dict[str, dict[str, list[float]]]:
    """``{name: {"wall": [...], "cpu": [...]}}``, one sample a round, every command in each round.

    Also each command as this repository's development environment runs it: an editable install
    with ``PYTHONDONTWRITEBYTECODE=1`` compiles runledger's own modules from source at every call
    (site-packages keep the bytecode pip compiled): "(compiled)"."""
    script = str(Path(sys.executable).parent / "runledger")
    bare = {k: v for k, v in env.items() if k != "PYTHONPYCACHEPREFIX"} | {"PYTHONDONTWRITEBYTECODE": "1"}
    commands: dict[str, tuple[list[str], dict[str, str]]] = {"python -c pass": ([sys.executable, "-c", "pass"], env)}
    scripts = {"": script}
    if baseline := os.environ.get(BASELINE_ENV):
        scripts[" (before)"] = baseline
    for suffix, where in scripts.items():
        commands |= {f"{name}{suffix}": (argv, env) for name, argv in _commands(where, run_id).items()}
    for suffix, where in scripts.items() if compiled else ():
        commands |= {f"{name}{suffix} (compiled)": (argv, bare) for name, argv in _commands(where, run_id).items()}
    for argv, with_env in commands.values() if warm else ():  # bytecode compiled and cached, entry points cached
        _timed(argv, with_env)
    out: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in commands}
    for _ in range(rounds):
        for name, (argv, with_env) in commands.items():
            wall, cpu = _timed(argv, with_env)
            out[name]["wall"].append(wall)
            out[name]["cpu"].append(cpu)
    return out


def import_profile(env: dict[str, str], top: int = 12) -> tuple[Table, list[tuple[str, float]]]:
    """``python -X importtime -m runledger runs``, one call: self time by top-level package (a table, and
    the ``top`` packages with their milliseconds)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "runledger", "runs"],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    spent: Counter[str] = Counter()
    for line in done.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
        if m:
            name = m[2] if m[2].startswith("runledger.") else m[2].split(".")[0]
            spent["runledger (own modules)" if name.startswith("runledger") else name] += int(m[1])
    total = sum(spent.values()) or 1
    rows = [[name, num(us / 1000), f"{100 * us / total:.0f}%"] for name, us in spent.most_common(top)]
    rows.append(["all imports", num(total / 1000), "100%"])
    table = Table("where `runledger runs` spends its imports (python -X importtime, self ms, one call)",
                  ["package", "ms", "share"], rows)  # fmt: skip
    return table, [(name, us / 1000) for name, us in spent.most_common(top)]


def run_suite(opts: SuiteOptions) -> Section:
    rounds = 1 if opts.quick else 10
    section = Section(part="cli", title="the command line's start: --help, runs, show beside python -c pass")
    workload = " ".join((__doc__ or "").split("\n\n")[1].split()).removeprefix("Workload: ")
    section.workload = workload[:1].upper() + workload[1:]
    with server() as state, tempfile.TemporaryDirectory(prefix="runledger-bench-cli-") as tmp:
        run_id = _record(state.url)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "RUNLEDGER_NATS_URL")}
        env |= {"RUNLEDGER_HOME": str(Path(state.log).parent), "PYTHONPYCACHEPREFIX": f"{tmp}/pyc",
                "XDG_CACHE_HOME": f"{tmp}/cache"}  # fmt: skip
        # A smoke run: one round, not warmed, the cached case only (its numbers mean nothing anyway).
        samples = measure(env, run_id, rounds, compiled=not opts.quick, warm=not opts.quick)
        profile, heaviest = import_profile(env)
    why = WHY.format(top=", ".join(f"{name} {num(ms)} ms" for name, ms in heaviest[:6]))
    base = samples["python -c pass"]
    rows = []
    for name, s in samples.items():
        pairs = list(zip(s["wall"], base["wall"], strict=True))
        cpu_pairs = list(zip(s["cpu"], base["cpu"], strict=True))
        rows.append([f"`{name}`", num(statistics.median(s["wall"])), num(min(s["wall"])),
                     num(statistics.median(s["cpu"])), "" if s is base else ratio_cell(ratio_stats(pairs)),
                     "" if s is base else ratio_cell(ratio_stats(cpu_pairs))])  # fmt: skip
    columns = ["command", "wall p50", "wall min", "CPU p50", "wall / pass", "CPU / pass"]
    section.tables.append(Table(f"seconds per call ({rounds} rounds)", columns, rows))
    for name, limit in GOALS_S.items():
        wall = statistics.median(samples[name]["wall"])
        detail = f"{num(wall)} s wall p50, {num(statistics.median(samples[name]['cpu']))} s CPU"
        before = samples.get(f"{name} (before)")
        if before:
            wall_before, cpu_before = statistics.median(before["wall"]), statistics.median(before["cpu"])
            detail += f"; before {num(wall_before)} s wall, {num(cpu_before)} s CPU"
        section.goals.append(Goal(f"`runledger {name}` under {limit:g} s wall", wall < limit, detail + ".", why))
    section.tables.append(profile)
    section.data = {"samples": samples, "rounds": rounds, "baseline": os.environ.get(BASELINE_ENV, "")}
    return section


def main() -> dict[str, Any]:
    from bench.report import render

    with tempfile.TemporaryDirectory() as tmp:
        section = run_suite(SuiteOptions(quick=False, plot_dir=Path(tmp)))
        print(render([section], {}, Path(tmp)))
    return section.data


if __name__ == "__main__":
    main()
