"""Names on the server: subjects, message ids, streams and buckets (the addressing scheme of the ledger)."""

from __future__ import annotations

from runledger.errors import ConfigurationError
from runledger.record.canonical import short_digest
from runledger.record.ids import is_token

RUN_PREFIX = "ledger.run"
EFFECT_PREFIX = "ledger.effect"
CMD_PREFIX = "ledger.cmd"

LEDGER_STREAM = "LEDGER"
CMD_STREAM = "LEDGER_CMD"
# The object store of payloads by sha256 (runledger.protect.blobs) and the key-value bucket of
# per-run keys (runledger.protect.keystore): named and created here, with the streams.
BLOB_BUCKET = "LEDGER_BLOBS"
KEY_BUCKET = "LEDGER_KEYS"
KEY_STREAM = f"KV_{KEY_BUCKET}"


def run_subject(agent: str, run_id: str) -> str:
    """``ledger.run.<agent>.<run_id>``: one subject a run, the agent in it for permissions."""
    for name, value in (("agent", agent), ("run id", run_id)):
        if not is_token(value):
            raise ConfigurationError(f"{name} {value!r} cannot be used in a subject: use 1-128 of A-Z a-z 0-9 _ -")
    return f"{RUN_PREFIX}.{agent}.{run_id}"


def any_agent_run_subject(run_id: str) -> str:
    """The filter that finds a run's subject knowing only its id."""
    if not is_token(run_id):
        raise ConfigurationError(f"run id {run_id!r} is not valid: use 1-128 of A-Z a-z 0-9 _ -")
    return f"{RUN_PREFIX}.*.{run_id}"


def effect_subject(key: str) -> str:
    """``ledger.effect.<digest(key)>``: one subject an idempotency key, so a claim is a first write."""
    return f"{EFFECT_PREFIX}.{short_digest(key)}"


def run_msg_id(run_id: str, seq: int) -> str:
    return f"{run_id}:{seq}"


def effect_msg_id(key: str, seq: int) -> str:
    return f"effect:{short_digest(key)}:{seq}"


def parse_run_subject(subject: str) -> tuple[str, str] | None:
    """(agent, run_id) of a run subject, None for any other subject."""
    parts = subject.split(".")
    if len(parts) == 4 and parts[0] == "ledger" and parts[1] == "run":
        return parts[2], parts[3]
    return None
