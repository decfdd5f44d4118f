"""Named crash points for crash tests: the process SIGKILLs itself where the test says.

``RUNLEDGER_CRASH_AT=effect:refund:order-1:acted`` kills the process right after the
refund function returned and before its outcome is recorded. Names:
``step:<n>:recorded`` (after step n's event was recorded: acknowledged, or in the window of a
run in output durability, runledger.log.window),
``effect:<key>:claimed`` / ``effect:<key>:acted`` / ``effect:<key>:recorded``, and
``child:<n>:started`` (a parent's ``child.started`` of step n acknowledged, the child not started).
``RUNLEDGER_CRASH_SKIP=N`` passes the point N times before the kill (the 5th re-run of a
worker, say). Both are read once, when this module is imported (a test sets them in the environment
of the process it starts): a point then costs one comparison.

``RUNLEDGER_PAUSE_AT=<name>`` with ``RUNLEDGER_PAUSE_DIR`` and ``RUNLEDGER_PAUSE_COUNT``
makes processes wait at a named point until COUNT of them arrived (a barrier
across processes), so a test can start two resumes "at once" without sleeps.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ENV = "RUNLEDGER_CRASH_AT"
SKIP_ENV = "RUNLEDGER_CRASH_SKIP"
_target = os.environ.get(ENV)
_skip = int(os.environ.get(SKIP_ENV, "0")) if _target is not None else 0
_passed = 0


def crash_point(name: str) -> None:
    global _passed
    if _target is not None and _target == name:
        if _passed >= _skip:
            os.kill(os.getpid(), signal.SIGKILL)
        _passed += 1


def pause_point(name: str, timeout_s: float = 30.0) -> None:
    if os.environ.get("RUNLEDGER_PAUSE_AT") != name:
        return
    barrier = Path(os.environ["RUNLEDGER_PAUSE_DIR"])
    count = int(os.environ.get("RUNLEDGER_PAUSE_COUNT", "2"))
    barrier.mkdir(parents=True, exist_ok=True)
    (barrier / str(os.getpid())).touch()
    deadline = time.monotonic() + timeout_s
    while len(list(barrier.iterdir())) < count and time.monotonic() < deadline:
        time.sleep(0.01)
