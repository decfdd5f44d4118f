"""A local JetStream cluster: N nats-server nodes on loopback, for development and tests.

``runledger up --cluster 3`` starts three nodes that route to each other, each with its
own data dir, client port, route port and monitoring port, and ``sync_interval: always``
like the one-node server. Streams created through it get 3 replicas (``runledger.log.streams``):
a step is acknowledged once a majority of nodes stored it, so the log survives losing any
one node. The state (ports, pids) lives in ``<home>/cluster.json``; ``down`` stops every
node. A production cluster is the same configuration on three machines:
``deploy/nats/cluster/`` and docs/scale.md.

The client URL is every node's URL joined by commas; nats-py picks one and fails over to
the others, and the SDK retries a publish across a leader election (``runledger.log.publish``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from runledger.errors import ServerError
from runledger.log.private import open_private, private_dir, private_umask, write_private
from runledger.log.server import (
    check_data_dir,
    free_port,
    log_tail,
    nats_server_binary,
    pid_alive,
    port_accepts,
    runledger_home,
)

CLUSTER_NAME = "runledger"


@dataclass
class NodeState:
    name: str
    port: int
    route_port: int
    monitor_port: int
    data_dir: str
    config: str
    log: str
    pid: int = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


@dataclass
class ClusterState:
    nodes: list[NodeState] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Every node's client URL, comma separated: what agents, workers and analysts connect to."""
        return ",".join(n.url for n in self.nodes)

    def node(self, name: str) -> NodeState:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in this cluster (nodes: {', '.join(n.name for n in self.nodes)})")


def node_config(node: NodeState, peers: list[NodeState], *, sync_always: bool = True) -> str:
    """The nats-server configuration of one node (the shape of deploy/nats/cluster/*.conf)."""
    routes = ", ".join(f"nats-route://127.0.0.1:{p.route_port}" for p in peers if p.name != node.name)
    lines = [
        f'server_name: "{node.name}"',
        f"listen: 127.0.0.1:{node.port}",
        f"http: 127.0.0.1:{node.monitor_port}",
        "max_payload: 1MB",
        "jetstream {",
        f'  store_dir: "{node.data_dir}"',
        "  sync_interval: always" if sync_always else "",
        "}",
        "cluster {",
        f"  name: {CLUSTER_NAME}",
        f"  listen: 127.0.0.1:{node.route_port}",
        f"  routes: [{routes}]",
        "}",
    ]
    return "\n".join(line for line in lines if line) + "\n"


class LocalCluster:
    """Start, find, kill, restart and stop the nodes of a loopback cluster."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or runledger_home()
        self.state_file = self.home / "cluster.json"

    def state(self) -> ClusterState | None:
        """The cluster's state when at least one node runs (a stale state file is removed)."""
        try:
            raw = json.loads(self.state_file.read_text())
            state = ClusterState(nodes=[NodeState(**n) for n in raw["nodes"]])
        except (OSError, ValueError, TypeError, KeyError):
            return None
        if not any(n.pid and pid_alive(n.pid) for n in state.nodes):
            with contextlib.suppress(OSError):
                self.state_file.unlink()
            return None
        return state

    def start(
        self, *, size: int = 3, data_dir: Path | None = None, sync_always: bool = True, timeout: float = 20.0
    ) -> ClusterState:
        """Start ``size`` nodes (or return the running cluster) once every node accepts clients.

        JetStream needs a moment more to elect its meta leader: ``runledger.log.client.connect``
        waits for it when it creates the streams.
        """
        running = self.state()
        if running is not None:
            return running
        if size < 1:
            raise ServerError(f"a cluster needs at least one node, not {size}")
        data_dir = (data_dir or self.home / "cluster-data").resolve()
        private_dir(self.home)  # 0700 and its files 0600, as the embedded server's (runledger.log.private)
        nodes = []
        for i in range(1, size + 1):
            name = f"n{i}"
            node_dir = data_dir / name
            check_data_dir(node_dir)
            nodes.append(
                NodeState(
                    name=name,
                    port=free_port(),
                    route_port=free_port(),
                    monitor_port=free_port(),
                    data_dir=str(node_dir),
                    config=str(self.home / f"cluster-{name}.conf"),
                    log=str(self.home / f"cluster-{name}.log"),
                )
            )
        for node in nodes:
            write_private(Path(node.config), node_config(node, nodes, sync_always=sync_always))
        state = ClusterState(nodes=nodes)
        for node in nodes:
            node.pid = self._spawn(node)
        self._save(state)
        for node in nodes:
            self._wait_accepting(node, timeout)
        return state

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one node (SIGKILL: the node dies without flushing anything)."""
        state = self._require()
        node = state.node(name)
        if node.pid and pid_alive(node.pid):
            os.kill(node.pid, sig)
            deadline = time.monotonic() + 10
            while pid_alive(node.pid) and time.monotonic() < deadline:
                time.sleep(0.02)

    def restart(self, name: str, timeout: float = 20.0) -> NodeState:
        """Start a stopped node again with its ports and data dir (it catches up from its peers)."""
        state = self._require()
        node = state.node(name)
        if node.pid and pid_alive(node.pid):
            return node
        node.pid = self._spawn(node)
        self._save(state)
        self._wait_accepting(node, timeout)
        return node

    def healthy(self, name: str) -> bool:
        """The node's /healthz: JetStream enabled and its streams current with the leader."""
        import urllib.error  # here: every CLI command reads the cluster's state, few ask its health
        import urllib.request

        node = self._require().node(name)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{node.monitor_port}/healthz", timeout=1) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every running node reports healthy; ServerError naming the laggards otherwise."""
        deadline = time.monotonic() + timeout
        state = self._require()
        while True:
            sick = [n.name for n in state.nodes if not self.healthy(n.name)]
            if not sick:
                return
            if time.monotonic() > deadline:
                raise ServerError(f"cluster nodes not healthy after {timeout:g}s: {', '.join(sick)}")
            time.sleep(0.1)

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop every node (SIGTERM, then SIGKILL). False when no node was running."""
        state = self.state()
        if state is None:
            return False
        alive = [n for n in state.nodes if n.pid and pid_alive(n.pid)]
        for node in alive:
            os.kill(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(pid_alive(n.pid) for n in alive):
            time.sleep(0.05)
        for node in alive:
            if pid_alive(node.pid):
                os.kill(node.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.state_file.unlink()
        return True

    def _require(self) -> ClusterState:
        state = self.state()
        if state is None:
            raise ServerError("no local cluster is running: start one with `runledger up --cluster 3`")
        return state

    def _save(self, state: ClusterState) -> None:
        write_private(self.state_file, json.dumps({"nodes": [asdict(n) for n in state.nodes]}))

    def _spawn(self, node: NodeState) -> int:
        with os.fdopen(open_private(Path(node.log), "ab"), "ab") as out, private_umask():
            proc = subprocess.Popen(
                [nats_server_binary(), "-c", node.config],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return proc.pid

    def _wait_accepting(self, node: NodeState, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not pid_alive(node.pid):
                raise ServerError(f"cluster node {node.name} exited:\n{log_tail(Path(node.log))}")
            if port_accepts(node.port):
                return
            time.sleep(0.05)
        tail = log_tail(Path(node.log))
        raise ServerError(f"cluster node {node.name} did not accept connections in {timeout:g}s:\n{tail}")
