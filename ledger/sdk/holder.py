"""Who holds an effect's claim, and whether it is certainly gone.

A claim's lease protects a holder that is paused (frozen, swapped out, stuck in a GC pause)
from being overtaken while it may still act. A holder that is certainly dead needs no such
protection, and a resume right after a crash should not wait out the whole lease for it.

The holder is named ``<host>/<pid namespace>/<pid>/<start time>``: the start time (in clock
ticks since boot, from /proc) tells a reused pid from the holder, and the pid namespace keeps
two containers that share a host name apart. ``is_gone`` says True only when the holder ran on
this host, in this pid namespace, and no process with its pid and start time exists; in every
other case (another host, another namespace, no /proc, an unreadable name) it says False and
the lease is waited for.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path


def _start_ticks(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime), counted after the command name, which may itself hold spaces and parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


@functools.cache
def this_holder() -> str:
    """This process, as named in the claims it makes ("" where /proc cannot tell)."""
    pid = os.getpid()
    namespace, start = _pid_namespace(), _start_ticks(pid)
    if namespace is None or start is None:
        return ""
    return f"{socket.gethostname()}/{namespace}/{pid}/{start}"


def is_gone(holder: str | None) -> bool:
    """True when ``holder`` is certainly not running any more (see the module docstring)."""
    if not holder:
        return False
    parts = holder.split("/")
    if len(parts) != 4 or not parts[2].isdigit():
        return False
    host, namespace, pid, start = parts
    if host != socket.gethostname() or namespace != _pid_namespace():
        return False
    return _start_ticks(int(pid)) != start
