"""Named crash points of the projector, for crash tests: the process SIGKILLs itself there.

``RUNLEDGER_PROJECTOR_CRASH_AT=after_insert_before_commit`` kills the projector the first
time it has inserted a batch's rows but not committed them; ``NAME@N`` the N-th time.
Points: ``batch_read`` (a batch was read, nothing written), ``after_insert_before_commit``,
``after_commit``, ``rebuild_before_swap`` (the fresh file is complete, not yet in place).
Costs one dictionary lookup when unset.
"""

from __future__ import annotations

import os
import signal

ENV = "RUNLEDGER_PROJECTOR_CRASH_AT"
_passed: dict[str, int] = {}


def crash_point(name: str) -> None:
    target = os.environ.get(ENV)
    if not target:
        return
    wanted, _, nth = target.partition("@")
    if wanted != name:
        return
    _passed[name] = _passed.get(name, 0) + 1
    if _passed[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
