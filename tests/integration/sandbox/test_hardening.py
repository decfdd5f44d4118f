"""The sandbox's hardening, shown from inside the container and witnessed from the host.

Each test runs a probe agent (tests/sandbox_agents/probes/hardening.py) in a real sandbox; the probe
returns what it saw. What the guest reports is compared with the policy the host asked for
and with what the host can see for itself: the container's configuration as the engine holds
it and its cgroup files, read just before the container is removed (``WitnessPool``), a
listener that counts the connections it accepted, the redactor that would have hidden a
leaked value anyway. Limits are set to values no default has, so a default cannot pass for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import shutil
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.protect.redaction import Redactor
from runledger.record.fold import fold
from runledger.sandbox.containers import CodeMounts, Sandbox, SandboxPolicy, SandboxPool
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk import code_identity
from runledger.sdk.agent import ALLOW_CODE_ENV, load_agent
from runledger.sdk.code_identity import code_hash
from runledger.sdk.lifecycle import start_run
from tests.sandbox_agents.probes.hardening import connect_all, parent_spec

pytestmark = [pytest.mark.integration, pytest.mark.docker]
MOD = "tests.sandbox_agents.probes.hardening"
# Limits that are nobody's default: a sandbox that ignored the policy would not match them.
POLICY = {"memory": "192m", "cpus": 0.5, "pids": 24, "timeout_s": 20.0, "connect_timeout_s": 30.0}
MEMORY_BYTES = 192 * 1024 * 1024
# An innocuous value the redactor leaves alone (checked below): if it reached the guest, the
# guest's report would carry it to the test as it is.
CANARY_NAME, CANARY_VALUE = "RL_HOST_CANARY", "teal-harbor-5521"
# Per-test budget: one re-run waits at most connect_timeout_s + timeout_s (+ removal).
ONE_RERUN_S = POLICY["connect_timeout_s"] + POLICY["timeout_s"] + 10


def _cgroup_dirs(container_id: str, controller: str) -> list[Path]:
    """Where the host keeps this container's cgroup: v1 (cgroupfs driver), v2 (cgroupfs, systemd)."""
    root = Path("/sys/fs/cgroup")
    return [root / controller / "docker" / container_id, root / "docker" / container_id,
            root / "system.slice" / f"docker-{container_id}.scope"]  # fmt: skip


def host_cgroup(container_id: str, controller: str, name: str) -> str:
    for directory in _cgroup_dirs(container_id, controller):
        if (directory / name).exists():
            return (directory / name).read_text().strip()
    raise AssertionError(f"no cgroup file {name} for container {container_id} on this host")


class WitnessPool(SandboxPool):
    """A pool that records what the host sees of each sandbox it hands out: the engine's view of the
    container (``docker inspect``) and its cgroup's pids files, read every 50 ms while it lives (the
    cgroup goes when the container exits, which the guest does as soon as it has reported)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[dict[str, Any]] = []
        self._watchers: set[asyncio.Task[None]] = set()

    async def acquire(self, code: CodeMounts, agent: str = "") -> Sandbox:
        sandbox = await super().acquire(code, agent)
        attrs = await asyncio.to_thread(sandbox.api.inspect_container, sandbox.container_id)
        witness: dict[str, Any] = {"inspect": attrs, "cgroup": {}}
        self.seen.append(witness)
        self._watchers.add(asyncio.create_task(self._watch(sandbox.container_id, witness["cgroup"])))
        return sandbox

    async def _watch(self, container_id: str, into: dict[str, str]) -> None:
        while True:
            try:
                into.update({name: host_cgroup(container_id, "pids", name) for name in ("pids.max", "pids.events")})
            except (OSError, AssertionError):
                if into:
                    return  # the container is gone; the last values read stay
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        await super().close()


@pytest.fixture
async def witness_pool(docker: Any, sandbox_image: str) -> AsyncIterator[WitnessPool]:
    pool = WitnessPool(docker, SandboxPolicy(image=sandbox_image, **POLICY), size=0)  # type: ignore[arg-type]
    try:
        yield pool
    finally:
        await pool.close()
    assert len(pool) == 0


async def probe(client: LedgerClient, pool: WitnessPool, agent: str, input: Any = None) -> Any:
    """Record a parent, re-run ``agent`` over it in the pool; the probe's report (it must complete)."""
    run_id = f"probe-{agent}"
    recorded = await start_run(client, parent_spec(), input, run_id=run_id)
    assert recorded.status == "completed"
    request = RerunRequest(parent_run_id=run_id, agent=f"{MOD}:{agent}", mode="redrive", fork_step=1,
                           timeout_s=POLICY["timeout_s"])  # fmt: skip
    result = await Rerunner(client, pool).rerun(request)
    # Completed: the probe reported; a run killed by a limit (the wall clock, say) is not a report.
    assert result.status == "completed", (result.reason, result.error)
    await pool.close()  # the sandbox is removed (and witnessed) before the test looks
    return result.output


@pytest.mark.timeout(ONE_RERUN_S + 30)
async def test_the_guest_sees_the_hardening_the_policy_asks_for(
    client: LedgerClient, witness_pool: WitnessPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CANARY_NAME, CANARY_VALUE)
    assert Redactor(os.urandom(32)).redact({"v": CANARY_VALUE, "line": f"{CANARY_NAME}={CANARY_VALUE}"}) == {
        "v": CANARY_VALUE, "line": f"{CANARY_NAME}={CANARY_VALUE}"}  # fmt: skip

    seen = await probe(client, witness_pool, "inspect_spec")

    # Not root, no capabilities, no new privileges.
    assert (seen["uid"], seen["euid"], seen["gid"]) == (10001, 10001, 10001)
    assert seen["status"]["Uid"].split() == ["10001"] * 4
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(seen["status"][caps], 16) == 0, (caps, seen["status"])
    assert seen["status"]["NoNewPrivs"] == "1"
    # Its own IPC namespace (not the host's), with no shared memory mount; no network but loopback.
    assert seen["ipc_ns"] != os.readlink("/proc/self/ns/ipc")
    assert seen["net_ns"] != os.readlink("/proc/self/ns/net")
    assert seen["dev_shm"] is False
    assert seen["interfaces"] == ["lo"]
    # Limits as the guest's own cgroup states them.
    cg = seen["cgroup"]
    assert cg["pids.max"] == str(POLICY["pids"])
    if cg["cpu.cfs_quota_us"] == cg["cpu.cfs_period_us"]:  # cgroup v2: "quota period" in cpu.max
        quota, period = (int(v) for v in cg["cpu.cfs_quota_us"].split())
    else:
        quota, period = int(cg["cpu.cfs_quota_us"]), int(cg["cpu.cfs_period_us"])
    assert quota / period == POLICY["cpus"]
    assert int(cg["memory.limit"]) == MEMORY_BYTES
    assert cg["memory+swap.limit"] in (str(MEMORY_BYTES), "0")  # v1: memory+swap; v2: swap alone
    # A read-only root: mounted ro, and a write to it fails with EROFS.
    assert "ro" in seen["root_mount_options"].split(",")
    assert seen["root_write"] == "EROFS"
    # No Docker socket anywhere: the only socket in the filesystem is the broker's channel.
    assert seen["sockets"] == ["/run/runledger/broker.sock"]
    assert set(seen["docker_socket"].values()) == {"ENOENT"}
    # No host environment: the planted variable is in no process's environment.
    assert CANARY_NAME in os.environ
    assert CANARY_NAME not in seen["environ"]
    assert "PYTHONPATH" in seen["environ"]  # the report does carry the environment
    assert set(seen["environ"]) <= {"PATH", "HOSTNAME", "HOME", "LANG", "PWD", "PYTHONPATH",
                                    "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"}  # fmt: skip
    environments = "\n".join(seen["process_environments"].values())
    assert "PYTHONPATH=" in environments and CANARY_VALUE not in environments

    # The host's own view of the same container.
    (witness,) = witness_pool.seen
    host = witness["inspect"]["HostConfig"]
    assert host["PidsLimit"] == POLICY["pids"] and witness["cgroup"]["pids.max"] == str(POLICY["pids"])
    assert host["NanoCpus"] == int(POLICY["cpus"] * 1e9)
    assert host["Memory"] == host["MemorySwap"] == MEMORY_BYTES
    assert host["ReadonlyRootfs"] is True and host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
    assert host["SecurityOpt"] == ["no-new-privileges"] and host["IpcMode"] == "none"
    assert host["NetworkMode"] == "none" and host["Privileged"] is False
    assert not any("docker.sock" in bind for bind in host["Binds"])
    config = witness["inspect"]["Config"]
    assert config["User"] == "10001:10001"
    assert not any(CANARY_VALUE in env for env in config["Env"])


@pytest.mark.timeout(ONE_RERUN_S + 30)
async def test_a_fork_bomb_is_refused_by_the_pids_limit(client: LedgerClient, witness_pool: WitnessPool) -> None:
    cap = 4 * POLICY["pids"]  # never more children than this, whatever the limit
    seen = await probe(client, witness_pool, "fork_spec", {"max_children": cap})
    # fork() failed with EAGAIN, inside the guest, with the cgroup at its pids limit.
    assert seen["refused"] is not None, f"{seen['children']} children forked and none refused"
    assert seen["refused"]["errno"] == "EAGAIN", seen
    assert seen["pids.max"] == str(POLICY["pids"])
    assert seen["pids.current_at_refusal"] == str(POLICY["pids"])
    assert 0 < seen["children"] < POLICY["pids"]
    # The kernel's own count of refusals at the limit, read by the host from the container's cgroup.
    (witness,) = witness_pool.seen
    assert witness["cgroup"], "the host never read the container's cgroup"
    assert witness["cgroup"]["pids.max"] == str(POLICY["pids"])
    events = dict(line.split() for line in witness["cgroup"]["pids.events"].splitlines())
    assert int(events["max"]) >= 1


class Listener:
    """A TCP listener on every host address; counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.accepted.append(peer[0])
            conn.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
        self.sock.close()
        self._thread.join(timeout=5)


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    try:
        yield server
    finally:
        server.close()


def bridge_gateway(docker: Any) -> str:
    """The host's address on the default bridge: its IPAM gateway, or (a dockerd that found docker0 already
    up records only the subnet) the subnet's first address, which is the one dockerd gives docker0."""
    configs = docker.api.inspect_network("bridge")["IPAM"]["Config"]
    gateways = [str(c["Gateway"]) for c in configs if c.get("Gateway")]
    if gateways:
        return gateways[0]
    (subnet,) = [c["Subnet"] for c in configs if ":" not in c.get("Subnet", ":")]
    return str(next(ipaddress.ip_network(subnet).hosts()))


@pytest.mark.timeout(ONE_RERUN_S + 90)
async def test_the_guest_cannot_reach_a_listener_on_the_host(
    client: LedgerClient, docker: Any, sandbox_image: str, witness_pool: WitnessPool, listener: Listener,
    nats_url: str,
) -> None:  # fmt: skip
    gateway = bridge_gateway(docker)
    nats_port = int(nats_url.rsplit(":", 1)[1])
    targets = [["127.0.0.1", listener.port], [gateway, listener.port], ["127.0.0.1", nats_port]]
    # Controls: the host reaches the listener at both addresses (and its NATS server), and so does a
    # container that has a network: the addresses are live, the probe can connect.
    assert set(connect_all(targets).values()) == {"CONNECTED"}
    control = docker.containers.run(
        sandbox_image, ["python3", "-c", f"import socket; socket.create_connection(('{gateway}', {listener.port}), "
                                         "timeout=5).close(); print('CONNECTED')"],
        network_mode="bridge", remove=True, user="10001:10001",
    )  # fmt: skip
    assert b"CONNECTED" in control
    assert len(listener.accepted) == 3
    accepted_before = list(listener.accepted)

    seen = await probe(client, witness_pool, "connect_spec", {"targets": targets})
    # The guest's loopback is its own (nothing listens there); the gateway has no route.
    assert seen == {
        f"127.0.0.1:{listener.port}": "ECONNREFUSED",
        f"{gateway}:{listener.port}": "ENETUNREACH",
        f"127.0.0.1:{nats_port}": "ECONNREFUSED",
    }
    assert listener.accepted == accepted_before  # the listener saw no connection from the sandbox


# -- code identity -------------------------------------------------------------------------------------------


AGENT_SOURCE = """
from runledger import AgentSpec, ScriptedModel

MARK = "{mark}"


async def agent(run):
    await run.now()
    return MARK


def spec():
    return AgentSpec("codeid", agent, ScriptedModel([]))
"""


@pytest.fixture
def agent_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh agent package of its own (a name no other test imports), importable on the host."""
    name = f"rl_codeid_{os.urandom(4).hex()}"
    package = tmp_path / "code" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "agent.py").write_text(AGENT_SOURCE.format(mark="original"))
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    # Outside the working directory: allowed as an operator would (re-runs load only allowed code).
    monkeypatch.setenv(ALLOW_CODE_ENV, f".,runledger.examples,{name}")
    try:
        yield package
    finally:
        shutil.rmtree(package, ignore_errors=True)


def tamper(package: Path) -> str:
    """Change the agent's code on disk; returns the code hash of what is now there (computed afresh)."""
    (package / "agent.py").write_text(AGENT_SOURCE.format(mark="tampered"))
    # Computed afresh, leaving this process's cache alone (it still runs the code it imported).
    closure = code_identity.import_closure.__wrapped__(f"{package.name}.agent")
    return code_identity.closure_digest(closure)


@pytest.mark.timeout(2 * ONE_RERUN_S + 30)
async def test_a_guest_whose_mounted_code_differs_from_the_recorded_version_is_refused(
    client: LedgerClient, witness_pool: WitnessPool, agent_package: Path
) -> None:
    """The host checked the code it imported; the sandbox mounts the code on disk, which changed
    since (a worker process imports an agent once and hashes it once): the guest hashes what it
    was given and refuses to run it under the recorded version."""
    ref = f"{agent_package.name}.agent:spec"
    spec = load_agent(ref)
    recorded = spec.version().agent_version
    assert recorded == code_hash(spec.fn)
    assert (await start_run(client, spec, None, run_id="codeid-parent")).status == "completed"
    rerunner = Rerunner(client, witness_pool)
    same = await rerunner.rerun(RerunRequest(parent_run_id="codeid-parent", agent=ref, mode="redrive", fork_step=0))
    assert same.status == "completed" and same.output == "original", same.error  # the control: same code runs

    on_disk = tamper(agent_package)
    assert on_disk != recorded
    result = await rerunner.rerun(RerunRequest(parent_run_id="codeid-parent", agent=ref, mode="redrive", fork_step=0))
    assert result.status == "failed" and result.reason == "exception", result
    # Refused by the check that loads the branch's code in the image before any step (Refusal.IMAGE),
    # naming both versions.
    error = result.error or ""
    assert "is another version there" in error and on_disk in error and recorded in error, error
    assert result.output is None
    events = [r.event.type for r in (await load_run(client, result.run_id)).records]
    assert "clock.read" not in events  # the tampered agent never ran a step
    assert fold((await load_run(client, result.run_id)).records).status == "failed"


@pytest.mark.timeout(ONE_RERUN_S + 30)
async def test_code_changed_since_the_record_reruns_as_a_counterfactual_of_the_agent_element(
    client: LedgerClient, docker: Any, witness_pool: WitnessPool, agent_package: Path
) -> None:
    """A worker started after the agent's code changed on disk hashes that code: the re-run is the agent
    counterfactual it is, stated in its result and its run.forked, and the sandbox runs the code the host
    hashed (the guest checks it). Before, the host refused it (VersionMismatchError, "refusing to resume")."""
    ref = f"{agent_package.name}.agent:spec"
    recorded = load_agent(ref).version().agent_version
    assert (await start_run(client, load_agent(ref), None, run_id="codeid-host")).status == "completed"
    on_disk = tamper(agent_package)
    code_identity.forget()  # as a worker started after the change would: it hashes the code now on disk
    result = await Rerunner(client, witness_pool).rerun(
        RerunRequest(parent_run_id="codeid-host", agent=ref, mode="redrive", fork_step=0)
    )
    assert (result.status, result.output) == ("completed", "tampered"), result.error
    assert (result.mode, result.changed, result.changed_from, result.changed_to) == (
        "counterfactual", "agent_version", recorded, on_disk)  # fmt: skip
    assert result.change_note == f"agent code changed: {recorded} -> {on_disk}"
    forked = fold((await load_run(client, result.run_id)).records).parent or {}
    request = forked["request"]
    assert (forked["mode"], forked["changed"], request["base_mode"]) == ("counterfactual", "agent_version", "redrive")
