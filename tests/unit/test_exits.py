"""The exit codes of ``runledger run``, ``resume`` and ``rerun`` (runledger.cli.exits): each code of the
table, through ``main``, on the in-memory ledger (runledger.log.memory) or against a port where no
server listens. The gate's and the matrix's codes are in tests/unit/test_gate_exits.py."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

import runledger.cli.connect
from runledger.cli.app import main
from runledger.cli.exits import REFUSALS, Exit, of_error, of_status
from runledger.errors import (
    ChainError,
    ConfigurationError,
    ConnectionFailedError,
    ModelError,
    PermissionDeniedError,
    VersionMismatchError,
)
from runledger.log.memory import MEMORY_URL, MemoryLedger
from runledger.record.budgets import Budgets
from runledger.sdk.agent import AgentSpec
from runledger.sdk.models import ScriptedModel

HERE = __name__  # the agents below are loaded by name, as `--agent MODULE:ATTR`


async def _completes(run: Any) -> Any:
    return {"done": run.input}


async def _fails(run: Any) -> Any:
    raise RuntimeError("the agent broke")


async def _waits(run: Any) -> Any:
    await run.approval("refund", {"order": "o-1"})
    return "refunded"


async def _talks(run: Any) -> Any:
    for _ in range(3):
        await run.model([{"role": "user", "content": "more"}])
    return "talked"


def _rate_limited(messages: list[dict[str, Any]]) -> str:
    raise ModelError("HTTP 429: slow down", retryable=True, status=429)


def _spec(fn: Any, version: str = "1.0.0", **options: Any) -> AgentSpec:
    return AgentSpec("exits", fn, options.pop("model", ScriptedModel(lambda m: "ok")), agent_version=version, **options)


completes = _spec(_completes)
fails = _spec(_fails)
waits = _spec(_waits)
waits_v2 = _spec(_waits, version="2.0.0")
over_budget = _spec(_talks, budgets=Budgets(turns=1))
rate_limited = _spec(_talks, model=ScriptedModel(_rate_limited))


@pytest.fixture
def ledger(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryLedger]:
    """Every command of this test reaches one in-memory ledger (``--nats memory://``)."""
    memory = MemoryLedger()

    async def connect(url: str, **options: Any) -> Any:
        assert url == MEMORY_URL, url
        return await memory.connect()

    monkeypatch.setattr(runledger.cli.connect, "connect", connect)
    yield memory


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([*argv, "--nats", MEMORY_URL])
    out, err = capsys.readouterr()
    return code, out, err


def run(capsys: pytest.CaptureFixture[str], agent: str, run_id: str) -> tuple[int, str, str]:
    return cli(capsys, "run", "--agent", f"{HERE}:{agent}", "--run-id", run_id, "--input", '{"n": 1}')


def resume(capsys: pytest.CaptureFixture[str], agent: str, run_id: str, *more: str) -> tuple[int, str, str]:
    return cli(capsys, "resume", run_id, "--agent", f"{HERE}:{agent}", *more)


def test_the_table_keeps_the_gates_numbers_and_argparses() -> None:
    # The gate's codes predate the table (README, docs/sandbox.md); argparse exits 2 by itself.
    assert (Exit.OK, Exit.FAILED, Exit.USAGE, Exit.NOT_RERUN, Exit.ERROR) == (0, 1, 2, 3, 4)
    assert len(set(Exit)) == len(Exit.__members__)  # no two names for one code
    assert {Exit.SUSPENDED, Exit.REFUSED}.isdisjoint({0, 1, 2, 3, 4, 130})


def test_a_status_and_an_error_map_to_their_code() -> None:
    assert [of_status(s) for s in ("completed", "failed", "suspended", "running")] == [0, 1, 5, 4]
    assert of_error(VersionMismatchError("r", {"agent_version": "1"}, {"agent_version": "2"})) == Exit.REFUSED
    try:
        raise ConfigurationError("approving was refused: it is an operator's decision") from PermissionDeniedError(
            "ledger.run.a.r.o", "the analyst credentials", "use the operator's"
        )
    except ConfigurationError as exc:
        assert of_error(exc) == Exit.REFUSED  # raised from a refusal: still one
    assert of_error(ConnectionFailedError("nats://x:1", "refused")) == Exit.ERROR
    assert of_error(ConfigurationError("bad --input")) == Exit.ERROR
    assert of_error(ChainError("r", 3, 7, "broken")) == Exit.ERROR
    tagged = ConfigurationError("a re-run refused by its rule")
    tagged.refusal = "version"  # type: ignore[attr-defined]  # as runledger.sandbox.errors.tagged marks one
    assert of_error(tagged) == Exit.REFUSED
    assert all(issubclass(cls, Exception) for cls in REFUSALS)


def test_a_completed_run_exits_0_and_so_does_its_resume(ledger: MemoryLedger, capsys: Any) -> None:
    code, out, _ = run(capsys, "completes", "ok-1")
    assert code == Exit.OK and "run ok-1: completed" in out
    code, out, _ = resume(capsys, "completes", "ok-1")
    assert code == Exit.OK and "run ok-1 is completed: nothing to do" in out


def test_a_failed_run_exits_1_and_so_does_its_resume(ledger: MemoryLedger, capsys: Any) -> None:
    code, out, _ = run(capsys, "fails", "bad-1")
    assert code == Exit.FAILED and "run bad-1: failed" in out and "the agent broke" in out
    code, out, _ = resume(capsys, "fails", "bad-1")
    assert code == Exit.FAILED and "run bad-1 is failed: nothing to do" in out


def test_a_run_failed_on_a_retryable_error_is_still_failed_when_resumed_without_retry(
    ledger: MemoryLedger, capsys: Any
) -> None:
    code, out, _ = run(capsys, "rate_limited", "429-1")
    assert code == Exit.FAILED, out
    # Before: 0 with the hint, so a script took the run for done.
    code, out, _ = resume(capsys, "rate_limited", "429-1")
    assert code == Exit.FAILED and "nothing was run" in out and "--retry --by NAME" in out


def test_a_run_waiting_for_an_approval_exits_5_run_and_resume(ledger: MemoryLedger, capsys: Any) -> None:
    code, out, _ = run(capsys, "waits", "wait-1")
    assert code == Exit.SUSPENDED and "run wait-1: suspended (approval)" in out
    # Before: 0, as for a completed run; a script could not tell done from waiting on a human.
    code, out, _ = resume(capsys, "waits", "wait-1")
    assert code == Exit.SUSPENDED and "nothing to do (pending approvals:" in out


def test_a_run_out_of_budget_exits_5_until_a_grant_lets_it_complete(ledger: MemoryLedger, capsys: Any) -> None:
    # Recorded as failed (budget_exhausted), but it waits on a human: a grant reopens it.
    code, out, _ = run(capsys, "over_budget", "budget-1")
    assert code == Exit.SUSPENDED and "run budget-1: failed (budget_exhausted)" in out, out
    assert "runledger budget grant budget-1" in out
    code, out, _ = resume(capsys, "over_budget", "budget-1")
    assert code == Exit.SUSPENDED and "nothing to do" in out, out
    assert cli(capsys, "budget", "grant", "budget-1", "--turns", "5", "--by", "ann")[0] == Exit.OK
    code, out, _ = resume(capsys, "over_budget", "budget-1")
    assert code == Exit.OK and "run budget-1: completed" in out, out


def test_a_resume_with_another_version_is_refused_with_what_to_do(ledger: MemoryLedger, capsys: Any) -> None:
    assert run(capsys, "waits", "ver-1")[0] == Exit.SUSPENDED
    code, out, err = resume(capsys, "waits_v2", "ver-1")
    assert code == Exit.REFUSED and out == ""
    assert "recorded with a different version tuple; refusing to resume" in err
    assert "--accept-version 2.0.0 --by NAME" in err  # what to do
    # Accepting a version the code does not have is an option that cannot be used: the message says which.
    code, _, err = resume(capsys, "waits_v2", "ver-1", "--accept-version", "3.0.0", "--by", "ann")
    assert code == Exit.ERROR and "accept the version you are resuming with" in err


def test_a_retry_of_a_run_that_did_not_fail_retryably_is_an_unusable_option(ledger: MemoryLedger, capsys: Any) -> None:
    assert run(capsys, "waits", "retry-1")[0] == Exit.SUSPENDED
    code, _, err = resume(capsys, "waits", "retry-1", "--retry", "--by", "ann")
    assert code == Exit.ERROR
    assert "--retry continues only a run that failed on a retryable error" in err and "fork a branch" in err


def test_a_command_that_cannot_reach_its_server_exits_4(capsys: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free, and nobody listens on it once closed
    url = f"nats://127.0.0.1:{port}"
    for argv in (["run", "--agent", f"{HERE}:completes"], ["resume", "r-1", "--agent", f"{HERE}:completes"]):
        capsys.readouterr()
        code = main([*argv, "--nats", url])
        err = capsys.readouterr().err
        assert code == Exit.ERROR and f"no NATS server reachable at {url}" in err, (argv, err)


def test_an_unusable_option_and_an_unexpected_error_exit_4(
    ledger: MemoryLedger, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = cli(capsys, "run", "--agent", f"{HERE}:completes", "--input", "{not json")
    assert code == Exit.ERROR and "--input is not valid JSON" in err

    async def broken(url: str, **options: Any) -> Any:
        raise RuntimeError("a bug, not a verdict")

    monkeypatch.setattr(runledger.cli.connect, "connect", broken)
    code, _, err = cli(capsys, "run", "--agent", f"{HERE}:completes")
    # Before: the traceback and Python's own 1, which reads as a failed run.
    assert code == Exit.ERROR and "RuntimeError: a bug, not a verdict" in err and "Traceback" in err


def test_a_command_line_that_does_not_parse_exits_2(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["resume", "--agent", f"{HERE}:completes"])  # no RUN
    assert exited.value.code == Exit.USAGE
    assert main([]) == Exit.USAGE  # no command: the help


def test_show_and_verify_keep_their_codes(ledger: MemoryLedger, capsys: Any) -> None:
    run(capsys, "completes", "shown-1")
    code, out, _ = cli(capsys, "verify", "shown-1", "--json")
    assert code == Exit.OK and json.loads(out)[0]["ok"] is True
    code, _, err = cli(capsys, "show", "NOSUCHRUN")
    assert code == Exit.ERROR and "no run 'NOSUCHRUN'" in err
