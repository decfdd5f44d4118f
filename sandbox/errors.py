"""Every error the sandbox package raises.

    LedgerError                          (runledger.errors)
    └── SandboxError
        ├── ImageError                   the sandbox image cannot be built or found
        ├── DockerUnavailableError       no Docker engine answers
        ├── SandboxViolationError        the re-run broke a limit or the channel protocol (recorded as its failure)
        ├── ChannelError                 a malformed, oversized or unexpected message on the channel
        ├── AgentFailedError             (host) the agent raised inside the sandbox (recorded as its failure)
        ├── RemoteError                  (guest) the broker reported an error no SDK error type matches
        ├── SecretNotAllowedError        a re-run's tool named a secret it does not declare or may not use
        ├── RerunRequestError            a re-run request that cannot be honoured (bad mode, tuple change...)
        │   └── RunErasedError           the run to re-run was erased: its content is gone
        └── RerunDeadLetteredError       a worker gave up on a re-run request that kept failing (recorded on its branch)

Every refusal of a re-run before its first step is one of ``Refusal``'s classes, carried by the
error (``refusal_of``): a RerunRequestError, or a core error the re-run tagged (a name outside the
allow-list, an agent that does not load, a version tuple that differs). ``rerun --plan`` reports
the same classes (runledger.sandbox.plan).

A re-drive that makes a call the record cannot answer raises the core's
``runledger.errors.NondeterminismError`` with ``diverged=True`` (recorded as the branch's
failure, reason ``diverged``): one error for a replay that leaves its record, wherever it runs.

Messages say what is wrong and what to do next. Docker's errors are translated at the
boundary with ``raise ... from exc``.

Every class here is a LedgerError, so the ``except LedgerError`` handlers see them: the worker
reports it and drops or retries the request, the sweep reports it and goes on, the CLI prints
it. That is meant for the errors of a request (its image, its Docker engine, its parameters, a
sandbox that never came up). The errors of a re-run's agent (``AgentFailedError``,
``ChannelError``, a ``SandboxViolationError`` of the running agent) are raised inside the agent
function that ``drive`` (runledger.sdk.lifecycle) calls, which records any exception as the
branch's ``run.failed``: they are the re-run's outcome and never reach those handlers.
"""

from __future__ import annotations

import enum
from typing import Any, TypeVar

from runledger.errors import LedgerError

E = TypeVar("E", bound=BaseException)


class SandboxError(LedgerError):
    pass


class ImageError(SandboxError):
    pass


class DockerUnavailableError(SandboxError):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"no Docker engine: {reason}. Start one (`bash deploy/docker/ensure-docker.sh` installs and "
            "starts dockerd), or set DOCKER_HOST"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason,), self.__dict__)


class SandboxViolationError(SandboxError):
    """The agent in the container broke a limit or the protocol; the re-run fails with this."""

    failure_reason = "sandbox"


class ChannelError(SandboxError):
    """A malformed, oversized or unexpected message. The broker turns it into a SandboxViolationError."""


class AgentFailedError(SandboxError):
    """The agent function raised inside the sandbox; recorded with its own type and traceback.

    Raised by the broker into ``drive``, which records it as the branch's failure (reason
    ``exception``) under ``remote_type``, the agent's own error type, not this class's name."""

    def __init__(self, error: dict[str, Any]) -> None:
        self.remote_type = str(error.get("type", "Exception"))[:200]
        self.remote_traceback = str(error.get("traceback", ""))[-20_000:] or None
        super().__init__(str(error.get("message", ""))[:20_000])

    def __reduce__(self) -> tuple[Any, ...]:
        error = {"type": self.remote_type, "message": str(self), "traceback": self.remote_traceback or ""}
        return (type(self), (error,), self.__dict__)


class RemoteError(SandboxError):
    """In the guest: an error the broker reported for a call, when no SDK error type matches it.

    A LedgerError like every error the broker forwards (a failed tool or effect, a denied
    approval), so an agent's ``except LedgerError`` handles it in the sandbox as it would
    handle the real error on the host."""


class SecretNotAllowedError(SandboxError):
    """A ``secret://NAME`` in the arguments of a tool a re-run calls, which the tool does not
    declare (``missing="declared"``) or the operator does not allow for re-runs (``"allowed"``).
    Nothing was looked up; the tool's call fails with this (the agent sees a ToolFailedError)."""

    def __init__(self, tool: str, name: str, missing: str) -> None:
        self.tool = tool
        self.name = name
        self.missing = missing
        if missing == "declared":
            advice = f"declare it on the tool (@tool({tool!r}, secrets=[{name!r}]))"
        else:
            advice = "allow it for re-runs (SandboxPolicy(secrets=...), or $RUNLEDGER_RERUN_SECRETS for a worker)"
        super().__init__(
            f"tool {tool!r} may not resolve secret://{name} in a re-run: only secrets a tool declares and the "
            f"operator allows resolve in a sandboxed re-run; {advice}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.tool, self.name, self.missing), self.__dict__)


class Refusal(enum.StrEnum):
    """Every reason a re-run is refused: before its agent's first step (the request:
    ``runledger.sandbox.rerun.preflight``) or at a recorded step by its mode's rules (``BranchRun``).
    The one list the re-run raises from (the error carries its class, ``refusal_of``) and the plan
    reports (``BranchPlan.refusals``, ``StepPlan.refusal``), so a refusal the plan does not know
    cannot be added unnoticed (tests/integration/sandbox/test_refusals.py enumerates them)."""

    REPLAY = "replay"  # trace replay executes nothing
    CHANGE = "change"  # --set without a counterfactual, or not exactly one changeable element
    NOT_ALLOWED = "not_allowed"  # a name outside the operator's allow-list of code
    AGENT = "agent"  # the agent named cannot be loaded (import, attribute, factory, not an AgentSpec)
    NOT_PACKAGED = "not_packaged"  # the agent function lives outside a package: nothing to mount
    NO_START = "no_start"  # the parent has no run.started
    ERASED = "erased"  # the parent was erased
    VERSION = "version"  # the agent named is not the code that recorded the run
    CANDIDATE = "candidate"  # the counterfactual's value cannot be loaded
    ELEMENT = "element"  # the counterfactual changes no element, or more than its own
    TOOL_CODE = "tool_code"  # --set tools changes an implementation (a code change) or the set of tools
    FORK_STEP = "fork_step"  # the fork step is outside 0..last step + 1
    # The code the branch runs does not load in the sandbox image, or is another version there: the plan
    # starts one sandbox to see (runledger.sandbox.candidate); the re-run fails its branch before step 0.
    IMAGE = "image"
    # At a recorded step, by the mode's rules (BranchRun raises them; the plan marks the step refused):
    NO_OUTCOME = "no_outcome"  # a step served from the record holds no outcome (an effect or child without one)
    TOOL_NOT_LIVE = "tool_not_live"  # live: a read tool not marked --live-tool, from the fork on
    CHILD_LIVE = "child_live"  # live: a child run from the fork on (its code would run on the host)


def tagged(exc: E, refusal: Refusal) -> E:
    """``exc`` marked as a refusal of class ``refusal`` (``refusal_of`` reads it back)."""
    exc.refusal = refusal  # type: ignore[attr-defined]
    return exc


def refusal_of(exc: BaseException) -> Refusal | None:
    """The refusal class of an error a re-run raised before its first step, or None."""
    found = getattr(exc, "refusal", None)
    return found if isinstance(found, Refusal) else None


class RerunRequestError(SandboxError):
    """A re-run request that cannot be honoured; ``refusal`` says which rule refused it."""

    def __init__(self, message: str, refusal: Refusal | None = None) -> None:
        super().__init__(message)
        if refusal is not None:
            self.refusal = refusal


class RunErasedError(RerunRequestError):
    """The run to re-run (or the parent of a branch being started) was erased: there is nothing to
    re-run it from. Permanent, like every RerunRequestError: the worker drops the request."""

    def __init__(self, run_id: str, erased: dict[str, Any]) -> None:
        self.run_id = run_id
        self.erased = dict(erased)
        cause = f", because run {erased['because_of']} was" if erased.get("because_of") else ""
        super().__init__(
            f"run {run_id} was erased{cause} (by {erased.get('by')}: {erased.get('reason')}): its content is gone, "
            f"so it cannot be re-run or branched. Its structure is still readable: `runledger show {run_id}`",
            Refusal.ERASED,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.erased), self.__dict__)


class RerunDeadLetteredError(SandboxError):
    """A re-run request failed its worker ``deliveries`` times (an unexpected error handling it, or
    a worker that died on it) and will not be tried again; recorded as its branch's ``run.failed``.

    ``cause``: what went wrong the last time, as text (safe to record: no lone surrogates)."""

    def __init__(self, request_id: str, deliveries: int, cause: str) -> None:
        self.request_id = request_id
        self.deliveries = deliveries
        self.cause = cause
        super().__init__(
            f"re-run request {request_id} dead-lettered after {deliveries} deliveries: {cause}. It is not "
            "retried; fix the cause and queue a new request (`runledger rerun RUN ...`)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.request_id, self.deliveries, self.cause), self.__dict__)
