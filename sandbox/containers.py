"""Hardened containers for re-runs, and a warm pool that keeps start-up off the critical path.

Each sandbox is one container (no network, read-only root, a small tmpfs, every
capability dropped, no-new-privileges, a non-root user, limits on memory, CPU and pids,
no host environment, no Docker socket) plus a private directory holding the unix socket
of its channel: only the socket itself is mounted (at /run/runledger/broker.sock), so no
directory of the host is writable from the guest (a mounted directory is host disk, outside
the tmpfs limit: 300 MB were written through one). The agent's code is mounted read-only: each
top-level package or module of its import closure (``code_mounts``) at /app/<name>, never the
host's site-packages nor its standard library (the image has its own). A warm sandbox has its
guest started, the SDK imported and the channel
connected, and the agent's module imported (the pool is keyed by the agent as well as its code
directory, so the guest loads the agent before it says hello); it waits to be given a re-run.

Every container is removed on every path: explicitly after each re-run, by ``close()``,
and, for containers a crashed worker left behind, by ``reap_orphans()`` at start-up
(containers are labelled with their owner's host and pid).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runledger.log.server import pid_alive
from runledger.sandbox.channel import MAX_LINE, MAX_VALUES, read_message
from runledger.sandbox.errors import RerunRequestError, SandboxError, SandboxViolationError
from runledger.sdk.code_identity import defining_module, find_module, import_closure

LABEL = "runledger.sandbox"
OWNER = f"{socket.gethostname()}:{os.getpid()}"
GUEST_COMMAND = ["python3", "-m", "runledger.sandbox.guest", "/run/runledger/broker.sock"]
GUEST_ENVIRONMENT = {"PYTHONPATH": "/app:/opt/runledger:/opt/runledger/site"}
SOCKET_IN_GUEST = "/run/runledger/broker.sock"
CODE_IN_GUEST = "/app"
RUNTIME_IN_GUEST = "/opt/runledger"
# (host path, path in the guest) of each piece of agent code a sandbox mounts read-only, sorted.
CodeMounts = tuple[tuple[str, str], ...]
# The secrets an operator allows re-runs to resolve (comma-separated), when the policy is not given them.
SECRETS_ENV = "RUNLEDGER_RERUN_SECRETS"


def _operator_secrets() -> frozenset[str]:
    return frozenset(name.strip() for name in os.environ.get(SECRETS_ENV, "").split(",") if name.strip())


@dataclass(frozen=True)
class SandboxPolicy:
    """Limits of one sandbox and of what its re-run may do on the host. Frozen: a policy is
    decided before the re-run starts, and the host enforces every field (the guest proposes,
    the host decides; docs/sandbox.md, "What the broker decides").

    ``io_timeout_s`` bounds every write to the guest (a guest that stops reading its replies
    fails its branch); ``max_events``, ``max_bytes`` and ``max_blobs`` cap what one re-run
    records (events of the branch, their bytes with blob bodies, payloads stored as blobs);
    ``max_host_cpu_s`` and ``max_request_cpu_s`` bound the host CPU the broker spends for the
    guest (in all, and on one request: parsing, checks, recording, the host's tools and model
    client; ``runledger.cpu`` says what is counted), checked between requests;
    ``max_tokens`` caps a live model call's ``max_tokens``; ``secrets`` are the names a re-run
    may resolve (``secret://NAME``) for a tool that declares them (default: ``$RUNLEDGER_RERUN_SECRETS``,
    comma-separated; none when unset)."""

    image: str = "runledger/sandbox:latest"
    memory: str = "256m"
    cpus: float = 1.0
    pids: int = 64
    tmpfs_size: str = "64m"
    timeout_s: float = 60.0
    connect_timeout_s: float = 30.0
    io_timeout_s: float = 10.0
    max_events: int = 10_000
    max_bytes: int = 256 * 1024 * 1024
    max_blobs: int = 1_000
    max_host_cpu_s: float = 10.0
    max_request_cpu_s: float = 5.0
    max_tokens: int = 4_096
    secrets: frozenset[str] = field(default_factory=_operator_secrets)


@dataclass(eq=False)
class Sandbox:
    api: Any  # docker's low-level APIClient: one request per step, no inspect after create (see _create)
    container_id: str
    sock_dir: Path
    server: asyncio.Server
    connected: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
    code_key: tuple[CodeMounts, str]
    created: float = field(default_factory=time.monotonic)
    hello: dict[str, Any] | None = None

    async def channel(self, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.wait_for(asyncio.shield(self.connected), timeout=timeout)
        except TimeoutError as exc:
            raise SandboxViolationError(
                f"the sandbox did not connect within {timeout:g}s ({await self.describe()})"
            ) from exc

    async def state(self) -> dict[str, Any] | None:
        """The container's State (docker inspect), or None when it is gone."""
        try:
            attrs = await asyncio.to_thread(self.api.inspect_container, self.container_id)
        except Exception:  # docker-py raises NotFound, APIError and requests' errors alike
            return None
        state: dict[str, Any] = attrs.get("State") or {}
        return state

    async def describe(self, wait_s: float = 3.0) -> str:
        """What the container's state says about how it ended (OOM, exit code).

        Waits up to ``wait_s`` for it to exit: when the agent's process is OOM-killed the
        channel closes before the container's init has exited and the flag is set."""
        with contextlib.suppress(Exception):  # docker raises requests' ConnectionError on timeout
            await asyncio.wait_for(
                asyncio.to_thread(self.api.wait, self.container_id, timeout=wait_s), timeout=wait_s + 1
            )
        state = await self.state()
        if state is None:
            return "container gone"
        if state.get("OOMKilled"):
            return "killed for exceeding its memory limit (OOM)"
        if state.get("Running"):
            return "still running"
        return f"exited with code {state.get('ExitCode')}"


def code_mounts(fn: Any, ref: str = "") -> CodeMounts:
    """What a sandbox mounts to run the agent function ``fn``, loaded by the name ``ref``
    (``module:attribute``, whose module may be another: a factory that reuses an agent function):
    each top-level package or module of their import closure (``runledger.sdk.code_identity``: the
    modules of the agent's own project they import), at /app/<name>; runledger's examples over the
    image's copy of them. A candidate fix in
    a package of its own that imports the original gets both; a file beside the agent that nothing
    imports is still there (its package's folder is mounted whole, data files included) and changes
    no hash. Never the host's site-packages or standard library: the image has its own, and a
    candidate that needs a package the image lacks fails to load (``rerun --plan`` says so first).

    Raises RerunRequestError when the agent's code cannot be mounted (no module, a namespace
    package spread over several folders)."""
    module = defining_module(fn)
    closure = import_closure(module) if module else ()
    named = ref.partition(":")[0]
    if named and named != module:
        closure += import_closure(named)
    if not closure or module == "__main__":
        raise RerunRequestError(
            f"the agent function {getattr(fn, '__qualname__', fn)!r} is not in a module a sandbox can import "
            f"(it is in {module!r}): define it in a module or package of its own"
        )
    mounts: dict[str, str] = {}
    for unit in sorted({_mount_unit(m.name) for m in closure}):
        mounts[_host_location(unit)] = _guest_location(unit)
    return tuple(sorted(mounts.items(), key=lambda kv: kv[1]))


def _mount_unit(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "runledger" else parts[0]


def _host_location(unit: str) -> str:
    spec = find_module(unit)
    # One folder can be listed twice (a namespace package found through '' and the working directory alike).
    places = list(dict.fromkeys(str(Path(p).resolve()) for p in (spec.submodule_search_locations or []))) \
        if spec is not None else []  # fmt: skip
    if spec is not None and not places and spec.origin:
        return str(Path(spec.origin).resolve())  # a top-level module: its file
    if len(places) != 1:
        raise RerunRequestError(
            f"the agent's code imports {unit!r}, which spreads over {len(places)} folders "
            f"({', '.join(places) or 'none'}): a sandbox mounts one folder per top-level package"
        )
    return str(Path(places[0]).resolve())


def _guest_location(unit: str) -> str:
    if unit.startswith("runledger."):
        return f"{RUNTIME_IN_GUEST}/" + unit.replace(".", "/")
    spec = find_module(unit)
    single_file = spec is not None and not spec.submodule_search_locations
    return f"{CODE_IN_GUEST}/{unit}" + (".py" if single_file else "")


def package_mounts(code_root: Path, package: str) -> CodeMounts:
    """The mounts of one package: ``package``'s folder below ``code_root`` (for a subpackage of
    runledger, ``code_root`` is its own folder), as ``code_mounts`` would give an agent importing only it."""
    if package.startswith("runledger."):
        return ((str(code_root), f"{RUNTIME_IN_GUEST}/" + package.replace(".", "/")),)
    return ((str(code_root / package), f"{CODE_IN_GUEST}/{package}"),)


def _mounts(code: CodeMounts, sock_dir: Path) -> dict[str, dict[str, str]]:
    # The socket alone, not its directory: a socket cannot be written to as a file, so nothing of
    # the host's disk is writable from the guest (the directory stays 0700, the broker's own).
    return {
        str(sock_dir / "broker.sock"): {"bind": SOCKET_IN_GUEST, "mode": "rw"},
        **{host: {"bind": guest, "mode": "ro"} for host, guest in code},
    }


def hardened_container(
    api: Any, policy: SandboxPolicy, command: list[str], binds: dict[str, dict[str, str]], labels: dict[str, str]
) -> dict[str, Any]:
    """The arguments of docker's ``create_container`` for one sandbox: every hardening of the module
    docstring, the policy's limits, ``command`` as the non-root user, ``binds`` and ``labels``. One
    definition, so that what bench/rerun.py measures as the engine's own cost of a container is the
    cost of exactly this configuration."""
    p = policy
    # The low-level API: ``containers.create`` inspects the new container after creating
    # it, and ``Container.reload`` again when it is removed. Two inspects per sandbox were
    # dockerd CPU (~8 ms each here) on the path that bounds re-runs per second.
    host_config = api.create_host_config(
        network_mode="none", read_only=True, tmpfs={"/tmp": f"size={p.tmpfs_size},mode=1777"},
        cap_drop=["ALL"], security_opt=["no-new-privileges"], ipc_mode="none",
        pids_limit=p.pids, mem_limit=p.memory, memswap_limit=p.memory, nano_cpus=int(p.cpus * 1e9),
        init=True, binds=binds, log_config={"type": "none", "config": {}},
    )  # fmt: skip
    return {
        "image": p.image, "command": command, "user": "10001:10001", "environment": GUEST_ENVIRONMENT,
        "working_dir": "/app", "labels": labels, "host_config": host_config, "stdin_open": False, "tty": False,
        # With networking disabled as well as mode none, the container still gets a new,
        # empty network namespace (loopback only), but dockerd skips libnetwork: no
        # sandbox to create and delete, and no libnetwork-setkey prestart hook, which
        # re-executes the whole dockerd binary for every container. That was about half
        # of the engine's CPU per sandbox here (docs/sandbox.md, "Start-up cost").
        "network_disabled": True,
    }  # fmt: skip


class SandboxPool:
    """Creates sandboxes and keeps ``size`` warm ones per agent code directory."""

    def __init__(self, docker: Any, policy: SandboxPolicy = SandboxPolicy(), *, size: int = 2) -> None:
        self.docker = docker
        self.policy = policy
        self.size = size
        self._warm: dict[tuple[CodeMounts, str], list[Sandbox]] = {}
        self._all: set[Sandbox] = set()
        self._refills: dict[asyncio.Task[None], tuple[CodeMounts, str]] = {}
        self._finishing: set[asyncio.Task[None]] = set()
        self.cold_starts = 0
        self.warm_hits = 0
        self.pool_id = uuid.uuid4().hex[:12]

    # -- lifecycle -----------------------------------------------------------------------------------

    def reap_orphans(self) -> int:
        """Remove sandboxes whose owner process on this host is gone. Returns how many."""
        host = socket.gethostname()
        removed = 0
        for container in self._listed({"label": LABEL}):
            owner = (container.get("Labels") or {}).get(f"{LABEL}.owner", "")
            owner_host, _, pid = owner.partition(":")
            # Only this host's pids can be checked: a sandbox of another host sharing the engine (a
            # worker in a container has its own hostname) is alive as far as anyone here can tell.
            if owner_host != host or (pid.isdigit() and pid_alive(int(pid))):
                continue
            with contextlib.suppress(Exception):
                self.docker.api.remove_container(container["Id"], force=True)
                removed += 1
        return removed

    def _listed(self, filters: dict[str, str]) -> list[dict[str, Any]]:
        # The low-level list: ``containers.list`` inspects each container after listing and
        # raises NotFound when one is removed in between (by its owner, say).
        listed: list[dict[str, Any]] = self.docker.api.containers(all=True, filters=filters)
        return listed

    async def _create(self, code: CodeMounts, agent: str = "") -> Sandbox:
        sock_dir = Path(tempfile.mkdtemp(prefix="rl-sbx-"))  # 0700: only the socket in it is mounted
        loop = asyncio.get_running_loop()
        connected: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = loop.create_future()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if connected.done():
                writer.close()  # one connection per sandbox: a second one is refused
                return
            connected.set_result((reader, writer))

        path = sock_dir / "broker.sock"
        server = await asyncio.start_unix_server(on_connect, path=str(path), limit=MAX_LINE)
        path.chmod(0o777)  # the guest runs as an unprivileged uid and must be able to connect
        p = self.policy
        api = self.docker.api
        try:
            created = await asyncio.to_thread(
                api.create_container,
                # The agent to load ahead (its import and factory are the guest's slowest step
                # after the SDK's); the guest still loads whatever its re-run names.
                **hardened_container(
                    api,
                    p,
                    [*GUEST_COMMAND, agent] if agent else GUEST_COMMAND,
                    _mounts(code, sock_dir),
                    {LABEL: "1", f"{LABEL}.owner": OWNER, f"{LABEL}.pool": self.pool_id},
                ),
            )
            container_id = str(created["Id"])
            await asyncio.to_thread(api.start, container_id)
        except Exception as exc:
            server.close()
            shutil.rmtree(sock_dir, ignore_errors=True)
            raise SandboxError(f"could not start a sandbox from {p.image}: {exc}") from exc
        sandbox = Sandbox(api, container_id, sock_dir, server, connected, (code, agent))
        self._all.add(sandbox)
        return sandbox

    async def _warm_up(self, sandbox: Sandbox) -> Sandbox:
        reader, _ = await sandbox.channel(self.policy.connect_timeout_s)
        try:
            sandbox.hello = await asyncio.wait_for(
                read_message(reader, MAX_VALUES), timeout=self.policy.connect_timeout_s
            )
        except Exception as exc:
            raise SandboxViolationError(f"the sandbox did not say hello ({exc})") from exc
        return sandbox

    async def acquire(self, code: CodeMounts, agent: str = "") -> Sandbox:
        """A sandbox whose guest is connected and waiting: warm if one is ready, else cold. A cold one
        that does not say hello is removed before the error (SandboxViolationError) is raised.

        ``code``: what it mounts (``code_mounts``). ``agent`` (``module:attribute``), when given, is
        loaded by the guest before it says hello (its hello says whether it loaded: ``preloaded``);
        sandboxes are pooled per (code, agent)."""
        key = (code, agent)
        while True:
            warm = self._warm.get(key, [])
            if warm:
                self.warm_hits += 1
                sandbox = warm.pop(0)
                self._refill(*key)
                return sandbox
            if not any(k == key for k in self._refills.values()):
                break
            # A sandbox is already warming up for this agent: it will be ready sooner than a new cold one.
            await asyncio.wait(list(self._refills), return_when=asyncio.FIRST_COMPLETED)
        self.cold_starts += 1
        sandbox = await self._create(code, agent)
        try:
            await self._warm_up(sandbox)
        except BaseException:  # garbage before the hello, no connection, or cancelled: removed now
            await self.discard(sandbox)
            raise
        self._refill(*key)
        return sandbox

    async def probe(self, code: CodeMounts, agent: str) -> dict[str, Any]:
        """Start a sandbox that loads ``agent`` from ``code``, and return what its hello says of it
        (``{"agent", "agent_version"}``, or ``{"agent", "error"}`` when it could not be loaded in the
        image); the sandbox is removed before this returns. Nothing of a re-run runs: the agent's
        module is imported and its factory called, in the hardened container, as a re-run's guest would.
        Raises SandboxError / SandboxViolationError when no sandbox can be had."""
        sandbox = await self._create(code, agent)
        try:
            await self._warm_up(sandbox)
            hello = sandbox.hello or {}
            report = hello.get("preloaded") if isinstance(hello, dict) else None
            if not isinstance(report, dict):
                raise SandboxViolationError("the sandbox's hello did not say whether the agent loaded")
            return report
        finally:
            await self.discard(sandbox)

    def _refill(self, code: CodeMounts, agent: str = "") -> None:
        if self.size <= 0:
            return
        key = (code, agent)
        missing = self.size - len(self._warm.get(key, [])) - len(self._refills)
        for _ in range(max(0, missing)):
            task = asyncio.create_task(self._add_warm(key))
            self._refills[task] = key
            task.add_done_callback(self._refill_done)

    def _refill_done(self, task: asyncio.Task[None]) -> None:
        self._refills.pop(task, None)

    async def _add_warm(self, key: tuple[CodeMounts, str]) -> None:
        sandbox: Sandbox | None = None
        try:
            sandbox = await self._create(*key)
            await self._warm_up(sandbox)
            self._warm.setdefault(key, []).append(sandbox)
        except (SandboxError, OSError):
            if sandbox is not None:  # created but never said hello: remove it now, not at close()
                await self.discard(sandbox)

    async def prewarm(self, code: CodeMounts, agent: str = "") -> None:
        """Fill the pool for one agent's code (and agent) and wait until it is warm."""
        self._refill(code, agent)
        while self._refills:
            await asyncio.gather(*list(self._refills), return_exceptions=True)

    async def settle(self) -> None:
        """Return once nothing of this pool is being created or removed (its refills and the
        removals ``finish_later`` started), so that a caller measuring a batch of re-runs counts
        each one's containers once."""
        while self._refills or self._finishing:
            await asyncio.gather(*list(self._refills), *list(self._finishing), return_exceptions=True)

    def finish_later(self, sandbox: Sandbox, exit_s: float = 2.0) -> None:
        """Remove a sandbox whose guest reported its outcome, off the critical path (``close`` waits
        for it), once the guest has exited by itself (at most ``exit_s``, then it is killed).

        The guest exits right after its outcome has left it (``os._exit``), but the removal came
        sooner: its container was still running at 16 of 17 removals in a run here. A forced
        removal of a running container costs the engine a kill (one more ``runc`` run and the
        shim's work: 12-20 ms of CPU per sandbox, measured with ``perf`` against removing an
        exited one). The wait holds an executor thread for those few milliseconds."""
        task = asyncio.create_task(self._finish_exited(sandbox, exit_s))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _finish_exited(self, sandbox: Sandbox, exit_s: float) -> None:
        with contextlib.suppress(Exception):  # docker raises requests' ConnectionError on timeout
            await asyncio.wait_for(
                asyncio.to_thread(sandbox.api.wait, sandbox.container_id, timeout=exit_s), timeout=exit_s + 1
            )
        await self.discard(sandbox)

    async def finish(self, sandbox: Sandbox, grace_s: float = 5.0) -> dict[str, Any]:
        """Wait briefly for the container to exit by itself, then remove it. Returns its final state."""
        state: dict[str, Any] = {}
        try:
            result = await asyncio.wait_for(asyncio.to_thread(sandbox.api.wait, sandbox.container_id), timeout=grace_s)
            state["exit_code"] = result.get("StatusCode")
        except Exception:
            state["exit_code"] = None
        await self.discard(sandbox, state)
        return state

    async def discard(self, sandbox: Sandbox, state: dict[str, Any] | None = None) -> None:
        if state is not None:
            final = await sandbox.state()
            if final is not None:
                state["oom_killed"] = bool(final.get("OOMKilled"))
        with contextlib.suppress(Exception):
            await asyncio.to_thread(sandbox.api.remove_container, sandbox.container_id, force=True)
        if sandbox.connected.done() and not sandbox.connected.cancelled():
            _, writer = sandbox.connected.result()
            writer.transport.abort()  # replies a guest never read are dropped, not flushed forever
        sandbox.server.close()
        shutil.rmtree(sandbox.sock_dir, ignore_errors=True)
        self._all.discard(sandbox)

    async def close(self) -> None:
        """Remove every sandbox of this pool, including one whose creation was interrupted."""
        interrupted = bool(self._refills)
        await asyncio.gather(*list(self._finishing), return_exceptions=True)
        for task in list(self._refills):
            task.cancel()
        await asyncio.gather(*list(self._refills), return_exceptions=True)
        for sandbox in list(self._all):
            await self.discard(sandbox)
        self._warm.clear()
        if interrupted:
            await asyncio.sleep(1.0)  # a create running in a worker thread finishes after the cancel
        await asyncio.to_thread(self._sweep)

    def _sweep(self) -> None:
        for container in self._listed({"label": f"{LABEL}.pool={self.pool_id}"}):
            with contextlib.suppress(Exception):
                self.docker.api.remove_container(container["Id"], force=True)

    def __len__(self) -> int:
        return len(self._all)
