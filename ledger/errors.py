"""Every error the core raises: one tree under ``LedgerError``.

    LedgerError
    ├── ConfigurationError            bad command-line or environment input
    │   ├── SecretNotFoundError       a ``secret://NAME`` reference resolves nowhere where the tool runs
    │   └── CodeNotAllowedError       a request names code outside the operator's allow-list (not imported, not called)
    ├── MissingExtraError             an optional part is not installed (also an ImportError)
    ├── ServerError                   the embedded nats-server could not start / stop
    │   ├── PortInUseError
    │   └── DataDirError
    ├── ConnectionFailedError         no NATS server answered at a URL
    ├── PublishError                  an event was not acknowledged within the retry bound
    │   ├── FencedError               another writer owns the run (server-side fencing)
    │   │   └── RunIdTakenError       a run's start on a run id another run (any agent's) holds: nothing was done
    │   └── PermissionDeniedError     the server refused a publish: these credentials may not write there
    ├── EventDecodeError              bytes that are not a valid event (quarantined by readers)
    │   └── UnknownSchemaVersionError
    ├── RunNotFoundError
    │   └── RunOfAnotherAgentError    an agent's credentials asked for another agent's run (they read their own only)
    ├── LedgerReadError               a subject or the stream could not be read completely and in order
    │   └── StreamGapError            a stream sequence went missing between two messages
    ├── ReaderUnavailableError        the fast readers cannot speak to this server (nats-py reads instead)
    ├── DirectGetDenied               these credentials may not read a stream by direct get (a consumer reads)
    ├── KeyStoreError                 a run's keys cannot be created, read or used (erased, altered, unreachable)
    ├── MasterKeyError                the master key that wraps run keys is malformed or unusable
    │   ├── MasterKeyMissingError     no master key is configured for this process
    │   └── WrongMasterKeyError       a run's keys were wrapped under another master key
    ├── BlobError                     the object store cannot store a blob
    │   ├── BlobMissingError          a referenced blob is not in the object store
    │   └── BlobCorruptError          a blob does not match its hash
    ├── PayloadUnavailableError       recorded content cannot be read back (hash-only, erased, missing blob)
    │   └── EffectResultErasedError   an effect's key is committed, but its result was erased: it is not done again
    ├── ModelError                    a model adapter failed (HTTP error, bad response, no scripted reply left)
    ├── VersionMismatchError          resume with a different version tuple
    ├── NondeterminismError           replayed code made a call the record cannot answer (or a re-drive diverged)
    ├── EffectInDoubtError            an effect was claimed but has no recorded outcome
    ├── EffectFailedError             the effect function raised; the failure is recorded
    ├── StaleClaimError               an effect's claim no longer lets its attempt act (``EffectContext.check``)
    │   ├── LeaseExpiredError         the claim's lease ran out by this process's clock
    │   └── ClaimTakenOverError       the key was written after the claim (a resume took it over, a resolution)
    ├── StaleFencingTokenError        a service refused a call: a newer attempt's fencing token holds its key
    ├── BudgetExhaustedError          a run hit a turn, token or wall-clock limit
    ├── ApprovalDeniedError
    ├── SuspendedForApprovalError     not a failure (alias SuspendedForApproval): the run waits for an approval
    ├── ChildFailedError              a child run failed (recorded in the parent; replays as this error)
    ├── ChildSuspendedError           not a failure: a child run waits (approval, effect in doubt), so its parent does
    ├── ToolFailedError               a tool raised (recorded; replays as this error)
    ├── ToolArgumentsError            a tool's arguments do not match its signature (recorded as its failure)
    ├── EffectClaimedElsewhereError   another run holds an unresolved claim on the key
    ├── EffectWriteRefusedError       a write on a key that its writer may not make (a worker on an agent's key)
    ├── BranchOnHostError             a re-run's branch asked to be driven on the host (it runs only in a sandbox)
    └── ChainError                    the hash chain or sequence of a run is broken

The projections and the sandbox extend the tree under ``ProjectionError`` and ``SandboxError``
(``runledger.projections.errors``, ``runledger.sandbox.errors``). Every exception class of the
package is defined in one of these three modules (tests/unit/test_errors.py keeps it so).

Messages say what is wrong and what to do next. Third-party errors (nats, OS) are
translated at the boundary with ``raise ... from exc``. An error whose ``__init__`` takes
anything but the message defines ``__reduce__`` (its arguments, then its attributes), so that
it survives pickling into another process unchanged.
"""

from __future__ import annotations

from typing import Any

# The object store of blobs, named here because this module imports nothing of the package;
# runledger.log.subjects.BLOB_BUCKET is the same name (tests/unit/test_errors.py checks it).
_BLOB_BUCKET = "LEDGER_BLOBS"


def _rebuild(cls: type[Exception], args: tuple[Any, ...], kwargs: dict[str, Any], state: dict[str, Any]) -> Exception:
    """Unpickle an error whose ``__init__`` takes keyword-only arguments (its message depends on them)."""
    error = cls(*args, **kwargs)
    error.__dict__.update(state)
    return error


class LedgerError(Exception):
    """Base of every runledger error."""


class ConfigurationError(LedgerError):
    pass


class SecretNotFoundError(ConfigurationError):
    def __init__(self, name: str, where: str) -> None:
        self.name = name
        self.where = where
        super().__init__(
            f"secret://{name} could not be resolved: no environment variable RUNLEDGER_SECRET_{name} or {name}"
            f"{where}. Provide it where the tool runs; it is never recorded"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.where), self.__dict__)


class CodeNotAllowedError(ConfigurationError):
    """A name in a request (``--agent``, ``--set model=``/``agent=``, a queued re-run, the page's form)
    points outside the code this host's operator allowed (``runledger.sdk.agent.CodeAllowList``):
    refused before anything of it is imported or called."""

    def __init__(self, ref: str, what: str, allowed: str, env: str) -> None:
        self.ref = ref
        self.what = what
        self.allowed = allowed
        self.env = env
        super().__init__(
            f"{what} {ref!r} is not on this host's allow-list of code, so it is neither imported nor called. "
            f"Allowed: {allowed}. An operator allows more with ${env}=PACKAGE,... (each package with its "
            "modules; '.' for the packages of the working directory), set where the re-run is checked: the "
            "worker, the page, or `runledger rerun`"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.ref, self.what, self.allowed, self.env), self.__dict__)


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
        return (type(self), (self.extra, self.feature, self.missing), self.__dict__)


class ServerError(LedgerError):
    pass


class PortInUseError(ServerError):
    def __init__(self, port: int) -> None:
        self.port = port
        super().__init__(
            f"port {port} is already in use: pick another with --port N, "
            f"or stop whatever listens there (`ss -ltnp 'sport = :{port}'`)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.port,), self.__dict__)


class DataDirError(ServerError):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"data dir {path!r} is not usable: {reason}; pass a writable --data-dir DIR")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.reason), self.__dict__)


class ConnectionFailedError(LedgerError):
    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(
            f"no NATS server reachable at {url}: {reason}. Start one with `runledger up`, "
            "or point --nats / RUNLEDGER_NATS_URL at a running server"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.url, self.reason), self.__dict__)


class PublishError(LedgerError):
    def __init__(self, subject: str, msg_id: str, reason: str) -> None:
        self.subject = subject
        self.msg_id = msg_id
        self.reason = reason
        super().__init__(
            f"event {msg_id} on {subject} was not acknowledged: {reason}. Nothing after it was "
            "recorded; resume the run once the server is reachable (`runledger resume RUN ...`)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.subject, self.msg_id, self.reason), self.__dict__)


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

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.subject, self.msg_id, self.expected, self.actual), self.__dict__)


class RunIdTakenError(FencedError):
    """A run's start refused: its first message claims the run id (fenced on every agent's subjects
    of it, runledger.log.subjects.fence_for), and some run already holds messages under that id.
    ``holders``: the agents with messages under it (as stream info names them). Nothing of the run
    was done."""

    def __init__(self, run_id: str, agent: str, holders: list[str]) -> None:
        self.run_id, self.agent, self.holders = run_id, agent, list(holders)
        others = ", ".join(repr(h) for h in self.holders if h != agent)
        if not others:
            what = f"run id {run_id!r} is taken: agent {agent!r} already has a run under it (resume it instead)"
        else:
            first = "claimed it first" if agent not in self.holders else f"wrote under it, as did agent {agent!r}"
            what = (
                f"run id {run_id!r} is taken: agent {others} {first} (a run id is owned by the first agent to "
                f"start a run under it), so agent {agent!r} may not start one under it"
            )
        LedgerError.__init__(self, f"{what}; nothing was recorded or done. Start with another run id, or none")
        self.subject, self.msg_id, self.expected, self.actual = f"ledger.run.*.{run_id}.*", f"{run_id}:0", 0, None

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.agent, self.holders), self.__dict__)


class PermissionDeniedError(PublishError):
    """The server refused a publish for the connection's permissions (runledger.log.permissions):
    raised as soon as the denial arrives, not after the publish's retry bound. ``who``: the
    credentials (role and agent), ``needed``: who may write ``subject``. Nothing was written."""

    def __init__(self, subject: str, who: str, needed: str) -> None:
        self.who = who
        self.needed = needed
        LedgerError.__init__(
            self,
            f"permission denied: {who} may not publish to {subject}, and nothing was recorded; {needed}",
        )
        self.subject = subject
        self.msg_id = ""
        self.reason = "permission denied"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.subject, self.who, self.needed), self.__dict__)


class EventDecodeError(LedgerError):
    def __init__(self, reason: str, raw: bytes = b"") -> None:
        self.reason = reason
        self.raw = raw
        super().__init__(reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, self.raw), self.__dict__)


class UnknownSchemaVersionError(EventDecodeError):
    def __init__(self, type_: str, version: int, known: int, raw: bytes = b"") -> None:
        self.type = type_
        self.version = version
        self.known = known
        super().__init__(
            f"event type {type_!r} has schema_version {version}, this runledger knows up to {known}: "
            "upgrade runledger to read it",
            raw,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.type, self.version, self.known, self.raw), self.__dict__)


class RunNotFoundError(LedgerError):
    """No run ``run_id`` in the ledger (nothing on its subjects)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} in the ledger: list runs with `runledger runs`")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id,), self.__dict__)


class RunOfAnotherAgentError(RunNotFoundError):
    """Agent credentials asked for a run they may not read: its id is another agent's (``owners``,
    as stream info names them), and an agent reads only its own runs."""

    def __init__(self, run_id: str, agent: str, owners: list[str]) -> None:
        self.run_id, self.agent, self.owners = run_id, agent, list(owners)
        LedgerError.__init__(
            self,
            f"run {run_id!r} is agent {', '.join(map(repr, self.owners))}'s, and the agent {agent!r} credentials read "
            f"only agent {agent!r}'s runs: read it with an operator's or analyst's credentials (--creds)",
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.agent, self.owners), self.__dict__)


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

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.expected, self.got), self.__dict__)


class ReaderUnavailableError(LedgerError):
    """The fast readers cannot talk to this server (TLS, credentials files...): use nats-py's."""


class DirectGetDenied(LedgerError):
    """The server refused this login a direct get on a stream (its permissions): read through a
    consumer where the role may create one (``runledger.log.fastread.read_subject`` does)."""


class KeyStoreError(LedgerError):
    pass


class MasterKeyError(LedgerError):
    """The master key that wraps run keys (``runledger.protect.keystore``) cannot be used. Not a
    KeyStoreError on purpose: readers treat a KeyStoreError as "no key" and show content sealed,
    while a process without the right master key must be told so, not shown less."""


class MasterKeyMissingError(MasterKeyError):
    def __init__(self, looked: str) -> None:
        self.looked = looked
        super().__init__(
            f"no master key to wrap or unwrap run keys (looked at {looked}): on the machine of the ledger run "
            "`runledger up` (it creates <home>/master.key, mode 0600); elsewhere give this process the same key "
            "in $RUNLEDGER_MASTER_KEY or $RUNLEDGER_MASTER_KEY_FILE, or name a KMS in $RUNLEDGER_KMS"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.looked,), self.__dict__)


class WrongMasterKeyError(MasterKeyError):
    def __init__(self, kid: str, wrapped_under: str, have: str) -> None:
        self.kid = kid
        self.wrapped_under = wrapped_under
        self.have = have
        super().__init__(
            f"the keys of {kid} are wrapped under master key {wrapped_under}, but this process has {have}: "
            "give it the master key the run was recorded with ($RUNLEDGER_MASTER_KEY, $RUNLEDGER_MASTER_KEY_FILE "
            "or the ledger machine's <home>/master.key)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kid, self.wrapped_under, self.have), self.__dict__)


class BlobError(LedgerError):
    pass


class BlobMissingError(BlobError):
    def __init__(self, sha256: str) -> None:
        self.sha256 = sha256
        super().__init__(
            f"blob {sha256} is not in the object store {_BLOB_BUCKET} (expired with the retention window, "
            "deleted by an erasure, or never stored): the value cannot be shown"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.sha256,), self.__dict__)


class BlobCorruptError(BlobError):
    def __init__(self, sha256: str, actual: str) -> None:
        self.sha256 = sha256
        self.actual = actual
        super().__init__(f"blob {sha256} does not match its hash (got {actual}): the object store was altered")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.sha256, self.actual), self.__dict__)


class PayloadUnavailableError(LedgerError):
    """Recorded content that cannot be read back: hash-only capture, an erased run, a missing blob."""

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(
            f"{what} is not available: {reason}. A run recorded with capture=hash-only, or erased, "
            "cannot be resumed or re-driven past this step; its structure is still readable"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.what, self.reason), self.__dict__)


class EffectResultErasedError(PayloadUnavailableError):
    """An effect whose key is committed (the action happened: it is not done again) but whose result
    was erased with the run that committed it (``committed_by``; None when only the record is known).
    Agent code that can go on without the result catches it; otherwise the run fails on it."""

    def __init__(self, key: str, committed_by: str | None, reason: str) -> None:
        self.key = key
        self.committed_by = committed_by
        PayloadUnavailableError.__init__(self, f"the result of effect {key!r}", reason)
        by = f" by run {committed_by}" if committed_by else ""
        LedgerError.__init__(
            self,
            f"effect {key!r} is committed{by}, but its result was erased ({reason}): the action happened and is "
            "not done again. Catch runledger.EffectResultErasedError to go on without its result",
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.committed_by, self.reason), self.__dict__)


class ModelError(LedgerError):
    """A model adapter's call failed. ``retryable`` when a later attempt may succeed (HTTP 429, 5xx,
    timeouts, an unreachable endpoint): a model's ``Retry`` retries those (runledger.sdk.retry)."""

    def __init__(self, message: str, *, retryable: bool = False, status: int | None = None) -> None:
        self.retryable = retryable
        self.status = status
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        options = {"retryable": self.retryable, "status": self.status}
        return (_rebuild, (type(self), (str(self),), options, self.__dict__))


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
            + "\nResume with the recorded code, model, prompt and tools, or fork a counterfactual branch"
            + (
                "; or, when the new code is a fix the run may continue with, accept its version: "
                f"`runledger resume {run_id} --accept-version {current.get('agent_version')} --by NAME --reason ...`"
                if self.differs == ["agent_version"]
                else "."
            )
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.recorded, self.current), self.__dict__)


class NondeterminismError(LedgerError):
    """Replayed code made a call that the record cannot answer, at ``step``.

    Two cases, told apart by ``diverged`` and named by ``failure_reason`` (what a branch records
    in ``run.failed``):

    - ``"nondeterminism"``: a resume, or a branch before its fork point, replayed code that calls
      something other than the record: the code changed. ``run_id`` is the run being replayed.
      In a counterfactual branch's prefix, ``changed`` names the element the branch changes and
      ``fork_step`` its fork (the message then says so instead of "the tuple is the recorded one").
    - ``"diverged"`` (``diverged=True``): a re-drive past its fork point, where the live model
      made a call that the parent's record cannot answer: the outcome of the experiment, not a
      changed program. ``run_id`` is the parent whose record was asked.
    """

    def __init__(
        self,
        run_id: str,
        step: int,
        recorded: str,
        attempted: str,
        diverged: bool = False,
        *,
        attempted_args: Any = None,
        detail: str = "",
        changed: str | None = None,
        fork_step: int | None = None,
    ) -> None:
        self.run_id = run_id
        self.step = step
        self.recorded = recorded
        self.attempted = attempted
        self.diverged = diverged
        self.attempted_args = attempted_args  # what the code passes now, for the side-by-side diff
        self.detail = detail
        self.changed = changed  # the version-tuple element a counterfactual branch changes
        self.fork_step = fork_step
        self.failure_reason = "diverged" if diverged else "nondeterminism"
        if not diverged and changed is not None:
            # A counterfactual's prefix: the tuple is NOT the recorded one, and the change is meant.
            message = (
                f"branch {run_id} step {step}, before its fork at step {fork_step}: the parent's record has "
                f"{recorded}, the branch's agent called {attempted}."
                + (f"\n{detail}" if detail else "")
                + f"\nThe branch changes {changed}; whatever it changes, every step before the fork is served "
                "from the parent's record, and this call is not the one recorded there: the changed agent "
                "does not reach the fork the way the parent did. Fork at an earlier step (at most "
                f"{step}) to let the change act from there"
            )
        elif diverged:
            message = (
                f"re-drive of {run_id} diverged at step {step}: the agent called {attempted}, "
                f"the record has {recorded}; the record cannot answer it"
            )
        else:
            # Resume refuses a changed version tuple before replaying, so here the tuple is the
            # recorded one: the message must not claim the code changed, only list what can cause it.
            message = (
                f"run {run_id} step {step}: replaying the journal, the agent now calls {attempted} "
                f"where the record has {recorded}."
                + (f"\n{detail}" if detail else "")
                + "\nThe version tuple is the recorded one, so one of these differs between the recorded run "
                "and this replay: the code, changed without a new agent_version; a value the agent reads "
                "outside the Run API (clock, randomness, environment, files, set iteration order); a value "
                "that differs between live and replay; or a record that was forged (run `runledger verify`). "
                "Resume with the recorded code, or fork a branch from an earlier step"
            )
        super().__init__(message)

    def with_detail(self, detail: str) -> NondeterminismError:
        """The same error with ``detail`` (the recorded and attempted arguments side by side) in its message."""
        return type(self)(
            self.run_id, self.step, self.recorded, self.attempted, self.diverged,
            attempted_args=self.attempted_args, detail=detail, changed=self.changed, fork_step=self.fork_step,
        )  # fmt: skip

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_nondeterminism, (self.__dict__,))


def _rebuild_nondeterminism(state: dict[str, Any]) -> NondeterminismError:
    fields = ("run_id", "step", "recorded", "attempted", "diverged")
    error = NondeterminismError(
        *(state[f] for f in fields), attempted_args=state.get("attempted_args"), detail=state.get("detail", ""),
        changed=state.get("changed"), fork_step=state.get("fork_step"),
    )  # fmt: skip
    error.__dict__.update(state)
    return error


class EffectInDoubtError(LedgerError):
    """A claim without an outcome that nothing settled: no reconcile function, or one that failed
    (``reconcile_error``: its service unreachable). The run suspends; the key stays in doubt."""

    def __init__(self, run_id: str, step: int, key: str, reconcile_error: str | None = None) -> None:
        self.run_id = run_id
        self.step = step
        self.key = key
        self.reconcile_error = reconcile_error
        why = (
            "the tool has no reconcile function"
            if reconcile_error is None
            else f"its reconcile function failed ({reconcile_error}), so nobody knows whether it happened"
        )
        super().__init__(
            f"run {run_id} step {step}: effect {key!r} was claimed but has no recorded outcome (the process "
            f"died between claim and record) and {why}. Check the external system, then run "
            f"`runledger effects resolve {key} --committed --by NAME` or `--not-committed --by NAME`, "
            f"and resume the run"
            + ("" if reconcile_error is None else " (or resume it once the reconcile's service answers again)")
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.step, self.key, self.reconcile_error), self.__dict__)


class EffectFailedError(LedgerError):
    def __init__(self, key: str, error: str) -> None:
        self.key = key
        self.error = error
        super().__init__(f"effect {key!r} failed: {error}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.error), self.__dict__)


class StaleClaimError(LedgerError):
    """An effect's claim no longer lets its attempt act: raised by ``EffectContext.check`` /
    ``acheck`` (runledger.sdk.context), which an effect function calls right before its external
    call. Raised from the effect function, it means the attempt did nothing in the world: the SDK
    records the attempt as failed, or stops with ``FencedError`` when the key was taken over."""

    def __init__(self, reason: str, key: str, run_id: str, step: int, attempt: int, fencing_token: int) -> None:
        self.reason = reason
        self.key = key
        self.run_id = run_id
        self.step = step
        self.attempt = attempt
        self.fencing_token = fencing_token
        super().__init__(
            f"run {run_id} step {step}: effect {key!r} (attempt {attempt}, fencing token {fencing_token}) "
            f"must not act: {reason}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, self.key, self.run_id, self.step, self.attempt, self.fencing_token),
                self.__dict__)  # fmt: skip


class LeaseExpiredError(StaleClaimError):
    """The claim's lease ran out by this process's own clock (or less of it is left than the caller
    asked for): the process was paused or slow, and a resume may take the key over at any moment."""

    def __init__(
        self, key: str, run_id: str, step: int, attempt: int, fencing_token: int, lease_s: float, left_s: float,
        margin_s: float = 0.0,
    ) -> None:  # fmt: skip
        self.lease_s = lease_s
        self.left_s = left_s
        self.margin_s = margin_s
        when = (
            f"ran out {-left_s:.2f}s ago" if left_s <= 0
            else f"has {left_s:.2f}s left, less than the {margin_s:g}s the call was given"
        )  # fmt: skip
        super().__init__(
            f"its claim's lease of {lease_s:g}s {when} by this process's clock (it was paused, or slower than "
            "its lease), so a resume may take the key over at any moment, or already has. Raise this from the "
            "effect function without calling the service: the attempt is recorded as failed (nothing happened; "
            "the key is free for the next attempt), or this process is fenced out if the key was taken over. "
            "Give the effect a lease longer than it takes (run.effect(..., lease_s=...), $RUNLEDGER_EFFECT_LEASE_S)",
            key, run_id, step, attempt, fencing_token,
        )  # fmt: skip

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.key, self.run_id, self.step, self.attempt, self.fencing_token, self.lease_s, self.left_s,
                self.margin_s)  # fmt: skip
        return (type(self), args, self.__dict__)


class ClaimTakenOverError(StaleClaimError):
    """The key's subject no longer ends at this attempt's claim: something was written after it (a
    resume's resolution or new claim, an operator's resolution), so this attempt's outcome would be
    fenced out and another attempt owns the effect."""

    def __init__(self, key: str, run_id: str, step: int, attempt: int, fencing_token: int, last_seq: int) -> None:
        self.last_seq = last_seq
        super().__init__(
            f"the key was written after this attempt's claim (its subject ends at stream sequence {last_seq}): "
            "a resume took it over after the lease, or an operator resolved it. Raise this from the effect "
            "function without calling the service; this process's writes to the key are fenced out. See the "
            f"key: `runledger effects show {key}`",
            key, run_id, step, attempt, fencing_token,
        )  # fmt: skip

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.key, self.run_id, self.step, self.attempt, self.fencing_token, self.last_seq)
        return (type(self), args, self.__dict__)


class StaleFencingTokenError(LedgerError):
    """A call carried a fencing token older than one the service already admitted for its key
    (``runledger.sdk.fencing.FencingTokens``): a newer attempt at the effect holds the key (a resume
    took the claim over after its lease). Nothing was done. Raised at the service, and by an effect
    function that got the refusal: its attempt stops, and never retries with another number (only
    the ledger hands out tokens, by a new claim)."""

    def __init__(self, key: str, token: int, highest: int) -> None:
        self.key = key
        self.token = token
        self.highest = highest
        super().__init__(
            f"stale fencing token {token} for key {key!r}: a newer attempt holds {highest}, so this call was refused "
            "and nothing was done. Its claim was taken over; stop this attempt (do not retry it), and see the key: "
            f"`runledger effects show {key}`"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.token, self.highest), self.__dict__)


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

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.budget, self.used, self.limit), self.__dict__)


class ApprovalDeniedError(LedgerError):
    def __init__(self, run_id: str, request_id: str, reason: str | None) -> None:
        self.run_id = run_id
        self.request_id = request_id
        self.reason = reason
        super().__init__(f"run {run_id}: approval {request_id} was denied" + (f": {reason}" if reason else ""))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.request_id, self.reason), self.__dict__)


class SuspendedForApprovalError(LedgerError):
    """Raised out of run.approval(): not a failure, the run waits for a decision."""

    def __init__(self, run_id: str, request_id: str, action: str) -> None:
        self.run_id = run_id
        self.request_id = request_id
        self.action = action
        super().__init__(
            f"run {run_id} is suspended until approval {request_id} ({action}) is resolved: "
            f"`runledger approve {run_id} {request_id} --by NAME [--deny]`, then resume"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.request_id, self.action), self.__dict__)


# The name it had before error classes all ended in Error: public (runledger.SuspendedForApproval), so kept.
SuspendedForApproval = SuspendedForApprovalError


class ChildFailedError(LedgerError):
    """Raised out of ``run.child(...)``: the child run failed. Its failure is recorded in the parent
    (``child.failed``) and replays as this error; the agent may catch it like a failed tool."""

    def __init__(self, run_id: str, step: int, child_run_id: str, reason: str, message: str) -> None:
        self.run_id = run_id
        self.step = step
        self.child_run_id = child_run_id
        self.reason = reason
        self.message = message
        super().__init__(
            f"run {run_id} step {step}: child run {child_run_id} failed ({reason}): {message}. "
            f"See `runledger show {child_run_id}`"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.step, self.child_run_id, self.reason, self.message), self.__dict__)


class ChildSuspendedError(LedgerError):
    """Raised out of ``run.child(...)``: not a failure, the child run is suspended (``reason``:
    ``approval``, ``effect_in_doubt``, or ``child`` for a grandchild), so the parent suspends too.
    ``pending``: the child's pending approval requests (set by the caller)."""

    def __init__(self, run_id: str, step: int, child_run_id: str, reason: str, detail: str = "") -> None:
        self.run_id = run_id
        self.step = step
        self.child_run_id = child_run_id
        self.reason = reason
        self.detail = detail
        self.pending: list[str] = []
        super().__init__(
            f"run {run_id} step {step}: child run {child_run_id} is suspended ({reason})"
            + (f": {detail}" if detail else "")
            + f". Settle what the child waits for, then `runledger resume {run_id}`: it resumes the child"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.step, self.child_run_id, self.reason, self.detail), self.__dict__)


class ChainError(LedgerError):
    def __init__(self, run_id: str, seq: int, stream_seq: int | None, reason: str) -> None:
        self.run_id = run_id
        self.seq = seq
        self.stream_seq = stream_seq
        self.reason = reason
        where = f" (stream sequence {stream_seq})" if stream_seq is not None else ""
        super().__init__(f"run {run_id}: event {seq}{where}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.seq, self.stream_seq, self.reason), self.__dict__)


class ToolFailedError(LedgerError):
    """A tool or model call failed (after its retries); the failure is recorded and replays as this
    error. ``retryable``: of a kind a later retry may cure (a run that ends on it can be retried)."""

    def __init__(
        self, name: str, step: int, error_type: str, message: str, *, retryable: bool = False, kind: str = "tool"
    ) -> None:
        self.name = name
        self.step = step
        self.error_type = error_type
        self.message = message
        self.retryable = retryable
        self.kind = kind
        super().__init__(f"{kind} {name!r} (step {step}) raised {error_type}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.name, self.step, self.error_type, self.message)
        return (_rebuild, (type(self), args, {"retryable": self.retryable, "kind": self.kind}, self.__dict__))


class ToolArgumentsError(LedgerError):
    """A tool's arguments do not validate against its signature. Inside a run it is recorded as
    the tool's failure (the run raises ToolFailedError); the message names each field, never a value."""

    def __init__(self, tool: str, detail: str) -> None:
        self.tool = tool
        self.detail = detail
        super().__init__(
            f"invalid arguments for tool {tool!r}: {detail}. The arguments must match the tool's "
            "parameters (Tool.json_schema() is what to give the model)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.tool, self.detail), self.__dict__)


class EffectClaimedElsewhereError(LedgerError):
    def __init__(self, key: str, run_id: str, step: int) -> None:
        self.key = key
        self.run_id = run_id
        self.step = step
        super().__init__(
            f"effect {key!r} is claimed by run {run_id} step {step} and has no outcome yet: "
            f"resume that run, or resolve with `runledger effects resolve {key} --committed/--not-committed`"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.run_id, self.step), self.__dict__)


class EffectWriteRefusedError(LedgerError):
    """A write on an idempotency key that the key's rules refuse (runledger.sdk.effects.key_refusal):
    stored, but every reader steps over it, so nothing may be done as if it counted."""

    def __init__(self, key: str, writer: str, reason: str) -> None:
        self.key = key
        self.writer = writer
        self.reason = reason
        super().__init__(
            f"effect {key!r}: the write as {writer!r} does not count ({reason}); nothing was done. "
            f"Look at the key: `runledger effects show {key}`"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.writer, self.reason), self.__dict__)


class BranchOnHostError(LedgerError):
    """A branch (a re-run's run, written by a worker) was asked to be resumed or continued on the host.

    A branch runs only in a sandbox, under its own mode (runledger.sandbox: effects stubbed unless
    its re-run was allowed them): driving it here would call its tools and effects for real with the
    host's credentials. Nothing was written."""

    def __init__(self, run_id: str, parent_run_id: str, mode: str) -> None:
        self.run_id = run_id
        self.parent_run_id = parent_run_id
        self.mode = mode
        super().__init__(
            f"run {run_id} is a branch of {parent_run_id or 'another run'} ({mode or 'a re-run'}): a branch never "
            f"runs on the host. Resume it in a sandbox: `runledger resume {run_id} --agent MODULE:ATTR` with the "
            "sandbox installed (pip install 'runledger[sandbox]'), or from the page"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.parent_run_id, self.mode), self.__dict__)
