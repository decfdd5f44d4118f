"""Appending to a run from outside it: an operator's decision, an erasure notice.

The operator appends on the run's operator subject (``ledger.run.<agent>.<run_id>.o``, which only
operators may publish to), continuing the run's one chain and fenced on the run's last event
whoever wrote it, exactly like the agent's own steps: an append made against a stale view of the
run is rejected instead of interleaved.
"""

from __future__ import annotations

from runledger.log.client import LedgerClient
from runledger.log.publish import RetryPolicy, SubjectWriter
from runledger.log.reader import RunLog, read_run
from runledger.log.subjects import OPERATOR_WRITER, run_subject
from runledger.record.events import Event, Payload
from runledger.record.fold import Checkpoint, fold


async def append_to_run(
    client: LedgerClient, run_id: str, body: Payload, policy: RetryPolicy = RetryPolicy(), *, log: RunLog | None = None
) -> tuple[Event, Checkpoint]:
    """Append ``body`` to the run, fenced on its last event. Pass ``log`` when the caller has
    just read the run (the fence still rejects the append if anything was written since)."""
    log = log or await read_run(client, run_id)
    cp = fold(log.records)
    writer = SubjectWriter(
        client.js,
        run_subject(log.agent, run_id, OPERATOR_WRITER),
        run_id=run_id,
        agent=log.agent,
        msg_id_prefix=run_id,
        next_seq=cp.next_seq,
        prev_hash=cp.last_hash,
        last_stream_seq=log.last_stream_seq,
        policy=policy,
        chain_format=cp.chain_format,
    )
    return await writer.append(body), cp
