"""Testing agent code in-process: the replayer, recordings, the pytest plugin, the in-memory ledger.

    from runledger.testing import Replayer
    results = Replayer("myagent.agent:spec").replay_paths("tests/recordings")   # one ReplayResult a run
    assert all(r.ok for r in results), "\\n".join(str(r) for r in results if not r.ok)

``runledger export jsonl RUN... --out FILE`` writes recordings (``export``: from the log);
``pytest --runledger-replay DIR --runledger-agent MODULE:ATTR`` makes one test per recorded run
(``pytest_plugin``). Not a sandbox: replay only recordings you trust (docs/testing.md).

``MemoryLedger`` (``runledger.log.memory``) is the log in this process's memory: ``start_run``,
``resume_run`` and ``load_run`` on ``await MemoryLedger().connect()`` record and read as on nats-server,
with no server (docs/testing.md, "Fast tests on the in-memory ledger").

    testing
    ├── recording       the recording file format: write, read, refuse content that was not opened
    ├── export          recorded runs from the log to a recording file
    ├── replayer        Replayer, ReplayResult, Divergence: RecordedRun's journal over a recording
    ├── cli             ``runledger export jsonl`` (a mode of ``export``, entry point ``runledger.export``)
    └── pytest_plugin   ``--runledger-replay`` / ``--runledger-agent`` (entry point ``pytest11``)

Names are imported on first use (PEP 562), as ``runledger``'s are: ``runledger export jsonl`` is
registered from ``runledger.testing.cli`` for every ``runledger`` command, ``--help`` included, which
must not load the replayer and the in-memory ledger for it (tests/unit/test_cli_imports.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runledger.lazy import lazy_names

if TYPE_CHECKING:
    from runledger.log.memory import MemoryLedger
    from runledger.testing.recording import FORMAT_VERSION, Recording, read_recordings, write_recordings
    from runledger.testing.replayer import Divergence, Replayer, ReplayResult

_MODULE_OF: dict[str, str] = {
    "MemoryLedger": "runledger.log.memory",
    **dict.fromkeys(
        ["FORMAT_VERSION", "Recording", "read_recordings", "write_recordings"], "runledger.testing.recording"
    ),
    **dict.fromkeys(["Divergence", "ReplayResult", "Replayer"], "runledger.testing.replayer"),
}

__all__ = [
    "FORMAT_VERSION",
    "Divergence",
    "MemoryLedger",
    "Recording",
    "ReplayResult",
    "Replayer",
    "read_recordings",
    "write_recordings",
]


__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF, globals(), __all__)
