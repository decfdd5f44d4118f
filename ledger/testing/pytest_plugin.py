"""The pytest plugin: every recorded run of a recording file becomes a test (runledger.testing).

    pytest --runledger-replay tests/recordings --runledger-agent myagent.agent:spec

or, in the project's pytest configuration::

    [tool.pytest.ini_options]
    runledger_replay = ["tests/recordings"]
    runledger_agent = "myagent.agent:spec"

Each ``*.jsonl`` recording under the paths is collected (the paths are collected in addition to the
ordinary test paths); each run in it is one test, named by its run id, that replays the run against
the agent in this process (``Replayer``) and fails with the first divergence: the step, what the
record has, what the code did. A run recorded by another agent is skipped. Not a sandbox: replay only
recordings you trust (docs/testing.md).

``--runledger-replay-live-model[=STEP]`` makes each test the deterministic re-drive of a fix: the
agent's model answers live from STEP (by default the run's decision), every other call comes from the
record, and the test passes when the run completes (a recorded failure the fix cures).

Loaded by pytest through the ``pytest11`` entry point; it imports nothing of the replayer until a
recording is collected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest

if TYPE_CHECKING:
    from runledger.testing.recording import Recording
    from runledger.testing.replayer import Replayer

_PATHS = pytest.StashKey[list[Path]]()
_AGENT = pytest.StashKey[str]()
_REPLAYER = pytest.StashKey["Replayer"]()
_LOOP = pytest.StashKey[asyncio.AbstractEventLoop]()
_LIVE = pytest.StashKey[str]()


# A name for pytest's ini type: mypy (1.20) reads a bare "paths" argument as a possible type expression.
_INI_PATHS: Final = "paths"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("runledger", "replaying recorded runs in-process (runledger.testing)")
    group.addoption(
        "--runledger-replay", action="append", default=[], metavar="PATH",
        help="a recording file, or a directory of *.jsonl recordings (`runledger export jsonl`): one test per run",
    )  # fmt: skip
    group.addoption("--runledger-agent", metavar="MODULE:ATTR", help="the agent the recorded runs are replayed against")
    group.addoption(
        "--runledger-replay-live-model", nargs="?", const="decision", default=None, metavar="STEP",
        help="re-drive each run with the agent's model live from STEP (default: the run's decision, the last model "
        "call at or before its failing step), every other call from the record: a test passes when the run completes",
    )  # fmt: skip
    parser.addini(
        "runledger_replay", type=_INI_PATHS, default=[], help="recordings replayed as tests (--runledger-replay)"
    )
    parser.addini("runledger_agent", default="", help="the agent recordings are replayed against (--runledger-agent)")
    parser.addini(
        "runledger_replay_live_model", default="",
        help="the model live from this step, or 'decision' (--runledger-replay-live-model)",
    )  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    given = [Path(p) for p in config.getoption("runledger_replay")]
    paths = [p.resolve() for p in given + list(config.getini("runledger_replay"))]
    config.stash[_PATHS] = paths
    config.stash[_AGENT] = config.getoption("runledger_agent") or config.getini("runledger_agent") or ""
    config.stash[_LIVE] = config.getoption("runledger_replay_live_model") or config.getini(
        "runledger_replay_live_model"
    )
    if not paths:
        return
    if not config.stash[_AGENT]:
        raise pytest.UsageError("recorded runs to replay need their agent: --runledger-agent MODULE:ATTR")
    # Collected besides the ordinary paths, unless one of those holds them already.
    args = [Path(a.split("::")[0]).resolve() for a in config.args]
    for path in paths:
        if not any(path == a or a in path.parents for a in args):
            config.args.append(str(path))


def pytest_unconfigure(config: pytest.Config) -> None:
    loop = config.stash.get(_LOOP, None)
    if loop is not None:
        loop.close()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    paths = parent.config.stash.get(_PATHS, [])
    if file_path.suffix != ".jsonl" or not paths:
        return None
    resolved = file_path.resolve()
    if not any(resolved == p or p in resolved.parents for p in paths):
        return None
    from runledger.testing.recording import is_recording_file

    if not is_recording_file(file_path):
        return None
    return RecordingFile.from_parent(parent, path=file_path)


class RecordingFile(pytest.File):
    """A recording file: one ``ReplayItem`` per run in it."""

    def collect(self) -> Iterator[pytest.Item]:
        from runledger.testing.recording import read_recordings

        for recording in read_recordings(self.path):
            yield ReplayItem.from_parent(self, name=recording.run_id, recording=recording)


class ReplayItem(pytest.Item):
    """One recorded run, replayed against the agent under test."""

    def __init__(self, *, recording: Recording, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.recording = recording

    def _replayer(self) -> Replayer:
        config = self.config
        if _REPLAYER not in config.stash:
            from runledger.testing.replayer import Replayer

            live = config.stash.get(_LIVE, "") or None
            config.stash[_REPLAYER] = Replayer(config.stash[_AGENT], live_model_from=live)
        return config.stash[_REPLAYER]

    def runtest(self) -> None:
        replayer = self._replayer()
        if self.recording.agent != replayer.spec.name:
            pytest.skip(f"recorded by agent {self.recording.agent!r}; the agent under test is {replayer.spec.name!r}")
        if _LOOP not in self.config.stash:  # one loop for every replay of the session (a loop a test: ~2x slower)
            self.config.stash[_LOOP] = asyncio.new_event_loop()
        result = self.config.stash[_LOOP].run_until_complete(replayer.replay(self.recording))
        self.user_properties.append(("replayed", result.replayed))
        if not result.ok:
            pytest.fail(str(result), pytrace=False)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"replay of run {self.recording.run_id} ({self.recording.agent})"
