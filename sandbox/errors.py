"""Errors of the sandbox package.

SandboxError(LedgerError)
├── ImageError               the sandbox image cannot be built or found
├── DockerUnavailableError   no Docker engine answers
├── SandboxViolation         the re-run broke a limit or the channel protocol (recorded as its failure)
├── DivergenceError          a re-drive made a call the record cannot answer (recorded as its failure)
└── RerunRequestError        a re-run request that cannot be honoured (bad mode, tuple change...)
"""

from __future__ import annotations

from runledger.errors import LedgerError


class SandboxError(LedgerError):
    pass


class ImageError(SandboxError):
    pass


class DockerUnavailableError(SandboxError):
    def __init__(self, reason: str) -> None:
        super().__init__(
            f"no Docker engine: {reason}. Start one (`bash deploy/docker/ensure-docker.sh` installs and "
            "starts dockerd), or set DOCKER_HOST"
        )


class SandboxViolation(SandboxError):
    """The agent in the container broke a limit or the protocol; the re-run fails with this."""

    failure_reason = "sandbox"


class DivergenceError(SandboxError):
    failure_reason = "diverged"

    def __init__(self, run_id: str, step: int, recorded: str, attempted: str) -> None:
        self.run_id = run_id
        self.step = step
        self.recorded = recorded
        self.attempted = attempted
        super().__init__(
            f"re-drive of {run_id} diverged at step {step}: the agent called {attempted}, "
            f"the record has {recorded}; the record cannot answer it"
        )


class RerunRequestError(SandboxError):
    pass
