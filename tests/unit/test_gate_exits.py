"""The exit codes of the gate and the matrix (``runledger rerun --where ...``) and of ``rerun --plan``,
through ``main`` (runledger.cli.exits): without a server or a Docker engine. The sweep that produces a
report is stubbed where a report is needed; the sweep's failures are real (no server listens)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

import runledger.cli.connect
import runledger.sandbox.cli as sandbox_cli
from runledger.cli.app import main
from runledger.cli.exits import Exit
from runledger.log.memory import MEMORY_URL, MemoryLedger
from runledger.sandbox.gate import Case, GateReport
from runledger.sandbox.matrix import MatrixReport

AGENT = "runledger.examples.refund_agent.agent:spec"
STRICT = "model=runledger.examples.refund_agent.agent:strict_model"
SWEEP = ["rerun", "--where", "status = 'completed'", "--agent", AGENT, "--mode", "counterfactual", "--set", STRICT]


def _free_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"nats://127.0.0.1:{s.getsockname()[1]}"  # nobody listens once the socket is closed


@pytest.fixture
def no_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep gets as far as the server without a Docker engine (an image name, no client)."""
    monkeypatch.setattr(sandbox_cli, "docker_client", lambda: object())
    monkeypatch.setattr(sandbox_cli, "current_image", lambda docker: "runledger-sandbox:test")


def _report(monkeypatch: pytest.MonkeyPatch, report: GateReport | MatrixReport) -> None:
    """The sweep returns ``report`` (as ``runledger.sandbox.sweep`` / ``matrix`` would have built it)."""
    monkeypatch.setattr(sandbox_cli, "_sweep", lambda args: report)


def _gate(*verdicts: str) -> GateReport:
    cases = [Case(f"r{n}", branch_run_id=f"b{n}", verdict=v) for n, v in enumerate(verdicts)]  # type: ignore[arg-type]
    return GateReport(mode="counterfactual", change={"model": "m"}, where="true", cases=cases)


def test_an_unreachable_server_is_a_failed_sweep_not_a_regression(
    no_docker: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # A `raise` in cmd_sweep's handler made this 1 and no test failed: CI read a broken sweep as a regression.
    url = _free_url()
    assert main([*SWEEP, "--nats", url]) == Exit.ERROR == 4
    assert f"no NATS server reachable at {url}" in capsys.readouterr().err
    assert main([*SWEEP, "--set", "prompt=p", "--nats", url, "--json"]) == Exit.ERROR  # the matrix too


@pytest.mark.parametrize(
    ("flags", "message", "code"),
    [
        (["--expect", "runledger.examples.refund_agent.checks:no_such_check"], "no_such_check", Exit.ERROR),
        (["--expect", "os:abort"], "os:abort", Exit.REFUSED),  # outside the allow-list of code: a rule refused it
        (["--prices", "/nonexistent/prices.json"], "prices.json", Exit.ERROR),
    ],
)
def test_a_sweep_that_cannot_start_exits_4_or_6(
    flags: list[str], message: str, code: Exit, no_docker: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: these were raised before the sweep's handler and exited 1, as a closed gate does.
    assert main([*SWEEP, *flags, "--nats", _free_url()]) == code
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("verdicts", "flags", "code", "gate"),
    [((), [], 0, "open"), (("pass", "improved"), [], 0, "open"), (("pass", "regressed"), [], 1, "closed"),
     (("fail",), [], 1, "closed"), (("pass", "error"), [], 3, "open"), (("error", "regressed"), [], 1, "closed"),
     # A failure the change does not fix closes the gate (before: exit 0, `gate: open (5 still_failing)`).
     (("pass", "improved", "still_failing"), [], 1, "closed"),
     (("pass", "improved", "still_failing"), ["--allow-still-failing"], 0, "open")],
)  # fmt: skip
def test_the_gate_exits_with_its_verdict(
    verdicts: tuple[str, ...], flags: list[str], code: int, gate: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    _report(monkeypatch, _gate(*verdicts))
    junit = tmp_path / "gate.xml"
    assert main([*SWEEP, "--json", "--junit", str(junit), *flags]) == code
    report = json.loads(capsys.readouterr().out)
    assert (report["exit_code"], report["gate"]) == (code, gate)
    assert junit.read_text().count("<testcase ") == len(verdicts)


def test_a_matrix_with_runs_not_re_run_exits_3(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    # Returning 0 here failed no test before: a matrix that could not re-run a run looked complete.
    candidates = [{"model": "a:m"}, {"model": "b:m"}]
    clean = MatrixReport(runs=["r0", "r1"], candidates=candidates, reports=[_gate("pass", "regressed"), _gate("pass")])
    assert clean.exit_code == Exit.OK  # a matrix explores: a regressed cell does not close it
    missing = MatrixReport(runs=["r0", "r1"], candidates=candidates, reports=[_gate("pass", "pass"), _gate("error")])
    assert missing.exit_code == Exit.NOT_RERUN == 3
    _report(monkeypatch, missing)
    assert main([*SWEEP, "--set", "model=b:m", "--json"]) == Exit.NOT_RERUN
    assert json.loads(capsys.readouterr().out)["exit_code"] == 3
    _report(monkeypatch, clean)
    assert main([*SWEEP, "--set", "model=b:m"]) == Exit.OK


def test_a_plan_the_rules_refuse_exits_6_and_says_why(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    memory = MemoryLedger()

    async def connect(url: str, **options: Any) -> Any:
        return await memory.connect()

    monkeypatch.setattr(runledger.cli.connect, "connect", connect)
    ok = "tests.unit.test_exits:completes"
    assert main(["run", "--agent", ok, "--run-id", "planned", "--nats", MEMORY_URL]) == Exit.OK
    capsys.readouterr()
    # --set without a counterfactual: refused by the re-run's rules (Refusal.CHANGE); before, exit 1 as a failure.
    code = main(["rerun", "planned", "--agent", ok, "--mode", "live", "--set", "prompt=p", "--plan", "--json",
                 "--nats", MEMORY_URL])  # fmt: skip
    plan = json.loads(capsys.readouterr().out)
    assert code == Exit.REFUSED and plan["ok"] is False and plan["refusals"], plan


def test_the_matrix_names_the_candidate_that_fixes_the_most_with_no_regression(capsys: Any) -> None:
    # Before: counts per candidate, no answer; a candidate that fixed as many but regressed looked as good.
    runs = ["r0", "r1", "r2"]
    candidates = [{"model": "eager:m"}, {"model": "mapping:m"}, {"prompt": "Answer briefly."}]
    reports = [_gate("improved", "improved", "regressed"), _gate("improved", "improved", "pass"),
               _gate("still_failing", "not_exercised", "pass")]  # fmt: skip
    report = MatrixReport(runs=runs, candidates=candidates, reports=reports)
    best = report.best()
    assert best.candidates == [1] and best.fixed == 2
    assert best.text == "fixes the most with no regression: model=mapping:m, 2 of 3 runs"
    assert report.render().splitlines()[-1] == best.text
    assert report.to_dict()["best"] == {"candidates": ["model=mapping:m"], "fixed": 2, "text": best.text}
    assert "not exercised 1" in report.render()
    none = MatrixReport(runs=runs, candidates=candidates[::2], reports=[reports[0], reports[2]])
    assert none.best().text == "no candidate fixes a run without a regression (1 of 2 regress some run)"
    tie = MatrixReport(runs=runs, candidates=[candidates[1], {"model": "other:m"}], reports=[reports[1]] * 2)
    assert tie.best().candidates == [0, 1] and "(tied: 2 candidates)" in tie.best().text
