"""Every error the ledger package raises.

    LedgerError
    ├── ConfigurationError            bad command-line or environment input
    ├── MissingExtraError             an optional part is not installed (also an ImportError)
    ├── ServerError                   the embedded nats-server could not start / stop
    │   ├── PortInUseError
    │   └── DataDirError
    ├── ConnectionFailedError         no NATS server answered at a URL
    ├── PublishError                  an event was not acknowledged within the retry bound
    │   └── FencedError               another writer owns the run (server-side fencing)
    ├── EventDecodeError              bytes that are not a valid event (quarantined by readers)
    │   └── UnknownSchemaVersionError
    ├── RunNotFoundError
    ├── LedgerReadError               a subject or the stream could not be read completely and in order
    │   └── StreamGapError            a stream sequence went missing between two messages
    ├── VersionMismatchError          resume with a different version tuple
    ├── NondeterminismError           replayed code made a different call than the record
    ├── EffectInDoubtError            an effect was claimed but has no recorded outcome
    ├── EffectFailedError             the effect function raised; the failure is recorded
    ├── BudgetExhaustedError          a run hit a turn, token or wall-clock limit
    ├── ApprovalDeniedError
    ├── SuspendedForApproval          not a failure: the run waits for an approval
    ├── ToolFailedError               a tool raised (recorded; replays as this error)
    ├── EffectClaimedElsewhereError   another run holds an unresolved claim on the key
    └── ChainError                    the hash chain or sequence of a run is broken

Messages say what is wrong and what to do next. Third-party errors (nats, OS) are
translated at the boundary with ``raise ... from exc``.
"""

from __future__ import annotations

from typing import Any


class LedgerError(Exception):
    """Base of every runledger error."""


class ConfigurationError(LedgerError):
    pass


class MissingExtraError(LedgerError, ImportError):
    """A feature needs an extra that is not installed; the message is the one line that installs it."""

    def __init__(self, extra: str, feature: str, missing: str) -> None:
        self.extra = extra
        self.feature = feature
        self.missing = missing
        super().__init__(
            f"{feature} needs the {extra} extra ({missing} is not installed): pip install 'runledger[{extra}]'"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.extra, self.feature, self.missing))


class ServerError(LedgerError):
    pass


class PortInUseError(ServerError):
    def __init__(self, port: int) -> None:
        self.port = port
        super().__init__(
            f"port {port} is already in use: pick another with --port N, "
            f"or stop whatever listens there (`ss -ltnp 'sport = :{port}'`)"
        )


class DataDirError(ServerError):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        super().__init__(f"data dir {path!r} is not usable: {reason}; pass a writable --data-dir DIR")


class ConnectionFailedError(LedgerError):
    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        super().__init__(
            f"no NATS server reachable at {url}: {reason}. Start one with `runledger up`, "
            "or point --nats / RUNLEDGER_NATS_URL at a running server"
        )


class PublishError(LedgerError):
    def __init__(self, subject: str, msg_id: str, reason: str) -> None:
        self.subject = subject
        self.msg_id = msg_id
        super().__init__(
            f"event {msg_id} on {subject} was not acknowledged: {reason}. Nothing after it was "
            "recorded; resume the run once the server is reachable (`runledger resume RUN ...`)"
        )


class FencedError(PublishError):
    def __init__(self, subject: str, msg_id: str, expected: int, actual: int | None) -> None:
        self.expected = expected
        self.actual = actual
        LedgerError.__init__(
            self,
            f"another writer owns {subject}: this process expected its last event at stream "
            f"sequence {expected} but the server has {actual if actual is not None else 'a later one'}. "
            "This process must stop; the run continues in the process that fenced it out",
        )
        self.subject = subject
        self.msg_id = msg_id


class EventDecodeError(LedgerError):
    def __init__(self, reason: str, raw: bytes = b"") -> None:
        self.reason = reason
        self.raw = raw
        super().__init__(reason)


class UnknownSchemaVersionError(EventDecodeError):
    def __init__(self, type_: str, version: int, known: int, raw: bytes = b"") -> None:
        self.type = type_
        self.version = version
        super().__init__(
            f"event type {type_!r} has schema_version {version}, this runledger knows up to {known}: "
            "upgrade runledger to read it",
            raw,
        )


class LedgerReadError(LedgerError):
    """A subject or the stream could not be read completely and in order: the read is an error,
    never a shorter history. Reading again is safe."""


class StreamGapError(LedgerReadError):
    def __init__(self, expected: int, got: int) -> None:
        self.expected = expected
        self.got = got
        super().__init__(
            f"read stream sequence {got} where {expected} was expected: messages were lost on the way; read again"
        )


class RunNotFoundError(LedgerError):
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} in the ledger: list runs with `runledger runs`")


class VersionMismatchError(LedgerError):
    def __init__(self, run_id: str, recorded: dict[str, Any], current: dict[str, Any]) -> None:
        self.run_id = run_id
        self.recorded = recorded
        self.current = current
        self.differs = sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))
        lines = [f"  {k}: recorded {recorded.get(k)!r}, now {current.get(k)!r}" for k in self.differs]
        super().__init__(
            f"run {run_id} was recorded with a different version tuple; refusing to resume.\n"
            + "\n".join(lines)
            + "\nResume with the recorded code, model, prompt and tools, or fork a counterfactual branch."
        )


class NondeterminismError(LedgerError):
    def __init__(self, run_id: str, step: int, recorded: str, attempted: str) -> None:
        self.run_id = run_id
        self.step = step
        self.recorded = recorded
        self.attempted = attempted
        super().__init__(
            f"run {run_id} step {step}: the code now calls {attempted} where the record has {recorded}. "
            "The agent code changed before the resume point; resume with the recorded code or fork a branch"
        )


class EffectInDoubtError(LedgerError):
    def __init__(self, run_id: str, step: int, key: str) -> None:
        self.run_id = run_id
        self.step = step
        self.key = key
        super().__init__(
            f"run {run_id} step {step}: effect {key!r} was claimed but has no recorded outcome (the process "
            "died between claim and record) and the tool has no reconcile function. Check the external "
            f"system, then run `runledger effects resolve {key} --committed` or `--not-committed`, and resume"
        )


class EffectFailedError(LedgerError):
    def __init__(self, key: str, error: str) -> None:
        self.key = key
        self.error = error
        super().__init__(f"effect {key!r} failed: {error}")


class BudgetExhaustedError(LedgerError):
    def __init__(self, run_id: str, budget: str, used: float, limit: float) -> None:
        self.run_id = run_id
        self.budget = budget
        self.used = used
        self.limit = limit
        super().__init__(
            f"run {run_id} exhausted its {budget} budget ({used:g} of {limit:g}). A resume cannot refill it; "
            f"grant more explicitly with `runledger budget grant {run_id} --{budget} N --by NAME`"
        )


class ApprovalDeniedError(LedgerError):
    def __init__(self, run_id: str, request_id: str, reason: str | None) -> None:
        self.run_id = run_id
        self.request_id = request_id
        super().__init__(f"run {run_id}: approval {request_id} was denied" + (f": {reason}" if reason else ""))


class SuspendedForApproval(LedgerError):
    """Raised out of run.approval(): not a failure, the run waits for a decision."""

    def __init__(self, run_id: str, request_id: str, action: str) -> None:
        self.run_id = run_id
        self.request_id = request_id
        self.action = action
        super().__init__(
            f"run {run_id} is suspended until approval {request_id} ({action}) is resolved: "
            f"`runledger approve {run_id} {request_id} --by NAME [--deny]`, then resume"
        )


class ChainError(LedgerError):
    def __init__(self, run_id: str, seq: int, stream_seq: int | None, reason: str) -> None:
        self.run_id = run_id
        self.seq = seq
        self.stream_seq = stream_seq
        where = f" (stream sequence {stream_seq})" if stream_seq is not None else ""
        super().__init__(f"run {run_id}: event {seq}{where}: {reason}")


class ToolFailedError(LedgerError):
    """A tool raised; the failure is recorded and replays as this error."""

    def __init__(self, name: str, step: int, error_type: str, message: str) -> None:
        self.name = name
        self.step = step
        self.error_type = error_type
        super().__init__(f"tool {name!r} (step {step}) raised {error_type}: {message}")


class EffectClaimedElsewhereError(LedgerError):
    def __init__(self, key: str, run_id: str, step: int) -> None:
        self.key = key
        self.run_id = run_id
        super().__init__(
            f"effect {key!r} is claimed by run {run_id} step {step} and has no outcome yet: "
            f"resume that run, or resolve with `runledger effects resolve {key} --committed/--not-committed`"
        )
