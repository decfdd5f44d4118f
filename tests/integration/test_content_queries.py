"""An analyst allowed to read content asks "which refunds were over 100?" in SQL and exports the
answer to Parquet, content opened as recorded (redacted); without the grant it stays sealed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from runledger.log.client import LedgerClient, connect
from runledger.log.server import ServerState
from runledger.sdk.agent import AgentSpec
from runledger.sdk.lifecycle import start_run
from runledger.sdk.models import ScriptedModel
from runledger.sdk.protocol import Run
from tests.conftest import eventually
from tests.integration.processes import runledger

pytestmark = pytest.mark.integration

CARD = "4111 1111 1111 1111"
OVER_100 = (
    "SELECT run_id, CAST(args->>'amount' AS DOUBLE) AS amount, args->>'note' AS note, "
    "result->>'refund_id' AS refund_id FROM effects "
    "WHERE name = 'refund' AND TRY_CAST(args->>'amount' AS DOUBLE) > 100 ORDER BY amount"
)


def refund_agent(name: str = "refunder") -> AgentSpec:
    """Refunds what its input says, through a recorded effect, under the default data policy
    (redacted and sealed); the note carries a card number, which redaction replaces."""

    async def agent(run: Run) -> Any:
        ticket = await run.tool("lookup_ticket", {"id": "t"}, fn=lambda a: {"ok": True})
        assert ticket["ok"]
        args = {"order": run.run_id, "amount": run.input["amount"], "note": f"card on file {CARD}"}
        return await run.effect(
            "refund", args, key=f"refund:{run.run_id}", fn=lambda a: {"refund_id": f"rf-{a['order']}"}
        )

    return AgentSpec(name, agent, ScriptedModel([]), agent_version="v1")


async def record_refunds(client: LedgerClient, agent: str = "refunder") -> dict[float, str]:
    runs = {}
    for amount in (40.0, 150.0, 950.0):
        result = await start_run(client, refund_agent(agent), {"amount": amount}, run_id=f"refund-{int(amount)}")
        assert result.status == "completed", result
        runs[amount] = result.run_id
    return runs


def without_master_key(tmp_path: Path) -> dict[str, str]:
    """A caller without the grant: no master key anywhere it could look."""
    return {"RUNLEDGER_MASTER_KEY": "", "RUNLEDGER_KMS": "", "RUNLEDGER_MASTER_KEY_FILE": str(tmp_path / "none.key")}


def parquet_rows(directory: Path, table: str, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    files = f"{directory / table}/**/*.parquet"
    return con.execute(sql.format(t=f"read_parquet('{files}', hive_partitioning = true)")).fetchall()


async def test_an_analyst_with_the_grant_asks_which_refunds_were_over_100(client: LedgerClient, tmp_path: Path) -> None:
    runs = await record_refunds(client)
    db = str(tmp_path / "ledger.duckdb")
    projected = runledger(client.url, "project", "--db", db)
    assert projected.returncode == 0, projected.stderr

    # With the grant (this process holds the master key, the login reads run keys): opened, redacted.
    asked = runledger(client.url, "sql", "--content", "--no-sync", "--db", db, "--format", "json", OVER_100)
    assert asked.returncode == 0, asked.stderr
    answer = json.loads(asked.stdout)
    assert [(r["run_id"], r["amount"], r["refund_id"]) for r in answer] == [
        (runs[150.0], 150.0, f"rf-{runs[150.0]}"),
        (runs[950.0], 950.0, f"rf-{runs[950.0]}"),
    ]
    assert all(r["note"].startswith("card on file «redacted:card_number:") for r in answer), answer
    assert CARD not in asked.stdout and CARD.replace(" ", "") not in asked.stdout

    # The Parquet export holds the same content, opened and redacted: no ciphertext, no card number.
    lake = tmp_path / "lake"
    exported = runledger(client.url, "export", "--parquet", str(lake), "--content", "--no-sync", "--db", db)
    assert exported.returncode == 0, exported.stderr
    intents = parquet_rows(
        lake, "events",
        "SELECT run_id, CAST(payload->'args'->>'amount' AS DOUBLE), payload->'args'->>'note' FROM {t} "
        "WHERE type = 'effect.intended' AND starts_with(subject, 'ledger.run.') ORDER BY 2",
    )  # fmt: skip
    assert [(r, a) for r, a, _ in intents] == [(runs[40.0], 40.0), (runs[150.0], 150.0), (runs[950.0], 950.0)]
    assert all(note.startswith("card on file «redacted:card_number:") for _, _, note in intents)
    for table in ("events", "steps", "runs", "checkpoints", "effect_keys"):
        column = {"events": "payload", "steps": "output", "runs": "input", "checkpoints": "checkpoint"}
        text = parquet_rows(
            lake, table, f"SELECT string_agg(CAST({column.get(table, 'result')} AS VARCHAR), ' ') FROM {{t}}"
        )
        assert '"$enc"' not in text[0][0] and CARD not in text[0][0], table
    steps = parquet_rows(lake, "steps", "SELECT output->>'refund_id' FROM {t} WHERE kind = 'effect' ORDER BY 1")
    assert steps == [(f"rf-{runs[a]}",) for a in sorted(runs, key=lambda a: f"rf-{runs[a]}")]

    # The file itself never holds content opened: an ordinary query still sees it sealed.
    con = duckdb.connect(db, read_only=True)
    sealed = con.execute("SELECT args FROM effects WHERE name = 'refund'").fetchall()
    con.close()
    assert len(sealed) == 3 and all(json.loads(a)["$enc"] == "A256GCM" for (a,) in sealed)


async def test_without_the_grant_content_stays_sealed_and_the_error_says_what_to_do(
    client: LedgerClient, tmp_path: Path
) -> None:
    await record_refunds(client)
    db = str(tmp_path / "ledger.duckdb")
    env = without_master_key(tmp_path)
    assert runledger(client.url, "project", "--db", db, env=env).returncode == 0  # projecting needs no key

    plain = runledger(client.url, "sql", "--no-sync", "--db", db, "--format", "json", OVER_100, env=env)
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout) == []  # the amounts are sealed: no refund is "over 100"
    args = runledger(client.url, "sql", "--no-sync", "--db", db, "--format", "json",
                     "SELECT args FROM effects WHERE name = 'refund'", env=env)  # fmt: skip
    assert [sorted(r["args"]) for r in json.loads(args.stdout)] == [["$enc", "ct", "kid"]] * 3

    refused = runledger(client.url, "sql", "--content", "--no-sync", "--db", db, OVER_100, env=env)
    assert refused.returncode == 4 and refused.stdout == ""
    assert "content stays sealed for this caller: no master key" in refused.stderr, refused.stderr
    assert "RUNLEDGER_MASTER_KEY" in refused.stderr and "Without --content" in refused.stderr

    lake = tmp_path / "lake"
    refused = runledger(client.url, "export", "--parquet", str(lake), "--content", "--no-sync", "--db", db, env=env)
    assert refused.returncode == 4 and "no master key" in refused.stderr and not lake.exists()
    exported = runledger(client.url, "export", "--parquet", str(lake), "--no-sync", "--db", db, env=env)
    assert exported.returncode == 0, exported.stderr
    intents = parquet_rows(lake, "events", "SELECT payload->'args' FROM {t} WHERE type = 'effect.intended'")
    assert intents and all(json.loads(a)["$enc"] == "A256GCM" for (a,) in intents)


def run_as(state: ServerState, user: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """``runledger ARGS`` with the credentials file of ``user``, against the secure server."""
    return runledger(state.url, *args, "--creds", str(Path(state.creds_dir) / f"{user}.json"), env=env)


@pytest.mark.timeout(600)
async def test_in_secure_mode_content_is_for_the_roles_an_operator_grants(
    secure_server: ServerState, tmp_path: Path
) -> None:
    """An analyst holding the master key still sees content sealed until an operator grants it
    (`runledger up --secure --grant-content analyst` on the running server); another agent's login
    and a revoked analyst are refused, at once and saying what to do."""
    admin = await connect(secure_server.url, user_credentials=str(Path(secure_server.creds_dir) / "admin.json"))
    await admin.close()  # the streams exist
    alpha = await connect(secure_server.url, user_credentials=str(Path(secure_server.creds_dir) / "agent-alpha.json"))
    try:
        runs = await record_refunds(alpha, agent="alpha")
    finally:
        await alpha.close()
    db = str(tmp_path / "ledger.duckdb")
    assert run_as(secure_server, "admin", "project", "--db", db).returncode == 0
    home = {"RUNLEDGER_HOME": str(Path(secure_server.creds_dir).parent)}

    def ask(user: str) -> Any:
        return run_as(secure_server, user, "sql", "--content", "--no-sync", "--db", db, "--format", "json", OVER_100)

    # Not granted: refused before anything is opened, quickly, naming the grant (exit 6: the server refused the read).
    started = time.monotonic()
    refused = ask("analyst")
    assert refused.returncode == 6 and refused.stdout == "", refused.stderr
    assert "content stays sealed for the analyst login: the login may not read run keys" in refused.stderr
    assert "runledger up --secure --grant-content analyst" in refused.stderr
    assert time.monotonic() - started < 20  # a denial is seen at once, not after the key store's retries
    plain = run_as(secure_server, "analyst", "sql", "--no-sync", "--db", db, "--format", "json",
                   "SELECT args FROM effects WHERE name = 'refund'")  # fmt: skip
    assert [sorted(r["args"]) for r in json.loads(plain.stdout)] == [["$enc", "ct", "kid"]] * 3
    shown = run_as(secure_server, "analyst", "show", runs[950.0], "--json")
    assert shown.returncode == 0, shown.stderr
    assert '"$enc"' in shown.stdout and '"amount": 950' not in shown.stdout and "card_number" not in shown.stdout

    # Another agent's login is the wrong role for alpha's content.
    wrong = ask("agent-beta")
    assert wrong.returncode == 6 and "the login may not read run keys" in wrong.stderr, wrong.stderr

    # The operator grants content to analysts on the running server; the analyst now gets the answer.
    granted = runledger(secure_server.url, "up", "--secure", "--grant-content", "analyst", env=home)
    assert granted.returncode == 0 and "granted to: analyst" in granted.stdout, granted.stderr
    answer = await eventually(lambda: (r := ask("analyst")).returncode == 0 and json.loads(r.stdout), timeout=60)
    assert [(r["run_id"], r["amount"]) for r in answer] == [(runs[150.0], 150.0), (runs[950.0], 950.0)]
    assert all(r["note"].startswith("card on file «redacted:card_number:") for r in answer)
    lake = tmp_path / "lake"
    exported = run_as(secure_server, "analyst", "export", "--parquet", str(lake), "--content", "--no-sync", "--db", db)
    assert exported.returncode == 0, exported.stderr
    intents = "WHERE type = 'effect.intended' AND starts_with(subject, 'ledger.run.') ORDER BY 1"
    amounts = parquet_rows(lake, "events", "SELECT CAST(payload->'args'->>'amount' AS DOUBLE) FROM {t} " + intents)
    assert amounts == [(40.0,), (150.0,), (950.0,)]

    # Revoked: sealed again, and the grant is gone from the server's permissions.
    revoked = runledger(secure_server.url, "up", "--secure", "--revoke-content", "analyst", env=home)
    assert revoked.returncode == 0 and "grants them content with --grant-content" in revoked.stdout
    again = await eventually(lambda: (r := ask("analyst")).returncode == 6 and r.stderr, timeout=60)
    assert "the login may not read run keys" in again
