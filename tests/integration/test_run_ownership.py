"""A run id is owned by the agent that claimed it first, written as the attacker acts (docs/data-protection.md,
"Who may write what"; runledger.log.subjects.fence_for, runledger.sdk.lifecycle.claim_run).

Agent ``alpha`` is the victim, agent ``beta`` the attacker, each logged in with its own credentials on a
server started as ``runledger up --secure`` starts it; beta publishes raw events (``js.publish``) on its
own subjects, where the server lets it write anything under any run id. The witnesses the attacked code
does not control: the payments service's own log (a service that ignores idempotency keys), the raw
stream, the DuckDB projection, the page's HTML.

- the squat of the report: beta's bare ``run.started`` first under an id makes alpha's start refused
  at once, naming beta, with nothing paid (it paid, and then read as beta's run);
- alpha's run first: beta's start on the taken id is refused (it ran), beta's raw events under it are
  forgeries of alpha's run that every reader names (show, runs, SQL, the page) and ``verify`` exits 7 for
  (it exited 0 and printed two runs, naming no agent);
- an agent's own credentials show and verify its own runs, and are refused another agent's (both failed
  with "these credentials may not read it").
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from runledger import AgentSpec, Run, ScriptedModel
from runledger.cli import main
from runledger.cli.exits import Exit
from runledger.errors import RunIdTakenError
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient, connect
from runledger.log.reader import read_raw
from runledger.log.server import ServerState
from runledger.log.subjects import run_subject
from runledger.projections.projector import Projector
from runledger.projections.store import ProjectionStore
from runledger.record.canonical import CHAIN_FORMAT
from runledger.record.events import GENESIS, Payload, RunCompleted, RunStarted, make_event
from runledger.sdk.lifecycle import start_run
from tests.conftest import eventually
from tests.integration.test_ui import ui_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

VERSION = {"agent_version": "v1", "model": "m", "prompt_hash": "p", "tool_schema_hashes": {}}
CALLED: list[str] = []  # the agent functions the CLI started in this process: a refused start runs none


async def _marks(run: Run) -> Any:
    CALLED.append(run.run_id)
    return "done"


beta_spec = AgentSpec("beta", _marks, ScriptedModel([]), agent_version="v1")  # `runledger run --agent` loads it


async def login(state: ServerState, user: str) -> LedgerClient:
    return await connect(state.url, user_credentials=str(Path(state.creds_dir) / f"{user}.json"))


@pytest.fixture
async def clients(secure_server: ServerState) -> AsyncIterator[dict[str, LedgerClient]]:
    out = {"admin": await login(secure_server, "admin")}  # creates the streams
    try:
        for user in ("agent-alpha", "agent-beta", "operator"):
            out[user] = await login(secure_server, user)
        yield out
    finally:
        for c in out.values():
            await c.close()


@pytest.fixture
def payments(tmp_path: Path) -> Iterator[PaymentsService]:
    service = PaymentsService(tmp_path / "payments.log").start()
    try:
        yield service
    finally:
        service.stop()


def refunds(service: PaymentsService, order: str) -> list[dict[str, Any]]:
    """The witness: refunds of ``order`` in the service's own log."""
    return [c for c in service.calls() if c.get("call") == "refund" and c.get("order") == order]


def refund_agent(name: str, service: PaymentsService) -> AgentSpec:
    """Refunds the input's order through the payments service, WITHOUT an idempotency key."""

    def pay(args: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps({"order": args["order"], "amount": args["amount"]}).encode()
        request = urllib.request.Request(f"{service.url}/refunds", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return dict(json.loads(answer.read()))

    async def agent(run: Run) -> Any:
        order = run.input["order"]
        return await run.effect("refund", {"order": order, "amount": 10.0}, key=f"refund:{order}", fn=pay)

    return AgentSpec(name, agent, ScriptedModel([]), agent_version="v1")


async def squat(client: LedgerClient, agent: str, run_id: str, bodies: list[Payload]) -> list[int]:
    """What the attacker does: well-formed events under ``run_id``, raw on its own subject."""
    seqs, prev = [], GENESIS
    for seq, body in enumerate(bodies):
        event, data = make_event(body, run_id=run_id, agent=agent, seq=seq, prev_hash=prev, chain_format=CHAIN_FORMAT)
        seqs.append(int((await client.js.publish(run_subject(agent, run_id), data, timeout=5.0)).seq))
        prev = event.hash
    return seqs


def started(agent: str) -> RunStarted:
    return RunStarted.model_validate({"agent": agent, "version": VERSION})


async def cli(capsys: pytest.CaptureFixture[str], state: ServerState, user: str, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    creds = str(Path(state.creds_dir) / f"{user}.json")
    code = await asyncio.to_thread(main, [*argv, "--nats", state.url, "--creds", creds])
    out, err = capsys.readouterr()
    return code, out, err


async def test_a_run_id_is_its_first_agents_and_a_squat_is_refused_or_raises_the_alarm(
    clients: dict[str, LedgerClient], payments: PaymentsService, secure_server: ServerState, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    alpha, beta, operator = clients["agent-alpha"], clients["agent-beta"], clients["operator"]
    # The squat of the report: beta's bare run.started first. Alpha's start is refused before anything
    # is done (the old code paid, then showed the run as beta's and alpha's own events as forged).
    await squat(beta, "beta", "refund-order-183936", [started("beta")])
    with pytest.raises(RunIdTakenError, match="run id 'refund-order-183936' is taken: agent 'beta' claimed it"):
        await start_run(alpha, refund_agent("alpha", payments), {"order": "o-183936"}, run_id="refund-order-183936")
    assert refunds(payments, "o-183936") == []
    assert not await read_raw(operator, "ledger.run.alpha.refund-order-183936.*")

    # Alpha claims an id first and pays once; beta then writes under it, raw, and tries its own start.
    victim = "refund-order-183935"
    done = await start_run(alpha, refund_agent("alpha", payments), {"order": "o-183935"}, run_id=victim)
    assert done.status == "completed" and len(refunds(payments, "o-183935")) == 1
    forged = await squat(beta, "beta", victim, [started("beta"), RunCompleted(output={"refund_id": "forged"})])
    with pytest.raises(RunIdTakenError, match="taken: agent 'alpha' wrote under it, as did agent 'beta'"):
        await start_run(beta, refund_agent("beta", payments), {"order": "o-183935"}, run_id=victim)
    code, out, err = await cli(capsys, secure_server, "agent-beta", "run", "--agent", f"{__name__}:beta_spec",
                               "--run-id", victim)  # fmt: skip
    assert code == Exit.REFUSED and "taken: agent 'alpha' wrote under it" in err and "nothing was recorded" in err, err
    assert CALLED == [] and len(refunds(payments, "o-183935")) == 1
    assert len(await read_raw(operator, f"ledger.run.beta.{victim}.*")) == len(forged)  # beta's start wrote nothing

    # Every reader: alpha's run, alpha's events, beta's named as forgeries of it (never a second run).
    code, out, _ = await cli(capsys, secure_server, "operator", "show", victim)
    assert code == Exit.OK and f"run {victim}  agent alpha  status completed" in out, out
    quarantined = [line for line in out.splitlines() if line.startswith("QUARANTINED")]
    assert [line.split()[3] for line in quarantined] == [str(s) for s in forged]
    assert all(f"ledger.run.beta.{victim}.a" in line and "which is agent 'alpha''s" in line for line in quarantined)
    code, out, _ = await cli(capsys, secure_server, "operator", "runs", "--json")
    [listed] = [r for r in json.loads(out) if r["run_id"] == victim]
    assert (listed["agent"], listed["status"], listed["forgeries"]) == ("alpha", "completed", 2)
    code, out, _ = await cli(capsys, secure_server, "operator", "runs")
    assert "FORGED: 2 messages under its id" in next(line for line in out.splitlines() if victim in line)

    # The alarm: the chain is intact, the forgeries exit 7, listed by subject, writer and reason.
    code, out, _ = await cli(capsys, secure_server, "operator", "verify", victim, "--json")
    assert code == Exit.FORGED, out
    [result] = json.loads(out)
    assert (result["ok"], result["agent"], result["events"]) == (True, "alpha", 4)
    assert [(f["stream_seq"], f["subject"], f["writer"]) for f in result["forgeries"]] == [
        (seq, f"ledger.run.beta.{victim}.a", "agent-beta") for seq in forged
    ]
    assert all("which is agent 'alpha''s" in f["reason"] for f in result["forgeries"])
    code, out, _ = await cli(capsys, secure_server, "operator", "verify")
    assert code == Exit.FORGED and f"ok   {victim}  agent alpha" in out and "FORGERIES under 1 of their ids" in out
    assert f"FORGED stream seq {forged[0]} by agent-beta on ledger.run.beta.{victim}.a" in out

    # SQL: one row for the id, alpha's, its events only; beta's quarantined and counted.
    db = tmp_path / "ledger.duckdb"
    with ProjectionStore(db) as store:
        await Projector(operator, store).run()
    with ProjectionStore(db, writer=False) as store:
        con = store.con
        rows = con.execute("SELECT agent, status, forgeries FROM runs WHERE run_id = ?", [victim]).fetchall()
        assert rows == [("alpha", "completed", 2)]
        assert con.execute("SELECT DISTINCT agent FROM events WHERE run_id = ?", [victim]).fetchall() == [("alpha",)]
        found = con.execute("SELECT stream_seq, error FROM quarantine WHERE subject LIKE ? ORDER BY 1",
                            [f"ledger.run.beta.{victim}.%"]).fetchall()  # fmt: skip
        assert found == [(s, "RefusedFromWriter") for s in forged]


async def test_an_agent_shows_and_verifies_its_own_runs_and_is_refused_anothers(
    clients: dict[str, LedgerClient], secure_server: ServerState, capsys: pytest.CaptureFixture[str]
) -> None:
    alpha, beta = clients["agent-alpha"], clients["agent-beta"]
    marks = AgentSpec("alpha", _marks, ScriptedModel([]), agent_version="v1")
    assert (await start_run(alpha, marks, run_id="alpha-own")).status == "completed"
    assert (await start_run(beta, beta_spec, run_id="beta-own")).status == "completed"

    code, out, err = await cli(capsys, secure_server, "agent-alpha", "show", "alpha-own")
    assert code == Exit.OK and "run alpha-own  agent alpha  status completed" in out, err
    code, out, err = await cli(capsys, secure_server, "agent-alpha", "verify", "alpha-own")
    assert code == Exit.OK and "ok   alpha-own  agent alpha" in out and "1 of 1 runs verified" in out, err
    code, out, err = await cli(capsys, secure_server, "agent-alpha", "runs", "--json")
    assert code == Exit.OK and [r["run_id"] for r in json.loads(out)] == ["alpha-own"], err
    for command in ("show", "verify"):
        code, out, err = await cli(capsys, secure_server, "agent-alpha", command, "beta-own")
        assert code == Exit.REFUSED and out == "", (command, out, err)
        assert (
            "run 'beta-own' is agent 'beta''s, and the agent 'alpha' credentials read only agent 'alpha''s runs" in err
        )

    # Beta writes under alpha's id on its own subject: alpha cannot read it, but its verify says it is there.
    [seq] = await squat(beta, "beta", "alpha-own", [RunCompleted(output="forged")])
    code, out, err = await cli(capsys, secure_server, "agent-alpha", "verify", "alpha-own")
    assert code == Exit.FORGED and "FORGED? 1 messages on ledger.run.beta.alpha-own.a" in out, (out, err, seq)
    code, out, err = await cli(capsys, secure_server, "agent-alpha", "show", "alpha-own")
    assert code == Exit.OK and "UNREAD 1 messages on ledger.run.beta.alpha-own.a" in out, err


async def test_the_page_flags_a_run_with_forgeries_under_its_id(
    client: LedgerClient, nats_url: str, tmp_path: Path
) -> None:
    """The run list marks the run and its page names each forgery (the page reads the projection for
    the list and the log for the run, through the same rules as every reader)."""
    marks = AgentSpec("alpha", _marks, ScriptedModel([]), agent_version="v1")
    assert (await start_run(client, marks, run_id="page-victim")).status == "completed"
    assert (await start_run(client, marks, run_id="page-clean")).status == "completed"
    [seq] = await squat(client, "beta", "page-victim", [started("beta")])

    def get(url: str) -> str:
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return str(answer.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{url}: {exc.code} {exc.read().decode('utf-8', 'replace')[-2000:]}") from None

    def row(page: str, run_id: str) -> str:
        return page.split(f'data-run="{run_id}"')[1].split("</tr>")[0] if f'data-run="{run_id}"' in page else ""

    def flagged(base: str) -> str | None:
        page = get(base)
        return page if "forged" in row(page, "page-victim") else None  # once the projection has the forgery

    with ui_server(nats_url, tmp_path) as base:
        listing = await eventually(lambda: flagged(base), timeout=60)
        assert "forged 1" in row(listing, "page-victim") and "forged" not in row(listing, "page-clean")
        run_page = get(f"{base}runs/page-victim")
        assert 'id="forgeries"' in run_page
        assert f"stream seq {seq} on <code>ledger.run.beta.page-victim.a</code>" in run_page
        assert 'id="forgeries"' not in get(f"{base}runs/page-clean")
