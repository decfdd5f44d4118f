"""Testing agent code against recorded runs, in-process: the replayer, recordings, the pytest plugin.

    from runledger.testing import Replayer
    results = Replayer("myagent.agent:spec").replay_paths("tests/recordings")   # one ReplayResult a run
    assert all(r.ok for r in results), "\\n".join(str(r) for r in results if not r.ok)

``runledger export jsonl RUN... --out FILE`` writes recordings (``export``: from the log);
``pytest --runledger-replay DIR --runledger-agent MODULE:ATTR`` makes one test per recorded run
(``pytest_plugin``). Not a sandbox: replay only recordings you trust (docs/testing.md).

    testing
    ├── recording       the recording file format: write, read, refuse content that was not opened
    ├── export          recorded runs from the log to a recording file
    ├── replayer        Replayer, ReplayResult, Divergence: RecordedRun's journal over a recording
    ├── cli             ``runledger export jsonl`` (a mode of ``export``, entry point ``runledger.export``)
    └── pytest_plugin   ``--runledger-replay`` / ``--runledger-agent`` (entry point ``pytest11``)
"""

from __future__ import annotations

from runledger.testing.recording import FORMAT_VERSION, Recording, read_recordings, write_recordings
from runledger.testing.replayer import Divergence, Replayer, ReplayResult

__all__ = [
    "FORMAT_VERSION",
    "Divergence",
    "Recording",
    "ReplayResult",
    "Replayer",
    "read_recordings",
    "write_recordings",
]
