"""Named crash points for crash tests: the process SIGKILLs itself where the test says.

``RUNLEDGER_CRASH_AT=effect:refund:order-1:acted`` kills the process right after the
refund function returned and before its outcome is recorded. Names:
``step:<n>:recorded`` (after step n's event was acknowledged) and
``effect:<key>:claimed`` / ``effect:<key>:acted`` / ``effect:<key>:recorded``.
Costs one environment lookup when unset.
"""

from __future__ import annotations

import os
import signal

ENV = "RUNLEDGER_CRASH_AT"


def crash_point(name: str) -> None:
    target = os.environ.get(ENV)
    if target is not None and target == name:
        os.kill(os.getpid(), signal.SIGKILL)
