"""Every error the sandbox package raises.

    LedgerError                          (runledger.errors)
    └── SandboxError
        ├── ImageError                   the sandbox image cannot be built or found
        ├── DockerUnavailableError       no Docker engine answers
        ├── SandboxViolation             the re-run broke a limit or the channel protocol (recorded as its failure)
        ├── ChannelError                 a malformed, oversized or unexpected message on the channel
        ├── AgentFailedError             (host) the agent raised inside the sandbox (recorded as its failure)
        ├── RemoteError                  (guest) the broker reported an error no SDK error type matches
        └── RerunRequestError            a re-run request that cannot be honoured (bad mode, tuple change...)

A re-drive that makes a call the record cannot answer raises the core's
``runledger.errors.NondeterminismError`` with ``diverged=True`` (recorded as the branch's
failure, reason ``diverged``): one error for a replay that leaves its record, wherever it runs.

Messages say what is wrong and what to do next. Docker's errors are translated at the
boundary with ``raise ... from exc``.

Every class here is a LedgerError, so the ``except LedgerError`` handlers see them: the worker
reports it and drops or retries the request, the sweep reports it and goes on, the CLI prints
it. That is meant for the errors of a request (its image, its Docker engine, its parameters, a
sandbox that never came up). The errors of a re-run's agent (``AgentFailedError``,
``ChannelError``, a ``SandboxViolation`` of the running agent) are raised inside the agent
function that ``drive`` (runledger.sdk.lifecycle) calls, which records any exception as the
branch's ``run.failed``: they are the re-run's outcome and never reach those handlers.
"""

from __future__ import annotations

from typing import Any

from runledger.errors import LedgerError


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


class SandboxViolation(SandboxError):
    """The agent in the container broke a limit or the protocol; the re-run fails with this."""

    failure_reason = "sandbox"


class ChannelError(SandboxError):
    """A malformed, oversized or unexpected message. The broker turns it into a SandboxViolation."""


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


class RerunRequestError(SandboxError):
    pass
