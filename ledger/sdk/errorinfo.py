"""The recorded form of an exception (an event's ``error``), for every step that records one.

Its own module because runledger.sdk.run and runledger.sdk.effect_step (the run's base) both
record failures and neither may import the other's module.
"""

from __future__ import annotations

import traceback

from runledger.record.events import ErrorInfo


def error_info(exc: BaseException, with_traceback: bool = True, *, retryable: bool = False) -> ErrorInfo:
    """The recorded form of an exception. An error reported from elsewhere (a sandboxed
    agent) keeps its own type name and traceback via ``remote_type`` / ``remote_traceback``."""
    tb = getattr(exc, "remote_traceback", None)
    if tb is None and with_traceback:
        tb = "".join(traceback.format_exception(exc))
    return ErrorInfo(
        type=getattr(exc, "remote_type", type(exc).__name__), message=str(exc), traceback=tb, retryable=retryable
    )
