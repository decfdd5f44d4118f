"""Role permissions as data (the server-side refusals are tested in tests/integration/test_ledger_roles.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runledger.errors import ConfigurationError
from runledger.protect.roles import RoleCredentials, content_denials, content_grants, generate, permissions


def test_an_agent_may_publish_only_its_own_runs_and_no_commands() -> None:
    allow = permissions("agent", "alpha")["publish"]["allow"]
    assert "ledger.run.alpha.*.a" in allow and not any(s.startswith("ledger.run.beta") for s in allow)
    # Its own writer token only: never a worker's branch ("w") or an operator's decision ("o").
    assert not any(s.startswith(("ledger.run.", "ledger.effect.")) and not s.endswith(".a") for s in allow)
    assert not any(s.startswith("ledger.cmd") or ".STREAM.DELETE." in s or ".STREAM.PURGE." in s for s in allow)
    assert "$JS.API.CONSUMER.CREATE.LEDGER" not in allow  # the unnamed (unscopable) form
    assert permissions("agent", "alpha")["subscribe"]["allow"] == ["_INBOX_agent_alpha.>"]
    with pytest.raises(ConfigurationError):
        permissions("agent", "bad.name")


def test_an_analyst_publishes_nothing_to_the_ledger() -> None:
    publish = permissions("analyst")["publish"]
    assert {"ledger.>", "$KV.>", "$O.>"} <= set(publish["deny"])
    assert not any(s.startswith(("ledger.", "$KV.", "$O.")) for s in publish["allow"])


def test_generate_keeps_existing_passwords_and_adds_agents(tmp_path: Path) -> None:
    first = generate(tmp_path, ["alpha"])
    password = RoleCredentials.read(first["agent-alpha"]).password
    second = generate(tmp_path, ["beta"], url="nats://127.0.0.1:1")
    assert set(second) == {"admin", "analyst", "operator", "worker", "agent-alpha", "agent-beta"}
    assert RoleCredentials.read(second["agent-alpha"]).password == password
    conf = (tmp_path / "auth.conf").read_text()
    assert conf.count("user:") == 6 and '"ledger.run.beta.*.a"' in conf


def test_decisions_are_the_operators_and_branches_the_workers() -> None:
    operator = permissions("operator")["publish"]["allow"]
    worker = permissions("worker")["publish"]["allow"]
    assert {"ledger.run.*.*.o", "ledger.effect.*.*.o"} <= set(operator)
    assert not any(s.startswith(("ledger.run.", "ledger.effect.")) and not s.endswith(".o") for s in operator)
    assert {"ledger.run.*.*.w", "ledger.effect.*.*.w"} <= set(worker)
    assert not any(s.startswith(("ledger.run.", "ledger.effect.")) and not s.endswith(".w") for s in worker)


def test_an_analyst_reads_run_keys_only_when_granted_content(tmp_path: Path) -> None:
    plain = permissions("analyst")["publish"]
    granted = permissions("analyst", content=True)["publish"]
    assert set(content_denials()) <= set(plain["deny"]) and not set(content_denials()) & set(granted["deny"])
    for role in ("operator", "worker"):
        assert not set(content_denials()) & set(permissions(role)["publish"].get("deny", []))

    generate(tmp_path, ["alpha"], grant_content=("analyst",))
    assert content_grants(tmp_path) == {"analyst"}
    generate(tmp_path, ["alpha"])  # a restart keeps the grant
    conf = (tmp_path / "auth.conf").read_text()
    analyst = next(line for line in conf.splitlines() if '"analyst"' in line)
    assert '"$JS.API.DIRECT.GET.>"' in analyst and "DIRECT.GET.KV_LEDGER_KEYS" not in analyst.split('"deny"')[1]
    generate(tmp_path, ["alpha"], revoke_content=("analyst",))
    assert content_grants(tmp_path) == frozenset()
    analyst = next(line for line in (tmp_path / "auth.conf").read_text().splitlines() if '"analyst"' in line)
    assert "$JS.API.DIRECT.GET.KV_LEDGER_KEYS.>" in analyst.split('"deny"')[1]
    with pytest.raises(ConfigurationError, match="granted to analyst only"):
        generate(tmp_path, ["alpha"], grant_content=("agent",))
