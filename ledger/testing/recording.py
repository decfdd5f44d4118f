"""Recordings: recorded runs exported to a file, for replay in a test process (runledger.testing).

A recording is one run's events as the log holds them (envelope, hash chain, subject, stream
sequence) with their content opened: sealed values unsealed, blob references replaced by the
blob's body, sealed error texts opened. That is everything a replay needs and nothing it would
have to fetch: a recording is read with no NATS, no key store and no object store. The file
format (JSON Lines, ``docs/testing.md``, "The recording format"):

    {"recording": 1, "run_id": "01J...", "agent": "refund-agent", "events": 9, "exported_at": "..."}
    {"subject": "ledger.run.refund-agent.01J....a", "stream_seq": 41, "event": {...the event...}}
    ... one line per event, in the run's order, then the next run's header

Files concatenate (``cat a.jsonl b.jsonl``). An event keeps the ``hash`` of the bytes the log
stored (sealed): the chain links (``prev_hash``) still check, but the content of an exported
event no longer hashes to it, so ``runledger verify`` is for the log, not for recordings.

Content that cannot be opened (an erased run, a role without the master key, capture
``hash-only``) is never written: the export raises PayloadUnavailableError naming the run, the
event and the field, and reading a file that holds such a stand-in raises it too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runledger.errors import ConfigurationError, PayloadUnavailableError
from runledger.protect.capture import content_values, is_hashed, is_placeholder, is_sealed, is_sealed_text
from runledger.record.events import Event, utc_now
from runledger.record.records import Recorded

FORMAT_VERSION = 1
"""The version of the recording format this module writes (a header's ``recording``)."""


@dataclass(frozen=True)
class Recording:
    """One exported run: its id, its agent and its records in order (content opened).

    ``source`` says where it was read from (``file:line`` of its header), for messages."""

    run_id: str
    agent: str
    records: tuple[Recorded, ...]
    source: str = ""

    def events(self) -> list[Recorded]:
        """Fresh copies of the records (parsed again): a replay may hand their values to agent code,
        which may change them, and the next replay of this recording must see them as recorded."""
        return [
            Recorded(Event.model_validate_json(r.event.model_dump_json()), r.stream_seq, r.subject)
            for r in self.records
        ]


def unopened(rec: Recorded) -> str | None:
    """Why ``rec`` holds content a replay could not use (a seal, a blob reference, a hash), or None."""
    for value in content_values(rec.event):
        found = _first_marker(value)
        if found is not None:
            return _why(found)
    return None


def _first_marker(value: Any, depth: int = 0) -> Any:
    if is_placeholder(value):
        return value
    if depth >= 32:
        return None
    if isinstance(value, dict):
        items: Iterable[Any] = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return None
    for item in items:
        found = _first_marker(item, depth + 1)
        if found is not None:
            return found
    return None


def _why(marker: Any) -> str:
    if is_sealed(marker) or is_sealed_text(marker):
        return "sealed, and its key could not be read (the run was erased, or this role may not read it)"
    if is_hashed(marker):
        return "recorded as a hash only (capture=hash-only): the content was never kept"
    return "a blob reference whose body could not be fetched (or is sealed under a key that could not be read)"


def refuse_unopened(rec: Recorded, where: str = "") -> None:
    """Raise PayloadUnavailableError when ``rec`` holds content that was not opened."""
    why = unopened(rec)
    if why is not None:
        ev = rec.event
        raise PayloadUnavailableError(
            f"run {ev.run_id} event {ev.seq} ({ev.type}){where}",
            f"its content is {why}; a recording must carry every value a replay returns, so this run cannot "
            "be exported (or replayed) in-process: export it with a role that holds the master key, or leave it out",
        )


def header(run_id: str, agent: str, events: int) -> dict[str, Any]:
    return {"recording": FORMAT_VERSION, "run_id": run_id, "agent": agent, "events": events, "exported_at": utc_now()}


def recording_lines(recording: Recording) -> Iterator[str]:
    """The lines of one run in the file (header first), each without its newline."""
    yield json.dumps(header(recording.run_id, recording.agent, len(recording.records)), ensure_ascii=False)
    for rec in recording.records:
        line = {"subject": rec.subject, "stream_seq": rec.stream_seq, "event": rec.event.model_dump(mode="json")}
        yield json.dumps(line, ensure_ascii=False, sort_keys=True)


def write_recordings(path: Path, recordings: Iterable[Recording]) -> int:
    """Write ``recordings`` to ``path`` (replacing it); returns how many runs were written.
    Refuses (PayloadUnavailableError, nothing written) a run with content that was not opened."""
    runs = list(recordings)
    for recording in runs:
        for rec in recording.records:
            refuse_unopened(rec)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for recording in runs:
            for line in recording_lines(recording):
                f.write(line + "\n")
    tmp.replace(path)
    return len(runs)


def read_recordings(path: Path) -> list[Recording]:
    """Every run in the recording file ``path``, in file order.

    Raises ConfigurationError for a file that is not a recording, a newer format, a truncated run
    or an event of another run; PayloadUnavailableError for content that was not opened."""
    runs: list[Recording] = []
    current: dict[str, Any] | None = None
    records: list[Recorded] = []

    def close(lineno: int) -> None:
        if current is None:
            return
        if len(records) != current["events"]:
            raise ConfigurationError(
                f"{path}:{current['line']}: run {current['run_id']} has {len(records)} events in the file, its header "
                f"says {current['events']} (a truncated or edited recording): export it again"
            )
        runs.append(Recording(current["run_id"], current["agent"], tuple(records), f"{path}:{current['line']}"))

    with path.open(encoding="utf-8") as f:
        lineno = 0
        for lineno, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except ValueError as exc:
                raise ConfigurationError(
                    f"{path}:{lineno}: not a JSON line ({exc}): not a runledger recording"
                ) from exc
            if not isinstance(line, dict):
                raise ConfigurationError(f"{path}:{lineno}: not a runledger recording (a line is not an object)")
            if "recording" in line:
                close(lineno)
                version = line.get("recording")
                if not isinstance(version, int) or version > FORMAT_VERSION:
                    raise ConfigurationError(
                        f"{path}:{lineno}: recording format {version!r} is newer than this runledger reads "
                        f"({FORMAT_VERSION}): upgrade runledger"
                    )
                current = {"run_id": str(line.get("run_id")), "agent": str(line.get("agent")),
                           "events": int(line.get("events") or 0), "line": lineno}  # fmt: skip
                records = []
                continue
            if current is None or "event" not in line:
                raise ConfigurationError(f"{path}:{lineno}: not a runledger recording (an event before any header)")
            try:
                event = Event.model_validate(line["event"])
            except ValueError as exc:
                raise ConfigurationError(f"{path}:{lineno}: not a valid event ({exc})") from exc
            if event.run_id != current["run_id"]:
                raise ConfigurationError(
                    f"{path}:{lineno}: an event of run {event.run_id} inside run {current['run_id']}'s recording"
                )
            rec = Recorded(event, int(line.get("stream_seq") or 0), str(line.get("subject") or ""))
            refuse_unopened(rec, f" at {path}:{lineno}")
            records.append(rec)
        close(lineno)
    return runs


def recording_files(path: Path) -> list[Path]:
    """``path`` itself when it is a file, else the ``*.jsonl`` files under it, sorted."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ConfigurationError(f"{path}: no such recording file or directory")
    return sorted(p for p in path.rglob("*.jsonl") if p.is_file())


def is_recording_file(path: Path) -> bool:
    """True when the first non-empty line of ``path`` is a recording header."""
    try:
        with path.open(encoding="utf-8") as f:
            for text in f:
                if text.strip():
                    line = json.loads(text)
                    return isinstance(line, dict) and "recording" in line and "run_id" in line
    except (OSError, ValueError):
        return False
    return False
