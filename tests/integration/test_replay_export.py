"""``runledger export jsonl``: recorded runs from the log to a recording file that the in-process
replayer reads with no server; content it cannot open (an erased run, a key it cannot unwrap) is
refused with a message naming the run, never written half-readable."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path

import pytest

from runledger.cli import main
from runledger.errors import PayloadUnavailableError, WrongMasterKeyError
from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient
from runledger.protect.erasure import erase_run
from runledger.sdk.lifecycle import start_run
from runledger.testing import Replayer, read_recordings
from runledger.testing.export import export_runs
from tests import recorded_agents

pytestmark = pytest.mark.integration


async def _record(client: LedgerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    payments = PaymentsService(tmp_path / "payments.log").start()
    monkeypatch.setenv("REFUND_PAYMENTS_URL", payments.url)
    monkeypatch.setenv("REFUND_OUTBOX", str(tmp_path / "outbox"))
    try:
        return [(await start_run(client, spec(), ticket)).run_id for ticket in TICKETS]
    finally:
        payments.stop()


async def test_export_jsonl_writes_runs_the_replayer_replays_without_a_server(
    client: LedgerClient, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = await _record(client, tmp_path, monkeypatch)
    shop = (await start_run(client, recorded_agents.shop_spec(), {"basket": "b-9"})).run_id
    out = tmp_path / "recorded.jsonl"
    code = await asyncio.to_thread(main, ["export", "jsonl", *runs, shop, "--nats", nats_url, "--out", str(out)])
    assert code == 0
    recordings = read_recordings(out)
    assert [r.run_id for r in recordings] == [*runs, shop]
    # The content was sealed in the log (a run key under the master key): the file carries it opened.
    assert not any("$enc" in line for line in out.read_text().splitlines()[1:])
    await client.close()  # no server from here on: the replay needs none

    results = await Replayer(spec()).replay_all(recordings[:-1])
    assert all(r.ok for r in results), [str(r) for r in results if not r.ok]
    (shopped,) = await Replayer(recorded_agents.shop_spec()).replay_all(recordings[-1:])
    assert shopped.ok and shopped.steps == 9
    changed = await Replayer(recorded_agents.cautious_refund_spec()).replay_all(recordings[:1])
    assert changed[0].divergence is not None and changed[0].divergence.step == 3


async def test_export_jsonl_selects_runs_with_where_through_the_export_command(
    client: LedgerClient, nats_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--where`` is resolved by ``runledger export`` over the projection, the mode gets run ids."""
    shops = [(await start_run(client, recorded_agents.shop_spec(), {"basket": b})).run_id for b in ("b-1", "b-2")]
    common = ["--nats", nats_url, "--db", str(tmp_path / "ledger.duckdb")]
    out = tmp_path / "selected.jsonl"
    argv = ["export", "jsonl", *common, "--where", "agent = 'shop'", "--out", str(out)]
    assert await asyncio.to_thread(main, argv) == 0
    assert [r.run_id for r in read_recordings(out)] == shops
    assert "exported 2 runs" in capsys.readouterr().out

    argv = ["export", "jsonl", *common, "--where", "agent = 'nobody'", "--out", str(tmp_path / "none.jsonl")]
    assert await asyncio.to_thread(main, argv) == 0
    assert "no recorded run matches: agent = 'nobody'" in capsys.readouterr().out
    assert (
        await asyncio.to_thread(main, ["export", "jsonl", *common, shops[0], "--where", "true", "--out", "x"]) == 4
    )  # Exit.ERROR
    assert "give RUN ids or --where, not both" in capsys.readouterr().err


async def test_export_refuses_content_it_cannot_open(
    client: LedgerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second, *_ = await _record(client, tmp_path, monkeypatch)
    await erase_run(client, first, reason="a customer's request", by="dpo")
    out = tmp_path / "erased.jsonl"
    with pytest.raises(PayloadUnavailableError, match=f"run {first}.*erased by dpo"):
        await export_runs(client, [second, first], out)
    assert not out.exists()  # nothing half-written

    # Another master key: the run's key cannot be unwrapped, so its content stays sealed.
    monkeypatch.setenv("RUNLEDGER_MASTER_KEY", base64.b64encode(os.urandom(32)).decode())
    with pytest.raises(WrongMasterKeyError, match=f"{second}.*give it the master key the run was recorded with"):
        await export_runs(client, [second], out)
    assert not out.exists()


@pytest.mark.timeout(240)  # records 20 runs, then three pytest processes on a busy machine
def test_the_replay_benchmark_runs_quick(tmp_path: Path) -> None:
    from bench.replay import run_suite
    from bench.report import SuiteOptions

    section = run_suite(SuiteOptions(quick=True, plot_dir=tmp_path))
    assert section.tables[0].rows[0][0] == "pytest, runledger plugin only (wall)"
    assert section.data["summary"] == "20 passed" or section.data["summary"].startswith("20 passed in")
    assert section.goals[1].met, section.goals[1].detail  # the changed decision is named by its step
