"""Whether a claim's holder is certainly gone: only a process of this host and pid namespace
whose pid no longer runs with the same start time."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from runledger.sdk.holder import _pid_namespace, _start_ticks, is_gone, this_holder


def test_this_process_is_a_live_holder() -> None:
    me = this_holder()
    assert me.startswith(socket.gethostname() + "/") and not is_gone(me)


def test_a_process_that_exited_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    holder = f"{socket.gethostname()}/{_pid_namespace()}/{child.pid}/{_start_ticks(child.pid)}"
    assert not is_gone(holder)
    child.communicate(b"")
    assert is_gone(holder)


def test_a_reused_pid_is_not_the_holder() -> None:
    host, namespace, pid, start = this_holder().split("/")
    assert is_gone(f"{host}/{namespace}/{pid}/{int(start) + 1}")  # same pid, another start: not us


def test_anything_it_cannot_tell_is_not_gone() -> None:
    namespace = this_holder().split("/")[1]
    host = socket.gethostname()
    for holder in (None, "", "garbage", f"another-host/{namespace}/999999/1", f"{host}/pid:[1]/999999/1"):
        assert not is_gone(holder), holder


def test_the_start_time_survives_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    # The kernel names a process after the file it executes: "a) (b c" makes /proc/<pid>/stat
    # read "<pid> (a) (b c) S ...", which a split on spaces or on the first ")" misreads.
    odd = tmp_path / "a) (b c"
    odd.symlink_to(sys.executable)
    child = subprocess.Popen([str(odd), "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert "(a) (b c)" in Path(f"/proc/{child.pid}/stat").read_text()
        ticks = _start_ticks(child.pid)
        assert ticks is not None and ticks.isdigit()
        assert ticks == Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    finally:
        child.communicate(b"")


def test_a_running_run_is_stalled_only_when_its_holder_is_certainly_gone() -> None:
    from runledger.ops.trace import live_status

    namespace = this_holder().split("/")[1]
    dead = f"{socket.gethostname()}/{namespace}/999999/1"
    assert live_status("running", this_holder()) == "running"  # this process: alive
    assert live_status("running", dead) == "stalled"
    assert live_status("running", None) == "running"  # recorded before holders, or another host: not judged
    assert live_status("suspended", dead) == "suspended"  # only a running run can stall
