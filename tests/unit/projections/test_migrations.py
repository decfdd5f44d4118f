"""Migrations: an ordered list, one transaction each, recorded; a newer file is refused."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from runledger.projections.errors import SchemaTooNewError
from runledger.projections.migrations import LATEST, MIGRATIONS, current_version, migrate


def test_a_fresh_file_gets_every_migration_in_order(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "m.duckdb"))
    assert current_version(con) == 0
    assert migrate(con, "m") == 0
    rows = con.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
    assert rows == [(i + 1, m.name) for i, m in enumerate(MIGRATIONS)]
    assert current_version(con) == LATEST
    assert migrate(con, "m") == LATEST  # idempotent
    assert con.execute("SELECT count(*) FROM schema_migrations").fetchall() == [(LATEST,)]


def test_every_table_and_view_exists_and_is_queryable(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "m.duckdb"))
    migrate(con, "m")
    names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    for name in ("events", "runs", "steps", "effect_keys", "checkpoints", "quarantine", "projector_state",
                 "model_prices", "effects", "approvals", "effects_in_doubt", "pending_approvals", "failed_runs",
                 "token_usage_daily", "step_latency", "run_costs", "forks", "child_runs",
                 "failure_classes"):  # fmt: skip
        assert name in names
        con.execute(f"SELECT * FROM {name}").fetchall()


def test_a_failed_migration_leaves_the_file_at_its_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runledger.projections import migrations

    con = duckdb.connect(str(tmp_path / "m.duckdb"))
    broken = [*MIGRATIONS, migrations.Migration("broken", "CREATE TABLE x (a INTEGER); SELECT * FROM nowhere")]
    monkeypatch.setattr(migrations, "MIGRATIONS", broken)
    monkeypatch.setattr(migrations, "LATEST", len(broken))
    with pytest.raises(duckdb.Error):
        migrations.migrate(con, "m")
    assert current_version(con) == LATEST
    assert con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'x'").fetchall() == [(0,)]


def test_a_file_from_a_newer_runledger_is_refused(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "m.duckdb"))
    migrate(con, "m")
    con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, 'from the future')", [LATEST + 1])
    with pytest.raises(SchemaTooNewError, match="upgrade runledger"):
        migrate(con, str(tmp_path / "m.duckdb"))


def test_a_file_of_version_4_gets_step_in_place_and_effects_with_their_args(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runledger.projections import migrations

    con = duckdb.connect(str(tmp_path / "m.duckdb"))
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[:4])
    monkeypatch.setattr(migrations, "LATEST", 4)
    migrations.migrate(con, "m")
    con.execute(
        "INSERT INTO steps (run_id, step_no, kind, name, status, input_hash, output) "
        """VALUES ('r', 3, 'effect', 'refund', 'committed', 'd', '{"ok": true}')"""
    )
    con.execute(
        "INSERT INTO events (stream_seq, subject, id, run_id, agent, type, ts_text, step, payload, prev_hash, hash, "
        """size) VALUES (7, 'ledger.run.a.r.a', 'e', 'r', 'a', 'effect.intended', '', 3, """
        """'{"step": 3, "name": "refund", "args": {"amount": 150}}', '', '', 0)"""
    )
    monkeypatch.undo()
    assert migrate(con, "m") == 4
    assert con.execute("SELECT run_id, step, kind FROM steps").fetchall() == [("r", 3, "effect")]
    rows = con.execute("SELECT run_id, step, name, state, args->>'amount' FROM effects").fetchall()
    assert rows == [("r", 3, "refund", "committed", "150")]
    with pytest.raises(duckdb.BinderException, match='Candidate bindings: "step"'):
        con.execute("SELECT step_no FROM steps")
