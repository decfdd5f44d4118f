"""Loading a run as its readers see it (``load_run``): decoded, with content opened where the credentials allow."""

from __future__ import annotations

from runledger.log.client import LedgerClient
from runledger.log.reader import RunLog, read_run
from runledger.protect.capture import client_opener
from runledger.record.records import Recorded


async def load_run(
    client: LedgerClient, run_id: str, *, agent: str | None = None, open_content: bool = True, fetch: bool = False
) -> RunLog:
    """All events of one run (quarantining what does not decode). Raises RunNotFoundError.

    With ``open_content`` (the default) sealed content is opened with the run's key where
    this connection may read it (``runledger.protect.capture``); what cannot be opened (an
    erased run) stays sealed. Blob references stay references unless ``fetch``: a checkpoint
    folded from the log keeps its size bounded. Events are returned for reading: their
    ``hash`` is that of the stored (sealed) bytes, which ``verify`` checks.

    Knowing the ``agent`` reads the run's own subject, which an agent role may read; the
    default finds the run under any agent (roles that may read every run).
    """
    log = await read_run(client, run_id, agent=agent)
    if open_content:
        opener = client_opener(client)
        log.records = [
            Recorded(await opener.open_event(r.event, fetch=fetch), r.stream_seq, r.subject) for r in log.records
        ]
    return log
