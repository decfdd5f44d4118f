"""The ``ledger`` package's sub-commands of ``runledger``.

Registering them builds argparse parsers and nothing more: each command imports what it uses
(the NATS client, the event models, the fold, the SDK) inside its function, so ``runledger --help``
and a command that needs none of it do not pay for it (tests/unit/test_cli_imports.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runledger.cli.connect import with_client
from runledger.cli.exits import Exit, of_status
from runledger.cli.up import add_down, add_status, add_up
from runledger.errors import BranchOnHostError, ConfigurationError, LedgerError

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{what} is not valid JSON: {exc}") from exc


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str))


# -- schema ------------------------------------------------------------------------------------------------


def cmd_schema(args: argparse.Namespace) -> int:
    from runledger.record.events import json_schemas

    schemas = json_schemas()
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for type_, schema in schemas.items():
            (out / f"{type_}.schema.json").write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        print(f"wrote {len(schemas)} schemas to {out}")
    else:
        _print_json(schemas)
    return 0


# -- trace replay ------------------------------------------------------------------------------------------


def cmd_runs(args: argparse.Namespace) -> int:
    """The runs, recorded ones only unless ``--branches`` (each branch under its parent: ``with_branches``)."""
    from runledger.ops.trace import continue_command, list_runs, with_branches

    every = with_client(args, lambda c: list_runs(c, status=args.status, agent=args.agent))
    listed = with_branches(every, args.branches)
    if args.json:
        _print_json([r.to_dict() for r, _ in listed])
        return 0
    hidden = len(every) - len(listed)
    if not listed:
        print("no runs" + (" matching" if args.status or args.agent else " yet: try `runledger demo`")
              + (f" ({hidden} branches of re-runs: --branches lists them)" if hidden else ""))  # fmt: skip
        return 0
    print(f"{'run':<27} {'agent':<14} {'status':<10} {'steps':>5} {'tokens':>6}  {'started':<27} note")
    for r, depth in listed:
        note = r.error or ""
        if r.retryable:
            note = f"retryable: `runledger resume {r.run_id} --retry --by NAME`; " + note
        if r.pending_approvals:
            note = "awaiting approval " + ", ".join(r.pending_approvals)
        if r.status == "stalled":
            note = f"its process is gone (crashed?): {continue_command(r.run_id, r.labels)} continues it"
        if r.settled and r.status == "suspended":
            note = f"effect {', '.join(r.settled)} settled: {continue_command(r.run_id, r.labels)} continues"
        if r.in_doubt:
            note = "effect in doubt " + ", ".join(r.in_doubt)
        if r.thread is not None and r.thread != r.run_id:
            note = f"thread {json.dumps(r.thread)} " + note  # `runledger show` takes it too
        if r.parent:
            note = f"fork of {r.parent} " + note
        if r.child_of:
            note = f"child of {r.child_of} step {r.child_of_step} " + note
        if r.forgeries:
            note = f"FORGED: {r.forgeries} messages under its id are not its own (`runledger verify {r.run_id}`) {note}"
        name = ("  " * (depth - 1) + "└ " if depth else "") + r.run_id
        print(f"{name:<27} {r.agent:<14} {r.status:<10} {r.steps:>5} {r.tokens:>6}  {r.started_at or '':<27} {note}")
    if hidden:
        print(f"({hidden} branches of re-runs not listed: --branches lists each under its parent)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from runledger.ops.trace import child_tree, load_named_run, record_status, render_run
    from runledger.record.fold import fold

    async def show(client: LedgerClient) -> int:
        log = await load_named_run(client, args.run)  # a run id, or a thread id as its user wrote it
        cp = fold(log.records, check_chain=False)
        if cp.erased is not None:
            from runledger.protect.erasure import erased_log

            log = erased_log(log)  # what the erasure made unreadable reads as erased, not as ciphertext
            cp = fold(log.records, check_chain=False)
        if args.fetch:
            # Bodies stored by reference are fetched (hash-verified) only on request, and only
            # for the step asked for: a run may have read gigabytes.
            await _fetch_bodies(client, log, args.step)
        children = await child_tree(client, cp) if args.step is None else None  # child runs (run.child)
        if args.json:
            events = [r.event.model_dump(mode="json") | {"stream_seq": r.stream_seq} for r in log.records]
            if args.step is not None:
                events = [e for e in events if e["payload"].get("step") == args.step]
            status, fold_error = record_status(log, cp)  # "broken" as `runs` and the projection say
            _print_json(
                {
                    "run_id": cp.run_id,
                    "agent": cp.agent,
                    "status": status,
                    "fold_error": fold_error,
                    "version": cp.version,
                    "child_of": cp.child_of_run_id and {"run_id": cp.child_of_run_id, "step": cp.child_of_step},
                    "children": [c.to_dict() for c in children or []],
                    "spent": cp.spent,
                    "limits": cp.limits,
                    "events": events,
                    "quarantined": [
                        {
                            "stream_seq": q.stream_seq,
                            "subject": q.subject,
                            "reason": q.reason,
                            "raw": q.raw.decode("utf-8", "replace"),
                        }
                        for q in log.quarantined
                    ],
                    "unread": log.unread,
                }
            )
        else:
            print(render_run(log, cp, step=args.step, children=children))
        return 0

    return with_client(args, show)


async def _fetch_bodies(client: LedgerClient, log: Any, step: int | None) -> None:
    from runledger.protect.capture import client_opener
    from runledger.record.records import Recorded

    opener = client_opener(client)
    for i, rec in enumerate(log.records):
        if step is None or rec.event.step == step:
            log.records[i] = Recorded(await opener.open_event(rec.event, fetch=True), rec.stream_seq, rec.subject)


def cmd_verify(args: argparse.Namespace) -> int:
    from runledger.ops.verify import verify_runs

    results = with_client(args, lambda c: verify_runs(c, args.run, deep=args.deep))
    bad = [r for r in results if not r.ok]
    forged = [r for r in results if r.forged]
    if args.json:
        _print_json([r.to_dict() for r in results])
    else:
        for r in results:
            who = f"agent {r.agent}" if r.agent else "no agent"
            if r.ok:
                print(f"ok   {r.run_id}  {who}  {r.events} events, chain intact ({r.format_name})")
            else:
                print(
                    f"BAD  {r.run_id}  {who}  first bad event at stream seq {r.first_bad_stream_seq} "
                    f"(event seq {r.first_bad_seq}, {r.format_name}): {r.reason}"
                )
                for p in r.problems[1:5]:
                    print(f"       also {p}")
            # Not the run's (every reader leaves them out) but an alarm: someone wrote under its id.
            for f in r.forgeries[:5]:
                print(f"       FORGED stream seq {f.stream_seq} by {f.writer} on {f.subject}: {f.reason}")
            if len(r.forgeries) > 5:
                print(f"       ... {len(r.forgeries) - 5} more forgeries (--json lists all)")
            for subject, count in sorted(r.unread.items()):
                print(f"       FORGED? {count} messages on {subject}, another agent's subject under this run id, which "
                      "these credentials may not read: verify with an operator's or analyst's credentials")  # fmt: skip
        print(f"{len(results) - len(bad)} of {len(results)} runs verified"
              + (f"; FORGERIES under {len(forged)} of their ids" if forged else ""))  # fmt: skip
    return Exit.FAILED if bad else Exit.FORGED if forged else Exit.OK


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from runledger.protect.loading import load_run
    from runledger.record.fold import fold

    async def cp(client: LedgerClient) -> int:
        log = await load_run(client, args.run)
        checkpoint = fold(log.records, upto_step=args.at_step)
        c = checkpoint
        if args.json:
            _print_json(c.to_dict())
        else:
            print(f"checkpoint of {c.run_id} at step {c.last_step} (event seq {c.next_seq - 1})")
            print(f"status {c.status}; spent {c.spent}; limits {c.limits}")
            print(f"committed keys {c.committed_keys}; in doubt {c.in_doubt_keys}")
            print(f"pending approvals {sorted(c.pending_approvals)}; last stream seq {c.last_stream_seq}")
            print(f"{len(checkpoint.steps)} steps recorded; --json prints the whole checkpoint")
        return 0

    return with_client(args, cp)


# -- driving runs ------------------------------------------------------------------------------------------


def _print_result(result: Any) -> int:
    """Print how the drive ended; its exit code is the run's status (``exits.of_status``), also when
    there was nothing to do (a finished run resumed again, a run still waiting for an approval)."""
    if result.nothing_to_do:
        print(
            f"run {result.run_id} is {result.status}: nothing to do"
            + (f" (pending approvals: {', '.join(result.pending)})" if result.pending else "")
        )
        return of_status(result.status, result.reason)
    print(f"run {result.run_id}: {result.status}" + (f" ({result.reason})" if result.reason else ""))
    if result.error:
        print(result.error)
    if result.output is not None:
        print(json.dumps(result.output, ensure_ascii=False, sort_keys=True))
    return of_status(result.status, result.reason)


def cmd_run(args: argparse.Namespace) -> int:
    from runledger.sdk.agent import load_agent
    from runledger.sdk.lifecycle import start_run

    spec = load_agent(args.agent)
    payload = _json_arg(args.input, "--input")

    async def run(client: LedgerClient) -> tuple[Any, list[str]]:
        result = await start_run(client, spec, payload, run_id=args.run_id)
        return result, await _served_from_earlier(client, result.run_id, spec.name)

    result, served = with_client(args, run)
    code = _print_result(result)
    for line in served:
        print(line)
    return code


async def _served_from_earlier(client: LedgerClient, run_id: str, agent: str) -> list[str]:
    """A line for each effect of the run whose result was served from a key another run committed
    earlier (``effect.committed`` ``via: "record"``): nothing was done this time, and the output says so."""
    from runledger.errors import RunNotFoundError
    from runledger.protect.loading import load_run
    from runledger.sdk.effects import read_key

    try:
        log = await load_run(client, run_id, agent=agent, open_content=False)
    except RunNotFoundError:
        return []
    lines = []
    for rec in log.records:
        p = rec.event.payload
        if rec.event.type != "effect.committed" or p.get("via") != "record":
            continue
        state = await read_key(client, p["key"], agent)
        if state.run_id and state.run_id != run_id:
            lines.append(
                f"note: effect {p['key']!r} (step {p['step']}) was not done again: its key was committed by run "
                f"{state.run_id}, whose recorded result was served (`runledger effects show {p['key']}`)"
            )
    return lines


def cmd_resume(args: argparse.Namespace) -> int:
    from runledger.ops.trace import GRAPH_THREAD_LABEL, continue_command
    from runledger.sdk.agent import load_agent
    from runledger.sdk.lifecycle import RetryRequest, VersionAcceptance, resume_run

    labels = with_client(args, lambda c: _labels_of(c, args.run))
    if GRAPH_THREAD_LABEL in labels:
        # A thread's run is driven by its graph (RunledgerSaver): resume_run would call an agent
        # function from the top, which LangGraph's recovery from the latest checkpoint replaces.
        print(
            f"run {args.run} is LangGraph thread {json.dumps(labels[GRAPH_THREAD_LABEL])}: its graph drives it, so "
            f"`runledger resume` runs nothing. Continue it as LangGraph does: {continue_command(args.run, labels)}; "
            "the saver re-opens the run (fenced) and LangGraph goes on from the thread's latest checkpoint",
            file=sys.stderr,
        )
        return Exit.REFUSED
    if not args.agent:
        print(f"runledger resume: --agent MODULE:ATTR is required: the spec of the agent run {args.run} records",
              file=sys.stderr)  # fmt: skip
        return Exit.USAGE
    spec = load_agent(args.agent)
    if (args.accept_version or args.retry) and not args.by:
        raise ConfigurationError("--accept-version and --retry need --by NAME (who decides it; recorded in the run)")
    reason = args.reason or ""
    accept = VersionAcceptance(args.accept_version, by=args.by, reason=reason) if args.accept_version else None
    retry = RetryRequest(by=args.by, reason=reason) if args.retry else None
    try:
        result = with_client(args, lambda c: resume_run(c, spec, args.run, accept_version=accept, retry=retry))
    except BranchOnHostError:
        # A branch goes on only in a sandbox: the sandbox package's handler (runledger.sandbox.cli), if installed.
        resume_branch = getattr(args, "resume_branch", None)
        if resume_branch is None:
            raise
        return int(resume_branch(args))
    if result.nothing_to_do and result.status == "failed" and result.retryable:
        print(_retry_hint(result, args.agent))
        return Exit.FAILED  # still failed: going on is an operator's decision (--retry), not a plain resume
    code = _print_result(result)
    if result.nothing_to_do and result.status == "failed":  # a fix is tried on a branch, never on this run
        print(f"to try edited code on it, re-run it as a branch (a counterfactual of the agent's code): "
              f"`runledger rerun {result.run_id} --agent {args.agent} --mode live --local`")  # fmt: skip
    return code


async def _labels_of(client: LedgerClient, ref: str) -> dict[str, str]:
    """The ``run.started`` labels of the run ``ref`` names (its id, or a thread id as LangGraph's user
    wrote it); none when no run is found (the resume says so itself)."""
    from runledger.errors import RunNotFoundError
    from runledger.ops.trace import find_run, started_labels
    from runledger.protect.loading import load_run

    try:
        return started_labels(await load_run(client, ref, open_content=False))
    except (RunNotFoundError, ConfigurationError):
        try:
            return started_labels(await load_run(client, await find_run(client, ref), open_content=False))
        except RunNotFoundError:
            return {}


def _retry_hint(result: Any, agent: str) -> str:
    """What a plain ``resume`` of a run failed on a retryable error says: nothing ran, and the
    exact command that runs its failed step again (an operator's decision, recorded with --by)."""
    cause = f" ({result.error})" if result.error else f" ({result.reason})" if result.reason else ""
    return (
        f"run {result.run_id} failed on a retryable error{cause}: nothing was run. To run its failed step "
        f"again: `runledger resume {result.run_id} --agent {agent} --retry --by NAME --reason ...`"
    )


def cmd_approve(args: argparse.Namespace) -> int:
    from runledger.ops.decisions import approve

    with_client(
        args, lambda c: approve(c, args.run, args.request, by=args.by, approved=not args.deny, reason=args.reason or "")
    )
    print(
        f"{'denied' if args.deny else 'approved'} {args.request} on run {args.run}; "
        f"continue it with `runledger resume {args.run} --agent MODULE:ATTR`"
    )
    return 0


def cmd_erase(args: argparse.Namespace) -> int:
    from runledger.protect.erasure import erase_run

    by = args.by or os.environ.get("USER") or ""
    result = with_client(args, lambda c: erase_run(c, args.run, reason=args.reason, by=by))
    print(
        f"erased run {result.run_id}: key {result.kid} "
        f"{'destroyed' if result.keys_destroyed else 'already gone'}, {result.blobs_deleted} blob(s) deleted"
        + ("; run.erased recorded" if result.recorded else "; run.erased was already recorded")
    )
    for derived in result.lineage:
        print(
            f"  erased {derived.relation} run {derived.run_id} (derived from {derived.derived_from}): key "
            f"{'destroyed' if derived.keys_destroyed else 'already gone'}, {derived.blobs_deleted} blob(s) deleted"
        )
    print(
        "its content, and that of every branch and child run derived from it, is unreadable through every reader; "
        "structure stays queryable and `verify` still passes"
    )
    print("the next `runledger project` rewrites their rows; export Parquet again (files exported before keep theirs)")
    unsealed = result.plaintext_events + sum(d.plaintext_events for d in result.lineage)
    if unsealed:
        print(
            f"WARNING: {unsealed} event(s) of these runs were recorded unsealed (encrypt=False): "
            "their content stays in the stream until its retention window expires"
        )
    return 0


def cmd_effects_resolve(args: argparse.Namespace) -> int:
    from runledger.sdk.effects import resolve_key

    if args.committed == args.not_committed:
        raise ConfigurationError("say what happened: --committed or --not-committed")
    result = _json_arg(args.result, "--result")

    def lease(seconds: float, claim: Any, forced: bool) -> None:
        held = (
            f"effect {args.key}: attempt {claim.attempt} of run {claim.run_id} step {claim.step} holds its lease "
            f"for another {seconds:.1f}s (its process may be paused, not dead)"
        )
        print(held + ("; resolving now (--force, recorded)" if forced else "; waiting for it to expire (--force: now)"))
        sys.stdout.flush()

    async def resolve(client: LedgerClient) -> tuple[Any, str]:
        state = await resolve_key(
            client, args.key, committed=args.committed, by=args.by, reason=args.reason or "", result=result,
            force=args.force, on_lease=lease, agent=args.agent,
        )  # fmt: skip
        return state, await _after_resolution(client, state)

    state, next_step = with_client(args, resolve)
    print(
        f"effect {args.key} resolved as {'committed' if args.committed else 'not committed'} "
        f"(now {state.status}); {next_step}"
    )
    return 0


async def _after_resolution(client: LedgerClient, state: Any) -> str:
    """What to run after an in-doubt key of run ``state.run_id`` was resolved, by the run's status."""
    from runledger.errors import RunNotFoundError
    from runledger.ops.trace import GRAPH_THREAD_LABEL, continue_command, started_labels
    from runledger.protect.loading import load_run
    from runledger.record.fold import fold

    run_id = state.run_id or "?"
    try:
        log = await load_run(client, run_id, agent=state.agent or None, open_content=False)
    except RunNotFoundError:
        return f"resume run {run_id} to continue"
    cp = fold(log.records, check_chain=False)
    if cp.status == "completed":
        return f"run {run_id} has completed: nothing to resume"
    if cp.status == "failed":
        return (
            f"run {run_id} failed ({cp.failure_reason}), so a resume does not continue it; a later run that "
            f"claims {state.key!r} gets this outcome"
        )
    labels = started_labels(log)
    spec = "" if GRAPH_THREAD_LABEL in labels else f" (the spec of agent {cp.agent})"
    return f"continue run {run_id} with {continue_command(run_id, labels)}{spec}"


def cmd_effects_show(args: argparse.Namespace) -> int:
    from runledger.sdk.effects import read_key

    async def show(client: LedgerClient) -> dict[str, Any]:
        state = await read_key(client, args.key, args.agent)
        return await _key_view(client, {k: v for k, v in state.__dict__.items() if k not in ("last_hash",)})

    _print_json(with_client(args, show))
    return 0


async def _key_view(client: LedgerClient, shown: dict[str, Any]) -> dict[str, Any]:
    """A key's state as its reader may see it: result and error opened where these credentials can
    open them; what the erasure of the run that wrote them made unreadable reads as erased (with a
    ``note``: "committed, result erased"), what they only may not open stays sealed."""
    from runledger.log.reader import read_run
    from runledger.protect.capture import client_opener, is_placeholder
    from runledger.protect.erasure import erased_value
    from runledger.record.fold import fold

    opener = client_opener(client)
    if shown.get("result") is not None:
        shown["result"] = await opener.open_value(shown["result"], strict=False)
    error = shown.get("error")
    if isinstance(error, dict):
        error = dict(error)
        for name in ("message", "traceback"):
            if isinstance(error.get(name), str):
                error[name] = await opener.open_text(error[name], strict=False)
        shown["error"] = error
    sealed = is_placeholder(shown.get("result")) or (
        isinstance(error, dict) and any(map(is_placeholder, error.values()))
    )
    if sealed and shown.get("run_id"):
        try:
            # The run under the key's agent: the one subject an agent role may read.
            log = await read_run(client, shown["run_id"], agent=shown.get("agent") or None)
            erased = fold(log.records, check_chain=False).erased
        except LedgerError:  # not found, or not readable with these credentials: left as it reads
            erased = None
        if erased is not None:
            shown["result"], shown["error"] = erased_value(shown.get("result")), erased_value(error)
            what = "result" if shown.get("status") == "committed" else "content"
            shown["note"] = f"{shown.get('status')}, {what} erased (run {shown['run_id']} was erased)"
    return shown


def cmd_budget_grant(args: argparse.Namespace) -> int:
    from runledger.ops.decisions import grant_budget

    with_client(
        args,
        lambda c: grant_budget(
            c,
            args.run,
            by=args.by,
            turns=args.turns,
            tokens=args.tokens,
            seconds=args.seconds,
            reason=args.reason or "",
        ),
    )
    print(f"granted to run {args.run}; resume it to continue")
    return 0


def cmd_accept_version(args: argparse.Namespace) -> int:
    from runledger.ops.decisions import accept_version

    with_client(args, lambda c: accept_version(c, args.run, args.version, by=args.by, reason=args.reason or ""))
    print(f"run {args.run} may continue with version {args.version}: resume it with that code")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    from runledger.ops.decisions import retry_run

    event = with_client(args, lambda c: retry_run(c, args.run, by=args.by, reason=args.reason or ""))
    step = event.payload.get("step")
    print(
        f"run {args.run} may go on"
        + (f" from its failed step {step}" if step is not None else "")
        + f": `runledger resume {args.run} --agent MODULE:ATTR` runs it again (with the agent's credentials)"
    )
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add the ledger's sub-commands to ``sub``, in the order ``runledger --help`` lists them: each
    ``_add_NAME`` adds the parser of ``runledger NAME``."""
    for add in (
        add_up,
        add_down,
        add_status,
        _add_schema,
        _add_runs,
        _add_show,
        _add_verify,
        _add_checkpoint,
        _add_run,
        _add_resume,
        _add_approve,
        _add_erase,
        _add_effects,
        _add_budget,
        _add_accept_version,
        _add_retry,
    ):
        add(sub, common)


def _add_schema(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("schema", help="export the JSON Schema of every event type")
    p.add_argument("--out", help="write one file per event type into this directory")
    p.set_defaults(func=cmd_schema)


def _add_runs(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("runs", parents=[common], help="list runs")
    p.add_argument("--status", choices=["running", "stalled", "suspended", "completed", "failed", "broken"])
    p.add_argument("--agent")
    p.add_argument("--branches", action="store_true",
                   help="also the branches of re-runs, each under the run it was forked from")  # fmt: skip
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_runs)


def _add_show(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("show", parents=[common], help="trace replay: a run's timeline, executing nothing")
    p.add_argument("run")
    p.add_argument("--step", type=int, help="print one step's full inputs and outputs")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--fetch", action="store_true", help="fetch bodies stored by reference (with --step: that step's only)"
    )
    p.set_defaults(func=cmd_show)


def _add_verify(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("verify", parents=[common], help="check hash chains and sequences")
    p.add_argument("run", nargs="?")
    p.add_argument(
        "--deep",
        action="store_true",
        help="also check content: sealed values authenticate under the run's key, blobs match their hashes",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)


def _add_checkpoint(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("checkpoint", parents=[common], help="fold a run into its checkpoint")
    p.add_argument("run")
    p.add_argument("--at-step", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_checkpoint)


def _add_run(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("run", parents=[common], help="start a new run of an agent")
    p.add_argument("--agent", required=True, metavar="MODULE:ATTR")
    p.add_argument("--input", help="the run's input as JSON")
    p.add_argument("--run-id", help="use this run id (default: a new sortable id)")
    p.set_defaults(func=cmd_run)


def _add_resume(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("resume", parents=[common], help="resume a crashed or suspended run")
    p.add_argument("run")
    p.add_argument(
        "--agent", metavar="MODULE:ATTR",
        help="the agent's spec (required, but for a LangGraph thread's run: the command says how its graph goes on)",
    )  # fmt: skip
    p.add_argument(
        "--accept-version", metavar="V",
        help="continue with this agent_version (the code's) instead of the recorded one; recorded, with --by",
    )  # fmt: skip
    p.add_argument(
        "--retry", action="store_true",
        help="continue a run that failed on a retryable error (rate limit, timeout) from its failed step; recorded",
    )  # fmt: skip
    p.add_argument("--by", help="with --accept-version or --retry: who decides it")
    p.add_argument("--reason", help="with --accept-version or --retry: why")
    p.set_defaults(func=cmd_resume)


def _add_approve(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("approve", parents=[common], help="approve (or --deny) a pending approval")
    p.add_argument("run")
    p.add_argument("request")
    p.add_argument("--by", required=True)
    p.add_argument("--deny", action="store_true")
    p.add_argument("--reason")
    p.set_defaults(func=cmd_approve)


def _add_erase(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "erase",
        parents=[common],
        help="erase a run's content and that of its branches and child runs (destroy keys, delete blobs); "
        "structure stays",
    )
    p.add_argument("run")
    p.add_argument("--reason", required=True, help="why (recorded in the run)")
    p.add_argument("--by", help="who erases (default: $USER)")
    p.set_defaults(func=cmd_erase)


def _add_effects(sub: Any, common: argparse.ArgumentParser) -> None:
    effects = sub.add_parser("effects", help="inspect and resolve side effects").add_subparsers(metavar="ACTION")
    p = effects.add_parser("resolve", parents=[common], help="settle an in-doubt effect")
    p.add_argument("key")
    p.add_argument("--agent", help="whose key (keys are per agent; needed only when two agents use the key)")
    p.add_argument("--committed", action="store_true", help="the external system shows it happened")
    p.add_argument("--not-committed", action="store_true", help="it did not happen: the run may act again")
    p.add_argument("--result", help="the effect's result as JSON (with --committed)")
    p.add_argument("--by", required=True)
    p.add_argument("--reason")
    p.add_argument(
        "--force",
        action="store_true",
        help="resolve even while the claim's lease runs (its holder may be paused, not dead); recorded",
    )
    p.set_defaults(func=cmd_effects_resolve)
    p = effects.add_parser("show", parents=[common], help="the state of an idempotency key")
    p.add_argument("key")
    p.add_argument("--agent", help="whose key (keys are per agent; needed only when two agents use the key)")
    p.set_defaults(func=cmd_effects_show)


def _add_budget(sub: Any, common: argparse.ArgumentParser) -> None:
    budget = sub.add_parser("budget", help="budgets").add_subparsers(metavar="ACTION")
    p = budget.add_parser("grant", parents=[common], help="record extra budget for a run")
    p.add_argument("run")
    p.add_argument("--turns", type=int, default=0)
    p.add_argument("--tokens", type=int, default=0)
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--by", required=True)
    p.add_argument("--reason")
    p.set_defaults(func=cmd_budget_grant)


def _add_accept_version(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "accept-version", parents=[common], help="let a recorded run continue with new code (an operator's decision)"
    )
    p.add_argument("run")
    p.add_argument("version", help="the agent_version of the code that will resume the run")
    p.add_argument("--by", required=True)
    p.add_argument("--reason")
    p.set_defaults(func=cmd_accept_version)


def _add_retry(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "retry", parents=[common], help="let a run failed on a retryable error go on (an operator's decision)"
    )
    p.add_argument("run")
    p.add_argument("--by", required=True)
    p.add_argument("--reason")
    p.set_defaults(func=cmd_retry)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)
