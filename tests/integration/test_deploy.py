"""deploy/nats/ as shipped: every configuration passes nats-server's own check, starts, and carries a run.

Only what ties a file to one machine is replaced before a start (listen address and port, store dir,
monitoring port, cluster port, route host names), each by a pattern that must match exactly once: a
file reshaped so that a pattern no longer fits fails here instead of silently escaping the test.
Everything else (fsync before ack, max_payload, the auth include, the cluster and server names) runs
as written. The compose deployment of the cluster files is deploy/compose/smoke.sh's, run by .ci/run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from runledger import AgentSpec, Run, ScriptedModel
from runledger.errors import LedgerError
from runledger.log.client import LedgerClient, connect
from runledger.log.credentials import RoleCredentials
from runledger.log.server import free_port, nats_server_binary
from runledger.log.subjects import LEDGER_STREAM
from runledger.ops.verify import verify_runs
from runledger.protect.roles import inbox_prefix, render_authorization
from runledger.sdk.lifecycle import start_run
from tests.conftest import cluster_client, eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NATS = Path(__file__).resolve().parents[2] / "deploy" / "nats"
NODES = ("n1", "n2", "n3")
EXAMPLE_HEADER = (
    "# runledger roles: an example of what `runledger up --secure --agent refund` generates (ledger/protect/roles.py)\n"
    "# with CHANGE-ME passwords; written by `.venv/bin/python -m tests.integration.test_deploy`, checked by that test."
)
# The users of auth.example.conf: what `runledger up --secure --agent refund` generates.
EXAMPLE_USERS = {
    "admin": ("admin", None),
    "analyst": ("analyst", None),
    "operator": ("operator", None),
    "worker": ("worker", None),
    "agent-refund": ("agent", "refund"),
}


def _replace(text: str, pattern: str, new: str) -> str:
    """``text`` with the one match of ``pattern`` replaced; fails when there is not exactly one."""
    out, n = re.subn(pattern, new, text, flags=re.MULTILINE)
    assert n == 1, f"expected one match of {pattern!r} in the shipped config, found {n}"
    return out


def _check(config: Path) -> None:
    done = subprocess.run([nats_server_binary(), "-c", str(config), "-t"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is valid" in done.stdout + done.stderr


def auth_example() -> str:
    """auth.example.conf as ``runledger.protect.roles`` renders it for EXAMPLE_USERS, with CHANGE-ME passwords."""
    users = [
        RoleCredentials(role, user, f"CHANGE-ME-{user}", inbox_prefix(role, agent), "", agent)
        for user, (role, agent) in EXAMPLE_USERS.items()
    ]
    generated = render_authorization(users)
    assert generated.startswith("# ")  # its own header line, replaced by the example's
    return EXAMPLE_HEADER + "\n" + generated.split("\n", 1)[1]


class Servers:
    """nats-server processes started from config files; each is stopped at the end of the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, config: Path, port: int) -> str:
        log = config.with_suffix(".log")
        with log.open("wb") as out:
            proc = subprocess.Popen([nats_server_binary(), "-c", str(config)], stdout=out, stderr=subprocess.STDOUT)
        self.procs.append((proc, log))
        return f"nats://127.0.0.1:{port}"

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for _, log in self.procs)

    def stop(self) -> None:
        for proc, _ in self.procs:
            proc.terminate()
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    s = Servers(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def single_node(tmp_path: Path, port: int) -> Path:
    """nats-server.conf beside auth.example.conf as its auth.conf, on ``port`` with a temp store."""
    conf_dir = tmp_path / "single"
    conf_dir.mkdir()
    shutil.copy(NATS / "auth.example.conf", conf_dir / "auth.conf")
    text = (NATS / "nats-server.conf").read_text()
    text = _replace(text, r"^listen: 127\.0\.0\.1:4222$", f"listen: 127.0.0.1:{port}")
    text = _replace(text, r'^(\s*)store_dir: "/var/lib/runledger/jetstream"$', rf'\1store_dir: "{tmp_path / "js"}"')
    config = conf_dir / "nats-server.conf"
    config.write_text(text)
    return config


def cluster_node(tmp_path: Path, name: str, ports: dict[str, dict[str, int]]) -> Path:
    """deploy/nats/cluster/<name>.conf on loopback: the host names nats-1..3 become 127.0.0.1 and their ports."""
    own = ports[name]
    text = (NATS / "cluster" / f"{name}.conf").read_text()
    text = _replace(text, r"^listen: 0\.0\.0\.0:4222$", f"listen: 127.0.0.1:{own['client']}")
    text = _replace(text, r"^http: 0\.0\.0\.0:8222(\s)", rf"http: 127.0.0.1:{own['http']}\1")
    text = _replace(text, r'^(\s*)store_dir: "/data"$', rf'\1store_dir: "{tmp_path / name}"')
    text = _replace(text, r"^(\s*)listen: 0\.0\.0\.0:6222$", rf"\g<1>listen: 127.0.0.1:{own['route']}")
    for peer in NODES:
        if peer != name:
            text = _replace(
                text, rf"nats-route://nats-{peer[1]}:6222", f"nats-route://127.0.0.1:{ports[peer]['route']}"
            )
    config = tmp_path / f"{name}.conf"
    config.write_text(text)
    return config


def creds_file(tmp_path: Path, user: str, url: str) -> str:
    """A credentials file for a user of auth.example.conf (its CHANGE-ME password)."""
    role, agent = EXAMPLE_USERS[user]
    path = tmp_path / f"{user}.json"
    RoleCredentials(role, user, f"CHANGE-ME-{user}", inbox_prefix(role, agent), url, agent).write(path)
    return str(path)


async def _double(run: Run) -> Any:
    n = await run.tool("double", run.input, fn=lambda a: 2 * a)
    return (await run.model([{"role": "user", "content": str(n)}])).content


def refund_spec() -> AgentSpec:
    """An agent named ``refund``: the one agent user of auth.example.conf."""
    return AgentSpec("refund", _double, ScriptedModel(lambda m: f"twice is {m[-1]['content']}"), agent_version="v1")


async def login(url: str, creds: str, *, timeout: float = 20.0) -> LedgerClient:
    """Connect once the server answers (it was just started)."""

    async def attempt() -> LedgerClient | None:
        try:
            return await connect(url, user_credentials=creds)
        except LedgerError:
            return None

    client: LedgerClient = await eventually(attempt, timeout=timeout, interval=0.2)
    return client


def test_auth_example_is_what_secure_up_generates() -> None:
    assert (NATS / "auth.example.conf").read_text() == auth_example(), (
        "deploy/nats/auth.example.conf differs from what runledger.protect.roles generates: "
        "rewrite it with `.venv/bin/python -m tests.integration.test_deploy`"
    )


@pytest.mark.parametrize("name", ["nats-server.conf", *(f"cluster/{n}.conf" for n in NODES)])
def test_every_config_passes_the_servers_check(tmp_path: Path, name: str) -> None:
    if name == "nats-server.conf":
        _check(single_node(tmp_path, free_port()))  # its include needs an auth.conf beside it
    else:
        _check(NATS / name)


async def test_the_single_node_config_records_a_run_under_the_example_roles(tmp_path: Path, servers: Servers) -> None:
    port = free_port()
    url = servers.start(single_node(tmp_path, port), port)
    with pytest.raises(LedgerError):  # logins are required
        await connect(url, connect_timeout=1.0, ready_timeout=1.0)
    admin = await login(url, creds_file(tmp_path, "admin", url))  # creates the streams
    agent = await connect(url, user_credentials=creds_file(tmp_path, "agent-refund", url))
    analyst = await connect(url, user_credentials=creds_file(tmp_path, "analyst", url))
    try:
        result = await start_run(agent, refund_spec(), 21, run_id="deploy-single")
        assert (result.status, result.output) == ("completed", "twice is 42"), servers.logs()
        assert [(v.run_id, v.ok) for v in await verify_runs(analyst)] == [("deploy-single", True)]
        info = await admin.js.stream_info(LEDGER_STREAM)
        assert info.state.messages == 4 and info.config.num_replicas == 1
        with pytest.raises((TimeoutError, nats.errors.Error)):  # an analyst publishes nothing
            await analyst.nc.jetstream(timeout=1.0).publish("ledger.run.refund.x", b"{}", timeout=1.0)
    finally:
        for c in (admin, agent, analyst):
            await c.close()


async def test_the_cluster_configs_form_a_cluster_that_replicates_a_run(tmp_path: Path, servers: Servers) -> None:
    ports = {n: {"client": free_port(), "http": free_port(), "route": free_port()} for n in NODES}
    urls = [servers.start(cluster_node(tmp_path, n, ports), ports[n]["client"]) for n in NODES]

    def healthy() -> bool:
        # /healthz answers 200 once the node's JetStream is current with the meta leader.
        try:
            return all(
                urllib.request.urlopen(f"http://127.0.0.1:{ports[n]['http']}/healthz", timeout=2).status == 200
                for n in NODES
            )
        except OSError:
            return False

    try:
        await eventually(healthy, timeout=60, interval=0.5)
    except AssertionError:
        pytest.fail("the cluster did not become healthy:\n" + servers.logs())
    client = await cluster_client(",".join(urls))
    try:
        result = await start_run(client, refund_spec(), 1, run_id="deploy-cluster")
        assert result.status == "completed", servers.logs()
        info = await client.js.stream_info(LEDGER_STREAM)
        assert info.config.num_replicas == 3 and info.state.messages == 4
        assert info.cluster is not None and info.cluster.name == "runledger"
        assert {info.cluster.leader, *(p.name for p in info.cluster.replicas or [])} == set(NODES)
        assert [(v.run_id, v.ok) for v in await verify_runs(client)] == [("deploy-cluster", True)]
    finally:
        await client.close()


if __name__ == "__main__":
    # Rewrites deploy/nats/auth.example.conf after a change of the roles' permissions.
    (NATS / "auth.example.conf").write_text(auth_example())
