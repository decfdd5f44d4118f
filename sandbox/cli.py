"""The sandbox package's sub-commands: sandbox build, rerun, reruns, worker, diff; and the core
``resume`` of a branch, which goes on only in a sandbox (``runledger.sandbox.resume``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from runledger.cli.connect import nats_url, run_async, with_client
from runledger.cli.exits import Exit, of_error, of_status
from runledger.errors import ConfigurationError, LedgerError, RunNotFoundError
from runledger.extras import require_extra

# Registering the commands builds parsers only: Docker, the re-runner and the projections load in
# the commands that use them, not for `runledger --help` (tests/unit/test_cli_imports.py).
if TYPE_CHECKING:
    from runledger.log.client import LedgerClient
    from runledger.sandbox.gate import GateReport
    from runledger.sandbox.matrix import MatrixReport
    from runledger.sandbox.rerun import RerunRequest, RerunResult

DEAD_LETTERED = " dead-lettered after "  # in the message of a RerunDeadLetteredError, as its branch records it


def docker_client() -> Any:
    """``runledger.sandbox.image.docker_client``, imported when a command needs the engine (tests replace it here)."""
    from runledger.sandbox.image import docker_client as client

    return client()


def current_image(docker: Any) -> str:
    """``runledger.sandbox.image.current_image``, imported when a command needs it (tests replace it here)."""
    from runledger.sandbox.image import current_image as image

    return image(docker)


def cmd_build(args: argparse.Namespace) -> int:
    require_extra("sandbox", "`runledger sandbox build`")
    from runledger.sandbox.image import IMAGE_REPO
    from runledger.sandbox.image_extras import build_sandbox_image

    # Agents that import a framework (a LangGraph graph) need its packages in the guest: --extra adds
    # them, and a build without it keeps those the current image holds (runledger.sandbox.image_extras).
    tag, kept = build_sandbox_image(
        args.base, args.extra or (), keep_extras=not args.no_extras, log=lambda m: print(m, file=sys.stderr)
    )
    if kept:
        print(
            f"{IMAGE_REPO}:latest keeps the extras it held ({', '.join(kept)}): built with them on the new image; "
            "`runledger sandbox build --no-extras` builds it without",
            file=sys.stderr,
        )
    print(tag)
    return 0


def _request(args: argparse.Namespace) -> RerunRequest:
    from runledger.sandbox.rerun import RerunRequest

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
    if result.change_note:
        print(result.change_note)
    if result.exercise is not None and not result.exercise.exercised:
        print(f"not exercised: {result.exercise.why}")
    if result.time_limit_note:
        print(result.time_limit_note)
    if result.error:
        print(result.error)
    print(f"compare with: runledger diff {result.parent_run_id} {result.run_id}")
    return of_status(result.status, result.reason)


async def _wait_for(client: LedgerClient, run_id: str, timeout: float) -> Any:
    import asyncio

    from runledger.protect.loading import load_run
    from runledger.record.fold import fold

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
    """``rerun --where``: the CI gate (runledger.sandbox.gate: verdicts, exit codes, JSON, JUnit XML, cost), or
    with two or more ``--set`` the counterfactual matrix (runledger.sandbox.matrix: one sweep per candidate).

    Whatever stops the sweep itself (no server, no Docker, a bad ``--where`` or ``--expect``) exits
    ``Exit.ERROR`` (``Exit.REFUSED`` when a rule refused it: a check outside the allow-list), never
    ``FAILED``: a CI job must not read a broken sweep as a regression."""
    from runledger.sandbox.gate import GateReport

    try:
        report = _sweep(args)
    except LedgerError as exc:  # the sweep itself could not run: its own exit code, for CI
        print(f"runledger: error: {exc}", file=sys.stderr)
        return of_error(exc)
    if isinstance(report, GateReport):  # a failure the change does not fix closes the gate unless allowed
        report.allow_still_failing = args.allow_still_failing
    if args.junit and isinstance(report, GateReport):
        with open(args.junit, "w", encoding="utf-8") as f:
            f.write(report.junit())
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True, ensure_ascii=False, default=str))
    else:
        print(report.render())
    return report.exit_code


def _sweep(args: argparse.Namespace) -> GateReport | MatrixReport:
    """Select the runs, re-drive them (one sweep, or one per candidate) and return the report."""
    require_extra("sandbox", "`runledger rerun --where`")
    from runledger.log.client import connect
    from runledger.ops.prices import PriceTable
    from runledger.projections.projector import default_db_path
    from runledger.sandbox.containers import SandboxPolicy, SandboxPool
    from runledger.sandbox.gate import GateReport, load_check
    from runledger.sandbox.matrix import matrix, parse_candidates
    from runledger.sandbox.sweep import projection_prices, select_runs, sweep

    candidates = parse_candidates(args.set or [])
    if len(candidates) > 1 and args.mode != "counterfactual":
        raise ConfigurationError("several --set values are the candidates of a counterfactual matrix: "
                                 "give --mode counterfactual")  # fmt: skip
    if len(candidates) > 1 and args.junit:
        raise ConfigurationError("--junit reports one candidate's gate: give one --set (the matrix has --json)")
    template = _request(argparse.Namespace(**{**vars(args), "run": "-", "set": (args.set or [])[:1]}))
    check = load_check(args.expect) if args.expect else None
    file_prices = PriceTable.from_file(args.prices) if args.prices else None
    sampling: dict[str, Any] = {"samples": args.samples or 1, "min_fix_rate": args.min_fix_rate or 1.0}
    if args.cache_responses:
        from runledger.sandbox.responses import ResponseCache

        sampling["responses"] = ResponseCache()

    async def go() -> GateReport | MatrixReport:
        docker = docker_client()
        policy = SandboxPolicy(image=current_image(docker), timeout_s=args.timeout)
        client = await connect(nats_url(args))
        pool = SandboxPool(docker, policy, size=args.pool)
        try:
            db = default_db_path()
            run_ids = await select_runs(client, db, args.where)
            if not run_ids:
                print(f"no recorded run matches: {args.where}", file=sys.stderr)
                return GateReport(mode=args.mode, change=dict(template.change), where=args.where,
                                  min_fix_rate=sampling["min_fix_rate"])  # fmt: skip
            prices = file_prices or projection_prices(db)
            progress = None if args.json else _progress_bar
            if len(candidates) > 1:
                print(f"re-driving {len(run_ids)} runs under {len(candidates)} candidates", file=sys.stderr)
                return await matrix(client, pool, run_ids, template, candidates, concurrency=args.concurrency,
                                    check=check, prices=prices, progress=progress, **sampling)  # fmt: skip
            print(f"re-driving {len(run_ids)} runs ({args.mode})", file=sys.stderr)
            summary = await sweep(client, pool, run_ids, template, concurrency=args.concurrency,
                                  progress=progress, check=check, prices=prices, **sampling)  # fmt: skip
        finally:
            await pool.close()
            await client.close()
        summary.gate.where = args.where
        if not args.json:
            print(summary.render())
        return summary.gate

    return run_async(go())


def _plan(args: argparse.Namespace) -> int:
    """``rerun --plan``: what each step would be in the branch (``runledger.sandbox.plan``); queues nothing."""
    from runledger.protect.loading import load_run
    from runledger.record.fold import fold
    from runledger.sandbox.plan import plan_branch, render_plan

    async def show(client: LedgerClient) -> int:
        parent = fold((await load_run(client, args.run, open_content=False)).records, check_chain=False)
        request = _request(args)
        plan = plan_branch(parent, request)
        if plan.ok:  # the request passed every check on this host: does the code load where it will run?
            await _candidate_in_image(plan, request, args.timeout)
        if args.json:
            print(json.dumps(plan.to_dict(), indent=2, sort_keys=True, ensure_ascii=False))
        else:
            print(render_plan(plan))
        return Exit.OK if plan.ok else Exit.REFUSED

    return with_client(args, show)


async def _candidate_in_image(plan: Any, request: RerunRequest, timeout: float) -> None:
    """Add to ``plan`` whether the code the branch runs (``--set agent=``'s candidate, else ``--agent``)
    loads in the sandbox image (runledger.sandbox.plan.check_image: ``Refusal.IMAGE``). Starts one
    sandbox, loads the agent there and removes it."""
    from runledger.sandbox.containers import SandboxPolicy, SandboxPool
    from runledger.sandbox.plan import check_image

    try:
        docker = docker_client()
        pool = SandboxPool(docker, SandboxPolicy(image=current_image(docker), timeout_s=timeout), size=0)
    except LedgerError as exc:  # no engine or no image here: the plan says what it could not check
        print(f"runledger: not checked whether the agent loads in the sandbox image: {exc}", file=sys.stderr)
        return
    try:
        await check_image(plan, request, pool)
    finally:
        await pool.close()


def _check_samples(args: argparse.Namespace) -> None:
    """``--samples N`` (N >= 1) and ``--min-fix-rate R`` (0 < R <= 1, only with samples): runledger.sandbox.samples."""
    if args.samples is not None and args.samples < 1:
        raise ConfigurationError(f"--samples takes the number of re-drives per run (1 or more), got {args.samples}")
    if args.min_fix_rate is not None:
        if not 0.0 < args.min_fix_rate <= 1.0:
            raise ConfigurationError(f"--min-fix-rate is a share of samples in (0, 1], got {args.min_fix_rate:g}")
        if not args.samples or args.samples < 2:
            raise ConfigurationError("--min-fix-rate judges a fix rate: give --samples N (2 or more) with it")
    if args.cache_responses and (args.samples or 1) > 1:
        raise ConfigurationError("--cache-responses would answer every sample alike: samples must draw fresh from "
                                 "the model (leave one of --samples and --cache-responses out)")  # fmt: skip


def cmd_rerun(args: argparse.Namespace) -> int:
    require_extra("sandbox", "`runledger rerun`")
    from runledger.log.client import connect
    from runledger.ops.trace import render_run
    from runledger.protect.loading import load_run
    from runledger.record.fold import fold
    from runledger.sandbox.containers import SandboxPolicy, SandboxPool
    from runledger.sandbox.rerun import Rerunner
    from runledger.sandbox.worker import submit

    if args.failure_class:  # a sweep over the failed runs of one class of failure (`runledger failures`)
        from runledger.projections.failures import class_condition

        condition = class_condition(args.failure_class)
        args.where = f"{condition} AND ({args.where})" if args.where else condition
    if args.plan and args.where:  # a sweep has no plan: it would queue the re-runs --plan promises not to
        raise ConfigurationError("--plan shows the plan of one run's re-run: name a RUN instead of --where")
    if args.json and not (args.plan or args.where):
        raise ConfigurationError("--json goes with --plan (the plan as JSON) or --where (the sweep's report)")
    if not args.where and (args.junit or args.expect or args.prices or args.allow_still_failing or args.samples
                           or args.cache_responses):  # fmt: skip
        raise ConfigurationError("--junit, --expect, --prices, --allow-still-failing, --samples and --cache-responses "
                                 "go with a sweep (--where SQL)")  # fmt: skip
    _check_samples(args)
    if args.where:
        if args.run:
            raise ConfigurationError("give either a RUN or --where, not both")
        return cmd_sweep(args)
    if not args.run:
        raise ConfigurationError("name the run to re-run, or select many with --where SQL")
    if args.plan:
        return _plan(args)
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
        return of_status(cp.status, cp.failure_reason)

    return with_client(args, queued)


def cmd_resume_branch(args: argparse.Namespace) -> int:
    """``runledger resume BRANCH``: the core's ``resume`` hands a branch here (``resume_run`` refuses
    to drive one on the host). It is re-driven in a sandbox, here, under the request that opened it
    (its mode, its ``--allow-effects`` or not); ``--agent`` only names the code of a branch recorded
    before branches held their request."""
    require_extra("sandbox", "`runledger resume` of a branch")
    from runledger.log.client import connect
    from runledger.sandbox.containers import SandboxPolicy, SandboxPool
    from runledger.sandbox.rerun import Rerunner
    from runledger.sandbox.resume import branch_to_resume

    if getattr(args, "retry", False) or getattr(args, "accept_version", None):
        raise ConfigurationError(
            f"run {args.run} is a branch: it is neither retried nor continued with other code; re-run its parent"
        )

    async def local() -> int:
        client = await connect(nats_url(args))
        try:
            request, done = await branch_to_resume(client, args.run, args.agent)
            if done is not None:
                print(f"branch {done.run_id} is {done.status}: nothing to do"
                      + (f" (pending approvals: {', '.join(done.pending)})" if done.pending else ""))  # fmt: skip
                return of_status(done.status, done.reason)
            print(f"branch {args.run} is re-driven in a sandbox ({request.mode}"
                  + (", effects allowed by its re-run" if request.allow_effects else ", effects stubbed") + ")",
                  file=sys.stderr, flush=True)  # fmt: skip
            docker = docker_client()
            policy = SandboxPolicy(image=current_image(docker), timeout_s=request.timeout_s)
            pool = SandboxPool(docker, policy, size=0)
            try:
                result = await Rerunner(client, pool).rerun(request)
            finally:
                await pool.close()
            return _print(result)
        finally:
            await client.close()

    return run_async(local())


def _print_result(request: RerunRequest, outcome: RerunResult | Exception) -> None:
    """One line per re-run handled: its branch's outcome on stdout, an error on stderr."""
    if isinstance(outcome, Exception):
        print(f"re-run {request.request_id}: error: {outcome}", file=sys.stderr)
    else:
        note = "; ".join(n for n in (outcome.reason or "", outcome.time_limit_note) if n)
        print(f"re-run {request.request_id}: branch {outcome.run_id} {outcome.status}"
              + (f" ({note})" if note else ""), flush=True)  # fmt: skip


def _remove_own_sandboxes(docker: Any) -> int:
    """Remove every sandbox this process owns on the engine, whichever pool made it. Returns how many."""
    from runledger.sandbox.containers import LABEL, OWNER

    removed = 0
    for container in docker.api.containers(all=True, filters={"label": f"{LABEL}.owner={OWNER}"}):
        with contextlib.suppress(Exception):  # docker-py raises several types; gone already is fine
            docker.api.remove_container(container["Id"], force=True)
            removed += 1
    return removed


def _arm_watchdog(docker: Any, after_s: float, finished: threading.Event) -> None:
    """Bound the exit after a stop signal: if the process still runs ``after_s`` later (a host tool
    wedged in a thread, which nothing can cancel and which the interpreter waits for at exit, or
    an event loop blocked by agent code), remove this process's sandboxes and exit at once."""

    def fire() -> None:
        code = 0 if finished.is_set() else 1  # finished: only a wedged thread held the exit
        with contextlib.suppress(Exception):
            _remove_own_sandboxes(docker)
        print(f"worker: still running {after_s:g}s after the stop signal: exiting now", file=sys.stderr, flush=True)
        os._exit(code)

    timer = threading.Timer(after_s, fire)
    timer.daemon = True
    timer.start()


def cmd_worker(args: argparse.Namespace) -> int:
    require_extra("sandbox", "`runledger worker`")
    import asyncio

    from runledger.log.client import connect
    from runledger.sandbox.containers import SandboxPolicy
    from runledger.sandbox.worker import run_worker

    if not logging.getLogger().handlers:  # the worker's own warnings (retries, dead letters) reach stderr
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
    docker = docker_client()
    signalled, finished = threading.Event(), threading.Event()

    async def serve() -> int:
        cpu = {
            name: value
            for name, value in (("max_host_cpu_s", args.host_cpu), ("max_request_cpu_s", args.request_cpu))
            if value is not None
        }
        policy = SandboxPolicy(image=args.image or current_image(docker), timeout_s=args.timeout, **cpu)  # fmt: skip
        client = await connect(nats_url(args))
        print(f"worker: serving re-runs from {client.url} with {policy.image} (time limit {policy.timeout_s:g}s, "
              f"host CPU {policy.max_host_cpu_s:g}s a re-run and {policy.max_request_cpu_s:g}s a request, "
              f"{args.max_attempts} attempts a request)", flush=True)  # fmt: skip
        # SIGTERM (docker stop, compose down) and Ctrl-C: take no new request, give the re-runs in
        # hand --drain seconds, then interrupt them (left for redelivery) and remove the sandboxes.
        # A Python-level handler, not the loop's: it runs even while agent code blocks the loop.
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal(signum: int, frame: object) -> None:
            if not signalled.is_set():
                signalled.set()
                _arm_watchdog(docker, args.drain + 30.0, finished)
            with contextlib.suppress(RuntimeError):  # the loop already closed: the worker is exiting
                loop.call_soon_threadsafe(stop.set)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        try:
            await run_worker(client, docker, policy=policy, concurrency=args.concurrency, pool_size=args.pool,
                             max_requests=args.max_requests, ack_wait_s=args.ack_wait, stop=stop,
                             on_result=_print_result, max_attempts=args.max_attempts,
                             retry_delay_s=args.retry_delay, drain_s=args.drain)  # fmt: skip
        finally:
            await client.close()
            finished.set()
        return 0

    code = run_async(serve())
    # A creation interrupted by the stop finishes in its thread after its pool was closed.
    _remove_own_sandboxes(docker)
    return code


def cmd_reruns(args: argparse.Namespace) -> int:
    """Branch runs of queued re-runs (``br-<request id>``), dead-lettered ones marked."""
    from runledger.ops.trace import list_runs

    runs = with_client(args, lambda c: list_runs(c, status=args.status))
    branches = [r for r in runs if r.parent and r.run_id.startswith("br-")]
    if args.dead:
        branches = [r for r in branches if r.error and DEAD_LETTERED in r.error]
    if args.json:
        rows = [{"request_id": r.run_id[3:], "dead_lettered": bool(r.error and DEAD_LETTERED in r.error),
                 **r.to_dict()} for r in branches]  # fmt: skip
        print(json.dumps(rows, indent=2, sort_keys=True, ensure_ascii=False, default=str))
        return 0
    if not branches:
        print("no dead-lettered re-runs" if args.dead else "no queued re-run has started yet")
        return 0
    print(f"{'request':<27} {'parent':<27} {'status':<10} {'started':<27} note")
    for r in branches:
        dead = bool(r.error and DEAD_LETTERED in r.error)
        note = ("DEAD LETTER: " if dead else "") + (r.error or "")
        print(f"{r.run_id[3:]:<27} {r.parent or '':<27} {r.status:<10} {r.started_at or '':<27} {note}")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from runledger.sandbox.diff import diff, render

    result = with_client(args, lambda c: diff(c, args.run, args.branch))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True, ensure_ascii=False, default=str))
    else:
        print(render(result))
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add the sandbox's sub-commands to ``sub``, after the core's, in the order ``runledger --help`` lists
    them: each ``_add_NAME`` adds the parser of ``runledger NAME``."""
    for add in (_add_resume_branch, _add_sandbox, _add_rerun, _add_reruns, _add_worker, _add_diff):
        add(sub, common)


def _add_resume_branch(sub: Any, common: argparse.ArgumentParser) -> None:
    """The core's ``runledger resume`` (registered first) resumes a branch run here, in a sandbox,
    never on the host."""
    resume = sub.choices.get("resume")
    if resume is not None:
        resume.set_defaults(resume_branch=cmd_resume_branch)


def _add_sandbox(sub: Any, common: argparse.ArgumentParser) -> None:
    sandbox = sub.add_parser("sandbox", help="the sandbox image").add_subparsers(metavar="ACTION")
    p = sandbox.add_parser("build", help="build the sandbox image (offline when no registry is reachable)")
    p.add_argument("--base", help="base image with python3 (default: python:3.11-slim, else built offline)")
    p.add_argument(
        "--extra",
        action="append",
        metavar="NAME",
        help="add the packages of an extra the agents import (langgraph); without it, the extras of the current "
        "image are kept",
    )
    p.add_argument("--no-extras", action="store_true", help="build the image without the extras the current one holds")
    p.set_defaults(func=cmd_build)


def _add_rerun(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("rerun", parents=[common], help="re-run a recorded run in a sandbox")
    p.add_argument("run", nargs="?")
    p.add_argument("--where", metavar="SQL", help="sweep: re-run every recorded run matching this condition on runs")
    p.add_argument("--class", dest="failure_class", metavar="ID", help="sweep: the failed runs of this class of "
                   "failure (`runledger failures`); with --where, those of them that match it too")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=2, help="sweep: re-runs in flight")
    p.add_argument("--pool", type=int, default=2, help="sweep: warm sandboxes kept ready")
    p.add_argument("--expect", metavar="MODULE:FN", help="sweep: judge each branch's decision at the fork with "
                   "FN(fork) -> 'pass' | 'fail' | 'improved' (runledger.sandbox.gate)")  # fmt: skip
    p.add_argument("--junit", metavar="FILE", help="sweep: write the verdicts as JUnit XML (one test case per run)")
    p.add_argument("--allow-still-failing", action="store_true",
                   help="sweep: keep the gate open for runs that had failed and still fail (by default a failure "
                   "the change does not fix closes it)")  # fmt: skip
    p.add_argument("--samples", type=int, metavar="N", help="sweep: re-drive each run N times with the live model "
                   "(a counterfactual's baseline N times unchanged too) and report a fix rate per run (fixed 3/5) "
                   "and whether the run is flaky (runledger.sandbox.samples)")  # fmt: skip
    p.add_argument("--min-fix-rate", type=float, metavar="RATE", help="sweep with --samples: a run counts as "
                   "fixed when this share of its samples fix it (default 1.0); below it, it still fails")  # fmt: skip
    p.add_argument("--cache-responses", action="store_true", help="sweep: answer identical live model requests "
                   "once (kept in memory for this sweep; not with --samples): the report counts calls made and "
                   "served (runledger.sandbox.responses)")  # fmt: skip
    p.add_argument("--prices", metavar="FILE", help="sweep: price the branches with this JSON table (default: the "
                   "projection's model_prices)")  # fmt: skip
    p.add_argument("--agent", required=True, metavar="MODULE:ATTR",
                   help="the agent that recorded the run, as its code is now: edited since, the re-run is a "
                   "counterfactual of the agent's code (stated: agent code changed: A -> B)")  # fmt: skip
    p.add_argument("--mode", required=True, choices=["replay", "redrive", "live", "counterfactual"])
    p.add_argument("--at-step", type=int, help="the fork step k (default: the decision, the last model call at or "
                   "before the step the run failed at, else its last step)")  # fmt: skip
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="counterfactual change: model=MODULE:ATTR, prompt=TEXT, agent=MODULE:ATTR or "
                   "tools=MODULE:ATTR; with --where, two or more are the candidates of a matrix (each run "
                   "re-driven once per candidate)")  # fmt: skip
    p.add_argument("--base-mode", choices=["redrive", "live"], default="redrive", help="for counterfactual")
    p.add_argument("--allow-effects", action="store_true", help="live mode: let new effects really happen")
    p.add_argument("--live-tool", action="append", metavar="NAME", help="live mode: only these read tools run live")
    p.add_argument("--timeout", type=float, default=60.0, help="wall-clock limit of the re-run (s)")
    p.add_argument("--local", action="store_true", help="run inline instead of queueing for a worker")
    p.add_argument("--wait", action="store_true", help="queued: wait for the branch to finish")
    p.add_argument("--plan", action="store_true", help="print what each step would be (record, live, stub, "
                   "refused) and queue nothing")  # fmt: skip
    p.add_argument("--json", action="store_true",
                   help="with --plan: the plan as JSON; with --where: the sweep's report")  # fmt: skip
    p.set_defaults(func=cmd_rerun)


def _add_reruns(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("reruns", parents=[common], help="list the branch runs of queued re-runs, dead letters marked")
    p.add_argument("--dead", action="store_true", help="only re-runs the workers gave up on (dead-lettered)")
    p.add_argument("--status", choices=["running", "suspended", "completed", "failed"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_reruns)


def _add_worker(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("worker", parents=[common], help="execute queued re-runs")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--pool", type=int, default=2, help="warm sandboxes kept ready")
    p.add_argument("--image", help="sandbox image (default: the last one built)")
    p.add_argument(
        "--timeout", type=float, default=60.0,
        help="wall-clock limit of each re-run (s); a request asking for more is capped at it",
    )  # fmt: skip
    p.add_argument(
        "--host-cpu", type=float, metavar="SECONDS",
        help="host CPU the broker may spend for one re-run's guest (parsing, checks, recording, host tools); "
        "past it the branch fails with the reason (default: SandboxPolicy.max_host_cpu_s, 10)",
    )  # fmt: skip
    p.add_argument(
        "--request-cpu", type=float, metavar="SECONDS",
        help="host CPU the broker may spend for one request of a guest; past it the branch fails "
        "(default: SandboxPolicy.max_request_cpu_s, 5)",
    )  # fmt: skip
    p.add_argument(
        "--max-attempts", type=int, default=3,
        help="deliveries a request may fail its worker (an unexpected error, a worker that died) before "
        "it is dead-lettered: its branch fails with the reason",
    )  # fmt: skip
    p.add_argument(
        "--retry-delay", type=float, default=2.0,
        help="seconds before a request that failed its worker is tried again (times its delivery count)",
    )  # fmt: skip
    p.add_argument(
        "--drain", type=float, default=5.0,
        help="on SIGTERM/Ctrl-C: seconds the re-runs in hand get to finish before they are interrupted "
        "(killed, left for redelivery)",
    )  # fmt: skip
    p.add_argument("--max-requests", type=int, help="exit after this many requests")
    p.add_argument(
        "--ack-wait",
        type=float,
        default=30.0,
        help="seconds without progress before a request is redelivered to another worker",
    )
    p.set_defaults(func=cmd_worker)


def _add_diff(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("diff", parents=[common], help="compare a branch with its parent from the fork")
    p.add_argument("run")
    p.add_argument("branch")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_diff)
