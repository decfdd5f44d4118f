"""CPU seconds by process, for the re-drive bench: what one sandbox costs the machine, and who pays.

Wall-clock rates on a shared 2-core machine move with other work; CPU seconds per container do
much less, and they bound the rate: N containers need N x (CPU per container) / cores seconds
whatever the code does around them. ``CpuMeter`` reads the counters that need no tool: the
engine's daemons (``dockerd``, ``containerd``: /proc/PID/stat), every container together (the
cgroup ``docker``: the guest, its init and runc's init inside it; cgroup v1 ``cpuacct`` or v2
``cpu.stat``), this process (the host: broker, branch runs, docker client) and the log server.

The containerd shims and the ``runc`` runs are children of no process here that reaps them into
a counter (the shims are re-parented to PID 1), so /proc cannot attribute them; ``PerfSampler``
does, when ``perf`` is installed and allowed: system-wide ``cpu-clock`` samples, one per
millisecond of CPU, counted by command name. Without perf those two stay out of the sums,
which are then lower bounds (said so in the report).

Rejected: the machine's total (/proc/stat) minus the rest (other engineers' work on the same
cores lands in it); process accounting (``acct``: a system-wide switch that outlives a crashed
bench); moving the engine into a cgroup of our own (it is the machine's engine, not the bench's).
"""

from __future__ import annotations

import collections
import contextlib
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
DAEMONS = ("dockerd", "containerd")
CGROUPS = (
    ("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage", 1e9),  # v1: nanoseconds
    ("/sys/fs/cgroup/docker/cpu.stat", 1e6),  # v2, cgroupfs driver: usage_usec
    ("/sys/fs/cgroup/system.slice/cpu.stat", 1e6),  # v2, systemd driver (docker-*.scope below it)
)
# perf's command names of what /proc cannot attribute: the shims and runc's runs outside the
# container's cgroup (runc's init, ``runc:[2:INIT]``, runs in it and is counted there). Its
# bootstrap stages (``runc:[0:PARENT]``, ``runc:[1:CHILD]``, ~2 ms) are left out: a floor must not
# count anything twice.
PERF_GROUPS = {"containerd-shim": "shim", "runc": "runc"}


def pids_named(name: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry}/comm").read_text().strip() == name:
                    found.append(int(entry))
    return found


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) of a live process, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15 of stat)


def containers_cpu() -> float | None:
    """CPU seconds of every container ever run under the engine's cgroup (a parent's counter keeps
    its removed children's time), or None when no known layout is found."""
    for path, unit in CGROUPS:
        with contextlib.suppress(OSError, ValueError):
            text = Path(path).read_text()
            if path.endswith("cpu.stat"):
                usage = dict(line.split() for line in text.splitlines())["usage_usec"]
                return int(usage) / unit
            return int(text) / unit
    return None


@dataclass
class CpuMeter:
    """Snapshots of the counters above; ``since(snapshot)`` gives seconds spent by each meanwhile.

    ``server_pid``: the log server's process (nats-server), counted as ``server``."""

    server_pid: int | None = None
    pids: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pids = {name: pids_named(name) for name in DAEMONS}
        if self.server_pid is not None:
            self.pids["server"] = [self.server_pid]

    def snapshot(self) -> dict[str, float]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        snap = {"host": usage.ru_utime + usage.ru_stime, "wall": time.monotonic()}
        for name, pids in self.pids.items():
            values = [v for v in map(process_cpu, pids) if v is not None]
            if values:
                snap[name] = sum(values)
        containers = containers_cpu()
        if containers is not None:
            snap["containers"] = containers
        return snap

    @staticmethod
    def since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {name: after[name] - before[name] for name in before if name in after}


class PerfSampler:
    """``perf record -a -e cpu-clock`` (a sample per millisecond of CPU) while the block runs;
    ``ms`` then holds milliseconds of CPU by group of ``PERF_GROUPS`` (every other command is
    left out), or stays None when perf is missing or refuses (``why`` says which)."""

    def __init__(self) -> None:
        self.ms: dict[str, float] | None = None
        self.available = shutil.which("perf") is not None
        self.why = "" if self.available else "perf is not installed"

    @contextlib.contextmanager
    def sampling(self) -> Iterator[None]:
        if not self.available:
            yield
            return
        tmp = Path(tempfile.mkdtemp(prefix="bench-perf-"))
        data = tmp / "perf.data"
        cmd = ["perf", "record", "-q", "-a", "-e", "cpu-clock", "-c", "1000000", "-o", str(data)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # perf opens its events before the block starts
        try:
            yield
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                err = b"perf did not stop"
            # perf record ends on SIGINT by re-raising it once its data is written: -SIGINT here.
            stopped = proc.returncode in (0, -signal.SIGINT)
            self.ms = self._count(data) if stopped and data.exists() else None
            if self.ms is None:
                self.why = f"perf failed: {err.decode(errors='replace')[-200:].strip()}"
            shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _count(data: Path) -> dict[str, float] | None:
        done = subprocess.run(
            ["perf", "script", "-i", str(data), "-F", "comm"], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            return None
        counts: collections.Counter[str] = collections.Counter()
        for line in done.stdout.splitlines():
            group = PERF_GROUPS.get(line.strip())
            if group is not None:
                counts[group] += 1
        return {name: float(counts[name]) for name in sorted(set(PERF_GROUPS.values()))}
