"""The exit codes of ``runledger``: one table for every command, so a script can tell a run that
completed from one that failed, one that waits on a human, a request the ledger refused, and a
command that could not do its work at all.

====  ===============  ===========================================================================
code  name             meaning
====  ===============  ===========================================================================
0     ``OK``           the run (or branch) completed; the gate is open; any other command did
                       what it was asked
1     ``FAILED``       the run (or branch) failed; the gate is closed (a run regressed or failed
                       its check); ``verify`` found a broken chain; ``status`` found no server
2     ``USAGE``        the command line does not parse (argparse's usage error, or no command)
3     ``NOT_RERUN``    a sweep or matrix: open, but some runs could not be re-run
4     ``ERROR``        the command could not do its work: no server, no Docker engine, a missing
                       extra, an option value that cannot be used, a bad ``--where``, an
                       unexpected error (printed with its traceback). For a sweep: the sweep itself
                       failed, never a verdict about the change
5     ``SUSPENDED``    the run (or branch) waits on a human: an approval, an effect in doubt to
                       resolve, or more budget (recorded as failed, ``budget_exhausted``, until a
                       ``budget grant`` reopens it); the output names what it waits for
6     ``REFUSED``      nothing was run: a rule of the ledger refuses the request as the run is
                       recorded (another version tuple, code that no longer replays its record, a
                       branch on the host, credentials the server refuses, code outside the
                       allow-list, a re-run its plan refuses, a start on a run id another
                       agent holds, agent credentials asking for another agent's run, a ``resume``
                       of a LangGraph thread's run, which its graph drives); the message
                       says what is wrong and what to do. An option the run cannot take
                       (``--retry`` of a run that did not fail retryably) is an ``ERROR``, as any
                       unusable option
7     ``FORGED``       ``verify``: every chain is intact, but messages its writers may not write
                       were found under a run's id and quarantined (forgeries: another agent under
                       a taken id, a worker on an agent's run, a decision off the operator's
                       subject, bytes that are no event off the run's own subject); ``--json``
                       lists each by subject, writer and reason. An alarm, not a footnote: a broken
                       chain (1) is reported before it
130   ``INTERRUPTED``  Ctrl-C
====  ===============  ===========================================================================

A ``resume`` of a run that has already finished runs nothing and exits with the run's status: 0
for a completed run, 1 for a failed one (also when it failed on a retryable error: the message
gives the ``--retry`` command), 5 for one still waiting (an approval, its budget).

Rejected: one code per error class (scripts would chase a growing list; the message names the
error), and keeping 1 for every error (a script could not tell "the run failed" from "the server
was unreachable": retry later, or look at the run). The gate's codes (0, 1, 3, 4) predate this
table and keep their numbers: 4 was "the sweep itself failed" and is now that for every command.
"""

from __future__ import annotations

import enum

from runledger.errors import (
    BranchOnHostError,
    CodeNotAllowedError,
    EffectWriteRefusedError,
    NondeterminismError,
    PermissionDeniedError,
    RunIdTakenError,
    RunOfAnotherAgentError,
    VersionMismatchError,
)


class Exit(enum.IntEnum):
    """The exit code of every ``runledger`` command (the table in this module's docstring)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    NOT_RERUN = 3
    ERROR = 4
    SUSPENDED = 5
    REFUSED = 6
    FORGED = 7
    INTERRUPTED = 130


# The core's refusals: the request does not fit the run as it stands, and nothing was run.
REFUSALS: tuple[type[Exception], ...] = (
    VersionMismatchError,
    NondeterminismError,
    BranchOnHostError,
    PermissionDeniedError,
    CodeNotAllowedError,
    EffectWriteRefusedError,
    RunIdTakenError,
    RunOfAnotherAgentError,
)

_OF_STATUS = {"completed": Exit.OK, "failed": Exit.FAILED, "suspended": Exit.SUSPENDED}


def of_status(status: str, reason: str | None = None) -> Exit:
    """The exit code of a command that drove a run (or branch) and left it in ``status``, failed for
    ``reason`` (``run.failed``'s). A run stopped by its budget is recorded as failed
    (``budget_exhausted``) but waits on a human like a suspended one: a ``budget grant`` reopens
    it, so it is ``SUSPENDED``. A run neither completed, failed nor suspended (still running,
    stalled) is an ``ERROR``: the command could not drive it to one of those."""
    if status == "failed" and reason == "budget_exhausted":
        return Exit.SUSPENDED
    return _OF_STATUS.get(status, Exit.ERROR)


def of_error(exc: BaseException) -> Exit:
    """``REFUSED`` for a refusal: one of ``REFUSALS``, an error a package tagged with the rule that
    refused it (a ``refusal`` attribute, runledger.sandbox.errors.tagged), or an error raised from
    one (a resume's operator decision that the server refused); ``ERROR`` for any other."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, REFUSALS) or getattr(cause, "refusal", None) is not None:
            return Exit.REFUSED
        cause = cause.__cause__
    return Exit.ERROR
