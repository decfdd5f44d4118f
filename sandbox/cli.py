"""The sandbox package's sub-commands: sandbox build, rerun, worker, diff."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from typing import Any

from runledger.cli.connect import nats_url, run_async, with_client
from runledger.errors import ConfigurationError, RunNotFoundError
from runledger.extras import require_extra
from runledger.log.client import LedgerClient, connect
from runledger.ops.trace import render_run
from runledger.protect.runs import load_run
from runledger.record.fold import fold
from runledger.sandbox.containers import SandboxPolicy, SandboxPool
from runledger.sandbox.diff import diff, render
from runledger.sandbox.image import build_image, current_image, docker_client
from runledger.sandbox.rerun import Rerunner, RerunRequest, RerunResult
from runledger.sandbox.worker import run_worker, submit


def cmd_build(args: argparse.Namespace) -> int:
    require_extra("sandbox", "`runledger sandbox build`")
    tag = build_image(args.base, log=lambda m: print(m, file=sys.stderr))
    print(tag)
    return 0


def _request(args: argparse.Namespace) -> RerunRequest:
    change: dict[str, str] = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigurationError(f"--set takes NAME=VALUE, got {item!r}")
        change[key] = value
    return RerunRequest(
        parent_run_id=args.run, agent=args.agent, mode=args.mode, fork_step=args.at_step, base_mode=args.base_mode,
        change=change, allow_effects=args.allow_effects, live_tools=args.live_tool, timeout_s=args.timeout,
    )  # fmt: skip


def _print(result: Any) -> int:
    print(f"branch {result.run_id} of {result.parent_run_id} ({result.mode} from step {result.fork_step}"
          + (f", changed {result.changed}" if result.changed else "") + f"): {result.status}"
          + (f" ({result.reason})" if result.reason else ""))  # fmt: skip
    if result.error:
        print(result.error)
    print(f"compare with: runledger diff {result.parent_run_id} {result.run_id}")
    return 0 if result.status == "completed" else 1


async def _wait_for(client: LedgerClient, run_id: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            cp = fold((await load_run(client, run_id)).records, check_chain=False)
        except RunNotFoundError:
            cp = None
        if cp is not None and cp.status in ("completed", "failed", "suspended"):
            return cp
        await asyncio.sleep(0.2)
    raise ConfigurationError(f"branch {run_id} did not finish within {timeout:g}s; is a worker running?")


def _progress_bar(done: int, total: int) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def cmd_sweep(args: argparse.Namespace) -> int:
    require_extra("sandbox", "`runledger rerun --where`")
    from runledger.projections.projector import default_db_path
    from runledger.sandbox.sweep import select_runs, sweep

    template = _request(argparse.Namespace(**{**vars(args), "run": "-"}))

    async def go() -> int:
        docker = docker_client()
        policy = SandboxPolicy(image=current_image(docker), timeout_s=args.timeout)
        client = await connect(nats_url(args))
        pool = SandboxPool(docker, policy, size=args.pool)
        try:
            run_ids = await select_runs(client, default_db_path(), args.where)
            if not run_ids:
                print(f"no recorded run matches: {args.where}")
                return 0
            print(f"re-driving {len(run_ids)} runs ({args.mode})", file=sys.stderr)
            summary = await sweep(client, pool, run_ids, template, concurrency=args.concurrency,
                                  progress=_progress_bar)  # fmt: skip
        finally:
            await pool.close()
            await client.close()
        print(summary.render())
        return 1 if summary.regressions else 0

    return run_async(go())


def cmd_rerun(args: argparse.Namespace) -> int:
    require_extra("sandbox", "`runledger rerun`")
    if args.where:
        if args.run:
            raise ConfigurationError("give either a RUN or --where, not both")
        return cmd_sweep(args)
    if not args.run:
        raise ConfigurationError("name the run to re-run, or select many with --where SQL")
    if args.mode == "replay":

        async def show(client: LedgerClient) -> int:
            log = await load_run(client, args.run)
            print(render_run(log, fold(log.records, check_chain=False), step=args.at_step))
            return 0

        return with_client(args, show)
    request = _request(args)
    if args.local:

        async def local() -> int:
            docker = docker_client()
            policy = SandboxPolicy(image=current_image(docker), timeout_s=args.timeout)
            pool = SandboxPool(docker, policy, size=0)
            client = await connect(nats_url(args))
            try:
                return _print(await Rerunner(client, pool).rerun(request))
            finally:
                await pool.close()
                await client.close()

        return run_async(local())

    async def queued(client: LedgerClient) -> int:
        await submit(client, request)
        print(f"queued re-run {request.request_id}; its branch will be run {request.branch_run_id}")
        if not args.wait:
            return 0
        cp = await _wait_for(client, request.branch_run_id, args.timeout * 3)
        print(f"branch {cp.run_id}: {cp.status}" + (f" ({cp.failure_reason})" if cp.failure_reason else ""))
        return 0 if cp.status == "completed" else 1

    return with_client(args, queued)


def _print_result(request: RerunRequest, outcome: RerunResult | Exception) -> None:
    """One line per re-run handled: its branch's outcome on stdout, an error on stderr."""
    if isinstance(outcome, Exception):
        print(f"re-run {request.request_id}: error: {outcome}", file=sys.stderr)
    else:
        print(f"re-run {request.request_id}: branch {outcome.run_id} {outcome.status}"
              + (f" ({outcome.reason})" if outcome.reason else ""), flush=True)  # fmt: skip


def cmd_worker(args: argparse.Namespace) -> int:
    require_extra("sandbox", "`runledger worker`")
    async def serve() -> int:
        docker = docker_client()
        policy = SandboxPolicy(image=args.image or current_image(docker), timeout_s=args.timeout)
        client = await connect(nats_url(args))
        print(f"worker: serving re-runs from {client.url} with {policy.image}", flush=True)
        # SIGTERM (docker stop, compose down) and Ctrl-C: finish the re-runs in hand, remove the sandboxes.
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        try:
            await run_worker(client, docker, policy=policy, concurrency=args.concurrency, pool_size=args.pool,
                             max_requests=args.max_requests, ack_wait_s=args.ack_wait, stop=stop,
                             on_result=_print_result)  # fmt: skip
        finally:
            await client.close()
        return 0

    return run_async(serve())


def cmd_diff(args: argparse.Namespace) -> int:
    result = with_client(args, lambda c: diff(c, args.run, args.branch))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True, ensure_ascii=False, default=str))
    else:
        print(render(result))
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    sandbox = sub.add_parser("sandbox", help="the sandbox image").add_subparsers(metavar="ACTION")
    p = sandbox.add_parser("build", help="build the sandbox image (offline when no registry is reachable)")
    p.add_argument("--base", help="base image with python3 (default: python:3.11-slim, else built offline)")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("rerun", parents=[common], help="re-run a recorded run in a sandbox")
    p.add_argument("run", nargs="?")
    p.add_argument("--where", metavar="SQL", help="sweep: re-run every recorded run matching this condition on runs")
    p.add_argument("--concurrency", type=int, default=2, help="sweep: re-runs in flight")
    p.add_argument("--pool", type=int, default=2, help="sweep: warm sandboxes kept ready")
    p.add_argument("--agent", required=True, metavar="MODULE:ATTR", help="the agent that recorded the run")
    p.add_argument("--mode", required=True, choices=["replay", "redrive", "live", "counterfactual"])
    p.add_argument("--at-step", type=int, help="the fork step k (default: the run's last step)")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="counterfactual change: model=MODULE:ATTR, prompt=TEXT or agent=MODULE:ATTR")  # fmt: skip
    p.add_argument("--base-mode", choices=["redrive", "live"], default="redrive", help="for counterfactual")
    p.add_argument("--allow-effects", action="store_true", help="live mode: let new effects really happen")
    p.add_argument("--live-tool", action="append", metavar="NAME", help="live mode: only these read tools run live")
    p.add_argument("--timeout", type=float, default=60.0, help="wall-clock limit of the re-run (s)")
    p.add_argument("--local", action="store_true", help="run inline instead of queueing for a worker")
    p.add_argument("--wait", action="store_true", help="queued: wait for the branch to finish")
    p.set_defaults(func=cmd_rerun)

    p = sub.add_parser("worker", parents=[common], help="execute queued re-runs")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--pool", type=int, default=2, help="warm sandboxes kept ready")
    p.add_argument("--image", help="sandbox image (default: the last one built)")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--max-requests", type=int, help="exit after this many requests")
    p.add_argument(
        "--ack-wait",
        type=float,
        default=30.0,
        help="seconds without progress before a request is redelivered to another worker",
    )
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("diff", parents=[common], help="compare a branch with its parent from the fork")
    p.add_argument("run")
    p.add_argument("branch")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_diff)
