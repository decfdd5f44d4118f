"""Names on the server: subjects, message ids, streams and buckets (the addressing scheme of the ledger).

A run's events and an idempotency key's events each live under a subject of their own, which ends
in the *writer* of each message: ``a`` the agent, ``w`` a worker (a re-run's branch), ``o`` an
operator. Who may say what is decided by the subject: NATS permissions let each role publish only
its own writer token (runledger.protect.roles), and the fold accepts an operator's decision (an
approval, a budget grant, an accepted version, an erasure) only from ``o``, and anything else only
from the writer that started the run. One chain spans the writers: every append is fenced on the
whole run (``Nats-Expected-Last-Subject-Sequence`` with ``Nats-Expected-Last-Subject-Sequence-Subject``
set to the run's wildcard, ``fence_filter``), so an operator's decision and the agent's next step
can never interleave.

**A run id is claimed once.** A run's first message (its ``run.started``) is fenced on every agent's
subjects of the id (``claim_filter``: ``ledger.run.*.<run_id>.*`` must be empty, ``fence_for``), so
the server stores it only if no agent has written anything under that run id: the first agent to
start a run under an id owns it, before anything of the run is acted on, and a second agent's start
is refused at once (runledger.errors.RunIdTakenError). The claim is the agent's own by its
subject, which NATS lets only that agent write, so nobody claims in another agent's name. Readers
take the agent of a run id's first ``run.started`` as its owner (runledger.record.fold.refusal) and
quarantine what another agent writes under it; the claim makes that first ``run.started`` the
claimer's. Rejected: a separate claim subject or KV key per run id (a key-value entry cannot bind
its value to its writer; a claim subject needs a new subject, its permissions, and leaves a claimed
id without a run when the agent dies between the two writes) and keying runs by agent and id in
every reader (every command, table and page names runs by id alone).
"""

from __future__ import annotations

import functools

from runledger.errors import ConfigurationError
from runledger.record.canonical import short_digest
from runledger.record.ids import is_subject_token

# Re-exported: code that builds subjects asks this module for the writer tokens too.
from runledger.record.writers import AGENT_WRITER as AGENT_WRITER
from runledger.record.writers import OPERATOR_WRITER as OPERATOR_WRITER
from runledger.record.writers import WORKER_WRITER as WORKER_WRITER
from runledger.record.writers import WRITERS as WRITERS
from runledger.record.writers import Writer as Writer

RUN_PREFIX = "ledger.run"
EFFECT_PREFIX = "ledger.effect"
CMD_PREFIX = "ledger.cmd"

# The headers of a fenced append: the last stream sequence the writer saw, and the subjects it covers.
FENCE_HEADER = "Nats-Expected-Last-Subject-Sequence"
FENCE_SUBJECT_HEADER = "Nats-Expected-Last-Subject-Sequence-Subject"

LEDGER_STREAM = "LEDGER"
CMD_STREAM = "LEDGER_CMD"
# The work queue of re-run requests and the one consumer every worker pulls them from: a pull
# consumer the admin makes with the streams (runledger.log.streams), which a worker may update but
# never turn into a push consumer (the server refuses that) nor delete (runledger.protect.roles).
RERUN_SUBJECT = f"{CMD_PREFIX}.rerun"
RERUN_CONSUMER = "rerun-workers"
# The object store of payloads by sha256 (runledger.protect.blobs) and the key-value bucket of
# per-run keys (runledger.protect.keystore): named and created here, with the streams.
BLOB_BUCKET = "LEDGER_BLOBS"
KEY_BUCKET = "LEDGER_KEYS"
KEY_STREAM = f"KV_{KEY_BUCKET}"


def _check(name: str, value: str) -> None:
    if not is_subject_token(value):
        raise ConfigurationError(f"{name} {value!r} cannot be used in a subject: use 1-128 of A-Z a-z 0-9 _ -")


def _writer(writer: str) -> str:
    if writer not in WRITERS:
        raise ConfigurationError(f"writer {writer!r} is not one of {', '.join(sorted(WRITERS))}")
    return writer


def run_subject(agent: str, run_id: str, writer: Writer = AGENT_WRITER) -> str:
    """``ledger.run.<agent>.<run_id>.<writer>``: where ``writer`` appends to the run (the agent in
    it for permissions)."""
    _check("agent", agent)
    _check("run id", run_id)
    return f"{RUN_PREFIX}.{agent}.{run_id}.{_writer(writer)}"


def run_filter(agent: str, run_id: str) -> str:
    """Every message of one run, whoever wrote it: ``ledger.run.<agent>.<run_id>.*``."""
    _check("agent", agent)
    _check("run id", run_id)
    return f"{RUN_PREFIX}.{agent}.{run_id}.*"


def any_agent_run_subject(run_id: str) -> str:
    """The filter that finds a run's messages knowing only its id."""
    if not is_subject_token(run_id):
        raise ConfigurationError(f"run id {run_id!r} is not valid: use 1-128 of A-Z a-z 0-9 _ -")
    return f"{RUN_PREFIX}.*.{run_id}.*"


def claim_filter(run_id: str) -> str:
    """What a run's first message is fenced on: every agent's subjects of ``run_id`` (the claim of the id)."""
    return any_agent_run_subject(run_id)


def effect_subject(agent: str, key: str, writer: Writer = AGENT_WRITER) -> str:
    """``ledger.effect.<agent>.<digest(key)>.<writer>``: where ``writer`` appends to one idempotency
    key of an agent (a claim is a first write on the key). The agent in it keeps every agent off
    the others' keys."""
    _check("agent", agent)
    return f"{EFFECT_PREFIX}.{agent}.{short_digest(key)}.{_writer(writer)}"


def effect_filter(agent: str, key: str) -> str:
    """Every message of one key of an agent, whoever wrote it."""
    _check("agent", agent)
    return f"{EFFECT_PREFIX}.{agent}.{short_digest(key)}.*"


def any_agent_effect_subject(key: str) -> str:
    """The filter that finds a key's messages knowing only the key (any agent's)."""
    return f"{EFFECT_PREFIX}.*.{short_digest(key)}.*"


@functools.lru_cache(maxsize=4096)  # asked at every publish; a run's subjects repeat
def fence_filter(subject: str) -> str | None:
    """The subjects an append to ``subject`` is fenced on: the whole run or key (its writer token
    made a wildcard); None for a subject of no run or key."""
    head, _, writer = subject.rpartition(".")
    if writer in WRITERS and (parse_run_subject(subject) or parse_effect_subject(subject)):
        return head + ".*"
    return None


def fence_for(subject: str, expected_last_seq: int) -> str | None:
    """The ``Nats-Expected-Last-Subject-Sequence-Subject`` of an append to ``subject`` that expects
    ``expected_last_seq``: for a run's first message (0 on a run subject) the claim of its id over
    every agent (``claim_filter``), else ``fence_filter``'s run or key."""
    if expected_last_seq == 0:
        parsed = parse_run_subject(subject)
        if parsed is not None:
            return claim_filter(parsed[1])
    return fence_filter(subject)


def run_msg_id(run_id: str, seq: int) -> str:
    return f"{run_id}:{seq}"


def effect_msg_id(agent: str, key: str, seq: int) -> str:
    return f"effect:{agent}:{short_digest(key)}:{seq}"


def parse_run_subject(subject: str) -> tuple[str, str] | None:
    """(agent, run_id) of a run subject, None for any other subject."""
    parts = subject.split(".")
    if len(parts) == 5 and parts[0] == "ledger" and parts[1] == "run" and parts[4] in WRITERS:
        return parts[2], parts[3]
    return None


def parse_effect_subject(subject: str) -> tuple[str, str] | None:
    """(agent, key digest) of a key subject, None for any other subject."""
    parts = subject.split(".")
    if len(parts) == 5 and parts[0] == "ledger" and parts[1] == "effect" and parts[4] in WRITERS:
        return parts[2], parts[3]
    return None


def writer_of(subject: str) -> str | None:
    """The writer token of a run or key subject (``a``, ``w``, ``o``); None for any other subject."""
    writer = subject.rpartition(".")[2]
    return writer if writer in WRITERS and (parse_run_subject(subject) or parse_effect_subject(subject)) else None
