"""Probe agents for the hardening tests: each looks at the sandbox from inside and returns what it
saw as its output (a completed run), so the test compares the guest's own view with what the host
configured and with host-side witnesses. Nothing runs at import time: the host imports this too.

The parent runs are recorded with ``parent``; every probe lives in the same package (same code
hash), so a re-run of a parent can execute any of them in the sandbox.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import stat
import time
from typing import Any

from runledger import AgentSpec, Run, ScriptedModel, tool


@tool("ping")
def ping(args: Any) -> str:
    return f"pong {args}"


async def parent(run: Run) -> Any:
    return await run.tool("ping", 1)


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


# -- what the container looks like from inside ------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _cgroup(v1: str, v2: str) -> str | None:
    """A cgroup file of this container: the v1 controller's file, else the v2 unified one."""
    found = _read(f"/sys/fs/cgroup/{v1}")
    return found if found is not None else _read(f"/sys/fs/cgroup/{v2}")


def _status() -> dict[str, str]:
    fields = {}
    for line in (_read("/proc/self/status") or "").splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return fields


def _root_mount_options() -> str | None:
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        parts = line.split()
        if len(parts) > 5 and parts[4] == "/":
            return parts[5]
    return None


def _sockets() -> list[str]:
    """Every unix socket file in the container's filesystem (the kernel's views /proc and /sys aside)."""
    found = []
    for top, dirs, files in os.walk("/", onerror=lambda e: None):
        if top == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "sys")]
        for name in dirs + files:
            path = os.path.join(top, name)
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    found.append(path)
            except OSError:
                continue
    return sorted(found)


def _docker_socket_reachable() -> dict[str, str]:
    results = {}
    for path in ("/var/run/docker.sock", "/run/docker.sock"):
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(path)
                results[path] = "CONNECTED"
            except OSError as exc:
                results[path] = _errno_name(exc)
    return results


def _process_environments() -> dict[str, str]:
    """The environment of every process the guest can read (its own, its init's)."""
    seen = {}
    for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                seen[pid] = f.read().decode(errors="replace").replace("\0", "\n")
        except OSError as exc:
            seen[pid] = f"unreadable: {_errno_name(exc)}"
    return seen


def _write_root() -> str:
    try:
        with open("/probe-write", "w") as f:
            f.write("x")
        return "WRITTEN"
    except OSError as exc:
        return _errno_name(exc)


async def inspect_container(run: Run) -> dict[str, Any]:
    await run.tool("ping", 1)
    status = _status()
    return {
        "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
        "status": {k: status.get(k) for k in ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                                              "NoNewPrivs", "Seccomp")},
        "ipc_ns": os.readlink("/proc/self/ns/ipc"),
        "net_ns": os.readlink("/proc/self/ns/net"),
        "dev_shm": os.path.exists("/dev/shm"),
        "interfaces": sorted(os.listdir("/sys/class/net")),
        "cgroup": {
            "pids.max": _cgroup("pids/pids.max", "pids.max"),
            "cpu.cfs_quota_us": _cgroup("cpu/cpu.cfs_quota_us", "cpu.max"),
            "cpu.cfs_period_us": _cgroup("cpu/cpu.cfs_period_us", "cpu.max"),
            "memory.limit": _cgroup("memory/memory.limit_in_bytes", "memory.max"),
            "memory+swap.limit": _cgroup("memory/memory.memsw.limit_in_bytes", "memory.swap.max"),
        },
        "root_mount_options": _root_mount_options(),
        "root_write": _write_root(),
        "sockets": _sockets(),
        "docker_socket": _docker_socket_reachable(),
        "environ": dict(os.environ),
        "process_environments": _process_environments(),
    }  # fmt: skip


# -- the pids limit -------------------------------------------------------------------------------------


async def fork_until_refused(run: Run) -> dict[str, Any]:
    """Fork idle children until the kernel refuses one (at most ``run.input["max_children"]``), report
    the refusal and the pids counter at that moment, then kill the children.

    The children sleep instead of spinning, so the probe stays far from the wall-clock limit and
    cannot be mistaken for a re-run killed by it."""
    await run.tool("ping", 1)
    cap = int((run.input or {}).get("max_children", 200))
    children: list[int] = []
    refused: dict[str, Any] | None = None
    pids_current = None
    try:
        for _ in range(cap):
            pid = os.fork()
            if pid == 0:  # the child: idle until killed, never back into the agent
                try:
                    time.sleep(300)
                finally:
                    os._exit(0)
            children.append(pid)
    except OSError as exc:
        pids_current = _cgroup("pids/pids.current", "pids.current")
        refused = {"errno": _errno_name(exc), "message": str(exc)}
        await asyncio.sleep(0.5)  # at the limit a while: the host reads the cgroup's counters meanwhile
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    for pid in children:
        os.waitpid(pid, 0)
    return {
        "children": len(children),
        "refused": refused,
        "pids.current_at_refusal": pids_current,
        "pids.max": _cgroup("pids/pids.max", "pids.max"),
    }


# -- the network ---------------------------------------------------------------------------------------


def connect_all(targets: list[list[Any]], timeout: float = 3.0) -> dict[str, str]:
    """Try a TCP connection to each ``[host, port]``: "CONNECTED" or the error's errno name.
    The host runs the same function as a control (the listener answers it)."""
    results = {}
    for host, port in targets:
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
            results[f"{host}:{port}"] = "CONNECTED"
        except TimeoutError:
            results[f"{host}:{port}"] = "TIMEOUT"
        except OSError as exc:
            results[f"{host}:{port}"] = _errno_name(exc)
    return results


async def connect_out(run: Run) -> dict[str, str]:
    await run.tool("ping", 1)
    return connect_all(run.input["targets"])


def _spec(fn: Any) -> AgentSpec:
    return AgentSpec("probe", fn, ScriptedModel([]), tools=[ping])


def parent_spec() -> AgentSpec:
    return _spec(parent)


def inspect_spec() -> AgentSpec:
    return _spec(inspect_container)


def fork_spec() -> AgentSpec:
    return _spec(fork_until_refused)


def connect_spec() -> AgentSpec:
    return _spec(connect_out)
