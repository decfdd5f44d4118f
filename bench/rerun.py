"""Re-drive throughput: many recorded runs re-driven in sandboxes, warm pool against cold.

Workload: N recorded runs of the example refund agent (ticket T-1001: 2 model calls, a
read tool, 2 effects; 5 steps), each re-driven from step 1 (the model live, tools and
effects from the record) in its own hardened container. "warm": a pool keeps sandboxes
started and connected ahead of demand, with C re-drives in flight. "cold": a container
is created and started for each re-drive, same concurrency. Both in the same process
against the same server, interleaved in blocks (a warm block, then a cold block of the
same parents), so each block pair gives a ratio. With a deadline (the suite's), cold
blocks after the first stop when the rest would not fit; warm blocks always run to N.
"single": S re-drives one at a time, each started once the warm pool is full and idle (the
latency of one re-drive from a warm pool, no sweep competing for the CPU), after the blocks.
Each block starts once the containers of the one before are created and removed, and the CPU
seconds of each block are counted by process (bench/cpu.py), so a block's CPU per re-drive
counts each of its containers once.

"floor": before the blocks, F containers of the sandbox's own hardened configuration
(``hardened_container``) running ``/bin/true``, created, started, waited for and removed one
after another: the engine's own CPU per container lifecycle (dockerd, containerd, the shim, runc,
runc's init), which no change of ours can cut while every re-run gets its own container. x 200 /
cores, it is the least time 200 re-drives can take on this machine.
Requires Docker and the sandbox image (built if missing or stale: ``runledger sandbox build``).

    python -m bench.rerun [--runs 200] [--cold-runs 200] [--block 10] [--concurrency 2] [--pool 3] [--single 20]
                          [--floor 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import server, summary, table
from bench.cpu import CpuMeter, PerfSampler
from bench.report import STAT_COLUMNS, Goal, Section, SuiteOptions, Table, not_run, ratio_cell, ratio_stats, stat_cells
from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient, connect
from runledger.sandbox.containers import (
    LABEL,
    OWNER,
    CodeMounts,
    SandboxPolicy,
    SandboxPool,
    _mounts,
    code_mounts,
    hardened_container,
)
from runledger.sandbox.image import build_image, docker_client
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.lifecycle import start_run

AGENT = "runledger.examples.refund_agent.agent:spec"
FLOOR_COMMAND = ["/bin/true"]
CORES = os.cpu_count() or 1


async def redrive_all(
    client: LedgerClient, pool: SandboxPool, parents: list[str], concurrency: int, meter: CpuMeter | None = None
) -> dict[str, Any]:
    """Re-drive ``parents``, ``concurrency`` at a time; with ``meter``, the CPU seconds by process
    from the start until the pool has settled (its refills and removals done), timed without it."""
    rerunner = Rerunner(client, pool)
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in parents:
        queue.put_nowait(p)
    latencies: list[float] = []
    failures: list[str] = []

    async def worker() -> None:
        while not queue.empty():
            parent = queue.get_nowait()
            t0 = time.perf_counter()
            result = await rerunner.rerun(RerunRequest(parent_run_id=parent, agent=AGENT, mode="redrive", fork_step=1))
            latencies.append((time.perf_counter() - t0) * 1000)
            if result.status != "completed":
                failures.append(f"{parent}: {result.reason} {result.error}")

    before = meter.snapshot() if meter is not None else None
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - t0
    await pool.settle()
    cpu = CpuMeter.since(before, meter.snapshot()) if meter is not None and before is not None else {}
    cpu.pop("wall", None)
    return {"runs": len(parents), "seconds": seconds, "latencies": latencies, "failures": failures, "cpu": cpu}


def engine_floor(docker: Any, policy: SandboxPolicy, code: CodeMounts, n: int) -> dict[str, Any]:
    """CPU milliseconds, by process, of one lifecycle of a trivial container of the sandbox's
    configuration (its mounts included), ``n`` one after another, as the pool makes them."""
    api = docker.api
    sock_dir = Path(tempfile.mkdtemp(prefix="rl-floor-"))
    (sock_dir / "broker.sock").touch()  # mounted where a channel's socket is; nothing connects
    binds = _mounts(code, sock_dir)
    labels = {LABEL: "1", f"{LABEL}.owner": OWNER}  # reaped like any sandbox if the bench dies

    def lifecycle() -> None:
        created = api.create_container(**hardened_container(api, policy, FLOOR_COMMAND, binds, labels))
        try:
            api.start(created["Id"])
            api.wait(created["Id"], timeout=30)
        finally:
            api.remove_container(created["Id"], force=True)

    try:
        lifecycle()  # the first one after a while pays for the engine's caches
        meter, perf = CpuMeter(), PerfSampler()
        with perf.sampling():
            before = meter.snapshot()
            for _ in range(n):
                lifecycle()
            spent = CpuMeter.since(before, meter.snapshot())
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
    wall = spent.pop("wall")
    ms = {name: seconds * 1000 / n for name, seconds in spent.items()}  # no server: this meter has none
    if perf.ms is not None:
        ms.update({name: v / n for name, v in perf.ms.items()})
    ms["host"] = ms.pop("host", 0.0)  # the docker client's requests, last
    return {"n": n, "ms": ms, "total_ms": sum(ms.values()), "wall_ms": wall * 1000 / n, "perf": perf.ms is not None,
            "perf_why": perf.why}  # fmt: skip


def _cpu_text(ms: dict[str, float]) -> str:
    return ", ".join(f"{name} {v:.0f}" for name, v in ms.items())


def redrive_cpu(results: dict[str, Any], name: str) -> dict[str, float]:
    """CPU ms per re-drive of the ``name`` blocks by process, with the shims' and runc's share (which
    /proc cannot attribute) taken from the floor's containers when perf measured it there."""
    ms = dict(results[name].get("cpu_ms") or {})
    floor = results.get("floor")
    if ms and floor is not None and floor["perf"]:
        ms.update({k: floor["ms"][k] for k in ("shim", "runc") if k in floor["ms"]})
    return ms


def cpu_findings(results: dict[str, Any]) -> dict[str, str]:
    """What the CPU counts say about the wall-clock goals: ``floor`` (the engine's least cost of 200),
    ``warm`` (a warm re-drive's cost) and ``ratio`` (the most a warm pool can gain over cold)."""
    cores, found = results["cores"], {}
    floor = results.get("floor")
    if floor is not None:
        unseen = "" if floor["perf"] else f"; the shims and runc not counted ({floor['perf_why']}): a lower bound"
        found["floor"] = (
            f"the engine's own lifecycle of one container of this configuration (create, start, wait, remove of "
            f"/bin/true; {floor['n']} in a row) costs {floor['total_ms']:.0f} ms of CPU ({_cpu_text(floor['ms'])}"
            f"{unseen}), so 200 containers take at least 200 x {floor['total_ms']:.0f} ms / {cores} cores = "
            f"{200 * floor['total_ms'] / 1000 / cores:.1f} s with no guest, host or server at all"
        )
    warm = redrive_cpu(results, "warm")
    if warm:
        total = sum(warm.values())
        found["warm"] = (
            f"a warm re-drive costs {total:.0f} ms of CPU ({_cpu_text(warm)}; containers = the guest, its init and "
            f"runc's init), so 200 take at least {200 * total / 1000 / cores:.1f} s of {cores} cores"
        )
        cold_rate = results["cold"]["runs_per_s"]
        if cold_rate:
            best = cores / (total / 1000)
            found["ratio"] = (
                f"a pool moves start-up off a re-drive's path, not off the CPU: at {total:.0f} ms of CPU each, warm "
                f"re-drives can reach at most {cores} / {total / 1000:.3f} s = {best:.2f} runs/s and cold ones ran "
                f"{cold_rate:.2f} runs/s, so warm can be at most {best / cold_rate:.2f}x faster here"
            )
    return found


# Why a warm re-drive misses 1.3x the engine's floor (docs/sandbox.md, "Start-up cost").
WHY_FLOOR = (
    "a fresh interpreter per container is the floor of the guest: about 200 ms of a re-drive's CPU is outside "
    "its container (the host, dockerd, containerd, the shims, runc), Python itself starts in ~40 ms, so a guest "
    "that did nothing would be ~1.4x; the guest's imports add asyncio (+85 ms) and pydantic's BaseModel "
    "(+110 ms), which the SDK's modules and the run's models need. Taking pydantic off the guest's path "
    "(about a third of the guest) would give ~2.0x: not made."
)


def floor_goal(results: dict[str, Any]) -> Goal:
    """A warm re-drive's CPU (every process counted) at most 1.3x the engine's own container floor."""
    name = "warm re-drive CPU at most 1.3x the engine's own container floor, measured in the same run"
    floor, warm = results.get("floor"), redrive_cpu(results, "warm")
    if floor is None or not warm or not floor["total_ms"]:
        return Goal(name, None, "not measured (no floor or no warm re-drive).")
    total = sum(warm.values())
    ratio = total / floor["total_ms"]
    return Goal(name, ratio <= 1.3, f"{total:.0f} ms against {floor['total_ms']:.0f} ms: {ratio:.2f}x.", WHY_FLOOR)


def _merge(blocks: list[dict[str, Any]], pool: SandboxPool) -> dict[str, Any]:
    runs = sum(b["runs"] for b in blocks)
    seconds = sum(b["seconds"] for b in blocks)
    latencies = [v for b in blocks for v in b["latencies"]]
    cpu: dict[str, float] = {}
    for b in blocks:
        for name, v in b.get("cpu", {}).items():
            cpu[name] = cpu.get(name, 0.0) + v
    return {
        "cpu_ms": {name: v * 1000 / runs for name, v in cpu.items()} if runs else {},
        "runs": runs, "seconds": seconds, "runs_per_s": runs / seconds if seconds else 0.0,
        "latency": summary(latencies) if latencies else None, "latencies": latencies,
        "failures": [f for b in blocks for f in b["failures"]], "warm_hits": pool.warm_hits,
        "cold_starts": pool.cold_starts, "blocks": len(blocks),
    }  # fmt: skip


async def measure(
    url: str, args: argparse.Namespace, deadline: float | None = None, server_pid: int | None = None
) -> dict[str, Any]:
    """The engine's floor, then warm and cold re-drives in alternating blocks; cold blocks stop
    when ``deadline`` would be passed. ``server_pid``: the log server's, counted as ``server``."""
    docker = docker_client()
    t0 = time.perf_counter()
    image = build_image(log=lambda m: None)
    image_s = time.perf_counter() - t0
    client = await connect(url)
    try:
        agent = spec()
        parents = []
        for i in range(max(args.runs, args.cold_runs, args.single)):
            result = await start_run(client, agent, TICKETS[0], run_id=f"bench-parent-{i}")
            parents.append(result.run_id)
        policy = SandboxPolicy(image=image, timeout_s=60)
        warm_pool = SandboxPool(docker, policy, size=args.pool)
        cold_pool = SandboxPool(docker, policy, size=0)
        code = code_mounts(agent.fn, AGENT)  # the pool's key, as the re-runs will ask for it
        warm_blocks: list[dict[str, Any]] = []
        cold_blocks: dict[int, dict[str, Any]] = {}  # by the index of the warm block it pairs with
        skipped = 0
        meter = CpuMeter(server_pid)
        floor = None
        if args.floor:
            floor = await asyncio.to_thread(engine_floor, docker, policy, code, args.floor)
        try:
            await warm_pool.prewarm(code, AGENT)
            for start in range(0, args.runs, args.block):
                block = parents[start : start + args.block]
                warm_blocks.append(await redrive_all(client, warm_pool, block, args.concurrency, meter))
                cold_done = sum(b["runs"] for b in cold_blocks.values())
                block = block[: args.cold_runs - cold_done]
                if not block:
                    continue
                if deadline is not None and cold_blocks:  # the first cold block always runs: one pair at least
                    # The cold block, at the cold rate so far, plus the warm blocks still to come must fit;
                    # else skip it (a later block may fit: the estimates improve as blocks are timed).
                    done_runs = sum(b["runs"] for b in warm_blocks)
                    warm_per_run = sum(b["seconds"] for b in warm_blocks) / done_runs
                    cold_per_run = sum(b["seconds"] for b in cold_blocks.values()) / cold_done
                    needed = cold_per_run * len(block) + warm_per_run * (args.runs - done_runs)
                    if time.monotonic() + needed > deadline:
                        skipped += len(block)
                        continue
                cold_blocks[len(warm_blocks) - 1] = await redrive_all(client, cold_pool, block, args.concurrency, meter)
            single: list[float] = []
            for parent in parents[: args.single]:
                await warm_pool.prewarm(code, AGENT)
                single.extend((await redrive_all(client, warm_pool, [parent], 1))["latencies"])
        finally:
            await warm_pool.close()
            await cold_pool.close()
        warm, cold = _merge(warm_blocks, warm_pool), _merge(list(cold_blocks.values()), cold_pool)
        pairs = [
            (warm_blocks[i]["runs"] / warm_blocks[i]["seconds"], c["runs"] / c["seconds"])
            for i, c in cold_blocks.items()
            if c["runs"] and warm_blocks[i]["seconds"] and c["seconds"]
        ]
        cold_stopped = ""
        if cold["runs"] < args.cold_runs:
            cold_stopped = (
                f"cold re-drives: {cold['runs']} of {args.cold_runs} ran, in {len(cold_blocks)} of "
                f"{len(warm_blocks)} blocks; the others were left out because they and the remaining warm ones "
                "would not have fit in the suite's time budget (python -m bench --budget, 15 minutes by default)"
            )
        return {"warm": warm, "cold": cold, "throughput_ratio": ratio_stats(pairs) if pairs else None,
                "cold_stopped": cold_stopped, "image": image, "image_s": image_s,
                "single": summary(single) if single else None, "floor": floor, "cores": CORES}  # fmt: skip
    finally:
        await client.close()


def run(args: argparse.Namespace, deadline: float | None = None) -> dict[str, Any]:
    """Start the payments service and a server, then ``measure``."""
    with tempfile.TemporaryDirectory() as tmp:
        payments = PaymentsService(Path(tmp) / "payments.log").start()
        saved = {k: os.environ.get(k) for k in ("REFUND_PAYMENTS_URL", "REFUND_OUTBOX")}
        os.environ["REFUND_PAYMENTS_URL"] = payments.url
        os.environ["REFUND_OUTBOX"] = str(Path(tmp) / "outbox")
        try:
            with server() as state:
                return asyncio.run(measure(state.url, args, deadline, state.pid))
        finally:
            payments.stop()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def run_suite(opts: SuiteOptions) -> Section:
    title = "re-driving recorded runs in sandboxes, warm pool against cold containers"
    try:
        docker_client()
    except Exception as exc:  # DockerUnavailableError, or docker-py missing: the part is reported as not run
        return not_run("rerun", title, f"{exc}")
    runs, block = (4, 2) if opts.quick else (200, 10)
    args = argparse.Namespace(
        runs=runs, cold_runs=runs, block=block, concurrency=2, pool=3, single=2 if opts.quick else 20,
        floor=3 if opts.quick else 20,
    )  # fmt: skip
    results = run(args, opts.deadline)
    warm, cold = results["warm"], results["cold"]
    section = Section(part="rerun", title=title, data={k: v for k, v in results.items() if k not in ("warm", "cold")})
    section.data.update({m: {k: v for k, v in results[m].items() if k != "latencies"} for m in ("warm", "cold")})
    section.workload = (
        f"{runs} recorded runs of the example refund agent (ticket T-1001: 2 model calls, a read tool, 2 effects; "
        "5 steps), each re-driven from step 1 (model live, tools and effects from the record) in its own hardened "
        f"container, {args.concurrency} re-drives in flight. warm: a pool of {args.pool} sandboxes started and "
        "connected ahead of demand (refilled in the background). cold: a container created and started for "
        f"each re-drive. Blocks of {block}: a warm block, then a cold block of the same parents, so each block "
        "pair gives a throughput ratio; each block starts once the containers of the one before are created and "
        "removed, and its CPU is counted by process (bench/cpu.py: /proc for dockerd and containerd, the engine's "
        "cgroup for everything inside containers, this process for the host, perf for the shims and runc). "
        f"Before the blocks, {args.floor} containers of the same configuration running /bin/true, one after "
        "another: the engine's own CPU per container. "
        f"Image `{results['image']}` (checked or built in {results['image_s']:.0f} s, not counted)."
    )
    if results["cold_stopped"]:
        section.notes.append(results["cold_stopped"] + ".")
    rows = []
    for name, r in (("warm", warm), ("cold", cold)):
        if r["latency"] is None:
            rows.append([name, str(r["runs"]), "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"])
            continue
        rows.append([name, str(r["runs"]), f"{r['seconds']:.1f}", f"{r['runs_per_s']:.2f}",
                     *stat_cells(r["latency"]), str(r["warm_hits"]), str(r["cold_starts"]),
                     str(len(r["failures"]))])  # fmt: skip
    columns = ["pool", "runs", "total s", "runs/s", *(f"latency {c}" for c in STAT_COLUMNS)]
    section.tables.append(Table("re-drives (latency in ms)", [*columns, "warm hits", "cold starts", "failures"], rows))
    ratio = results["throughput_ratio"]
    if ratio is not None:
        section.notes.append(f"warm / cold throughput, block by block: {ratio_cell(ratio)}.")
    single = results["single"]
    if single is not None:
        section.notes.append(
            f"one re-drive at a time from a full, idle warm pool ({int(single['n'])} after the blocks): "
            f"p50 {single['p50']:.0f} ms, min {single['min']:.0f} ms, max {single['max']:.0f} ms."
        )
    per_process = {
        "warm re-drive": redrive_cpu(results, "warm"),
        "cold re-drive": redrive_cpu(results, "cold"),
        "floor: a trivial container": (results["floor"] or {}).get("ms") or {},
    }
    names = sorted({name for ms in per_process.values() for name in ms})
    cpu_rows = [
        [row, *(f"{ms[n]:.0f}" if n in ms else "-" for n in names), f"{sum(ms.values()):.0f}"]
        for row, ms in per_process.items()
        if ms
    ]
    if cpu_rows:
        section.tables.append(Table("CPU ms by process, per re-drive or container", ["", *names, "total"], cpu_rows))
    found = cpu_findings(results)
    per_200 = warm["seconds"] / warm["runs"] * 200 if warm["runs"] else float("nan")
    section.goals.append(
        Goal(
            "200 warm re-drives in under 60 s",
            per_200 < 60,
            f"{warm['runs']} took {warm['seconds']:.1f} s ({warm['runs_per_s']:.2f} runs/s)"
            + ("" if warm["runs"] == 200 else f", {per_200:.0f} s for 200 at that rate")
            + ".",
        )
    )
    section.goals.append(
        Goal("200 warm re-drives in under 20 s", per_200 < 20 if warm["runs"] else None,
             f"{per_200:.1f} s for 200 at the warm rate measured. "
             + "".join(f"{found[k][0].upper()}{found[k][1:]}. " for k in ("floor", "warm") if k in found).strip())
    )  # fmt: skip
    section.goals.append(floor_goal(results))
    section.goals.append(
        Goal("warm re-drives at least 2x faster than cold ones, block by block",
             ratio["p50"] >= 2 if ratio is not None else None,
             (f"{ratio_cell(ratio)}." if ratio is not None else "no cold block ran.")
             + (f" {found['ratio'][0].upper()}{found['ratio'][1:]}." if "ratio" in found else ""))
    )  # fmt: skip
    section.goals.append(
        Goal("one re-drive from a warm pool under 100 ms p50", single["p50"] < 100 if single is not None else None,
             f"p50 {single['p50']:.0f} ms over {int(single['n'])}." if single is not None else "not measured.")
    )  # fmt: skip
    for name in ("warm", "cold"):
        for failure in results[name]["failures"][:5]:
            section.notes.append(f"{name} failure: {failure}")
    from bench.plots import latency_cdf

    series = {name: results[name]["latencies"] for name in ("warm", "cold") if results[name]["latencies"]}
    section.plots.append(latency_cdf(opts.plot_dir / "rerun-cdf.png", "ms per re-drive", series))
    return section


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--cold-runs", type=int, default=200)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--pool", type=int, default=3)
    parser.add_argument("--single", type=int, default=20, help="re-drives one at a time from a full, idle pool")
    parser.add_argument("--floor", type=int, default=20, help="trivial containers timed for the engine's own CPU")
    args = parser.parse_args(argv)
    counts = (args.runs, args.cold_runs, args.block, args.concurrency, args.pool, args.single, args.floor)
    if min(counts) < 0 or args.block == 0:
        parser.error("counts must be >= 0 and --block > 0")
    results = run(args)
    rows = [["pool", "runs", "total s", "runs/s", "p50 ms", "p99 ms", "warm hits", "cold starts", "failures"]]
    for name in ("warm", "cold"):
        r = results[name]
        if r["latency"] is None:
            continue
        rows.append([name, str(r["runs"]), f"{r['seconds']:.1f}", f"{r['runs_per_s']:.2f}",
                     f"{r['latency']['p50']:.0f}", f"{r['latency']['p99']:.0f}", str(r["warm_hits"]),
                     str(r["cold_starts"]), str(len(r["failures"]))])  # fmt: skip
    print(table(rows))
    if results["throughput_ratio"] is not None:
        print(f"\nwarm / cold throughput (block by block) = {ratio_cell(results['throughput_ratio'])}")
    print(f"{results['warm']['runs']} warm re-drives took {results['warm']['seconds']:.1f} s (goal: 200 in under 60 s)")
    if results["single"] is not None:
        s = results["single"]
        print(f"one at a time from a full, idle warm pool: p50 {s['p50']:.0f} ms, min {s['min']:.0f} ms (n={s['n']})")
    for text in cpu_findings(results).values():
        print(text)
    for name in ("warm", "cold"):
        for failure in results[name]["failures"][:5]:
            print(f"{name} failure: {failure}")
    return results


if __name__ == "__main__":
    main()
