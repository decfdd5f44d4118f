"""Exporting recorded runs from the log to a recording file (``runledger export jsonl``).

Each run is read with its content opened and its blobs fetched (``runledger.protect.loading.load_run``,
the reader every other command uses), checked, and written in the recording format
(runledger.testing.recording). A run whose content cannot be opened is refused, never written
half-readable: an erased run (its keys are gone), a role that does not hold the master key, a run
recorded with ``capture=hash-only``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from runledger.errors import PayloadUnavailableError
from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.testing.recording import Recording, refuse_unopened, write_recordings


@dataclass(frozen=True)
class ExportResult:
    """What ``export_runs`` wrote: the file, and the run ids in it (in the order given)."""

    path: Path
    runs: list[str] = field(default_factory=list)
    events: int = 0


async def read_recording(client: LedgerClient, run_id: str) -> Recording:
    """Run ``run_id`` from the log as a recording: content opened, blobs inlined.

    Raises RunNotFoundError, and PayloadUnavailableError when the run was erased or holds content
    this connection cannot open (naming the event and why)."""
    log = await load_run(client, run_id, open_content=True, fetch=True)
    for rec in log.records:
        if rec.event.type == "run.erased":
            by = rec.event.payload.get("by") or "an operator"
            raise PayloadUnavailableError(
                f"run {run_id}",
                f"it was erased by {by} (event {rec.event.seq}): its content is gone, and a recording must carry "
                "every value a replay returns; leave this run out of the export",
            )
    for rec in log.records:
        refuse_unopened(rec)
    return Recording(run_id, log.agent, tuple(log.records))


async def export_runs(client: LedgerClient, run_ids: Iterable[str], path: Path) -> ExportResult:
    """Write the runs ``run_ids`` to the recording file ``path`` (replaced; nothing is written when
    one run is refused: RunNotFoundError, PayloadUnavailableError)."""
    recordings = [await read_recording(client, run_id) for run_id in dict.fromkeys(run_ids)]
    write_recordings(path, recordings)
    return ExportResult(path, [r.run_id for r in recordings], sum(len(r.records) for r in recordings))
