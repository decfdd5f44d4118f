"""Every error the projections package raises.

    LedgerError                               (runledger.errors)
    └── ProjectionError
        ├── ProjectionFileError               the DuckDB file cannot be opened, locked or written
        │   ├── ProjectionLockedError         another process holds the file
        │   └── SchemaTooNewError             written by a newer runledger (unknown migration)
        ├── StreamMismatchError               the file projects another stream (server, name, creation time)
        ├── StreamReadError                   the stream could not be read completely and in order
        │   ├── SequenceGapError              a stream sequence went missing between two messages
        │   └── EventsExpiredError            events left the stream (max_age) before they were projected
        ├── UnprojectableError                a batch's rows could not be built or written (an event no table can hold)
        ├── QueryError                        an analyst's SQL failed
        └── ContentNotGrantedError            content asked for (--content) by a caller who may not open it

Messages say what is wrong and what to do next. DuckDB and NATS errors are translated at
the boundary with ``raise ... from exc``. An error whose ``__init__`` takes anything but the
message defines ``__reduce__``, so that it survives pickling into another process unchanged.
"""

from __future__ import annotations

from typing import Any

from runledger.errors import LedgerError


class ProjectionError(LedgerError):
    """Base of every error of the projections package."""


class ProjectionFileError(ProjectionError):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"projection file {path}: {reason}. Pass another --db PATH, or rebuild it from the stream "
            "with `runledger project --rebuild`"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.reason), self.__dict__)


class ProjectionLockedError(ProjectionFileError):
    def __init__(self, path: str, holder: str | None = None) -> None:
        self.holder = holder
        who = f" (pid {holder})" if holder else ""
        ProjectionError.__init__(
            self,
            f"projection file {path} is in use by another process{who}, probably `runledger project "
            "--follow` or an open DuckDB session. Stop it, or query that process's data with --no-sync "
            "once it has stopped; DuckDB allows one writing process per file",
        )
        self.path = path
        self.reason = "locked"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.holder), self.__dict__)


class SchemaTooNewError(ProjectionFileError):
    def __init__(self, path: str, found: int, known: int) -> None:
        self.found = found
        self.known = known
        ProjectionError.__init__(
            self,
            f"projection file {path} has schema version {found}, this runledger knows up to {known}: "
            "upgrade runledger, or start the file over with `runledger project --rebuild`",
        )
        self.path = path
        self.reason = "schema too new"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.found, self.known), self.__dict__)


class StreamMismatchError(ProjectionError):
    def __init__(self, path: str, recorded: str, actual: str) -> None:
        self.path = path
        self.recorded = recorded
        self.actual = actual
        super().__init__(
            f"projection file {path} holds the history of {recorded}, but the server now has {actual}: "
            "a different history, which would be mixed with the one already projected. Point --db at "
            "another file, or start this one over from the new stream with `runledger project --rebuild`"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.recorded, self.actual), self.__dict__)


class StreamReadError(ProjectionError):
    pass


class SequenceGapError(StreamReadError):
    def __init__(self, expected: int, got: int) -> None:
        self.expected = expected
        self.got = got
        super().__init__(
            f"read stream sequence {got} where {expected} was expected: messages were lost on the way "
            "(nothing was committed past the last complete batch). Run `runledger project` again; it "
            "resumes from the last committed position"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.expected, self.got), self.__dict__)


class EventsExpiredError(StreamReadError):
    def __init__(self, position: int, first_seq: int) -> None:
        self.position = position
        self.first_seq = first_seq
        super().__init__(
            f"the projection stopped at stream sequence {position} but the stream now starts at {first_seq}: "
            f"events {position + 1}..{first_seq - 1} expired (max_age) before they were projected. "
            "`runledger project --rebuild` projects what the stream still holds into a fresh file"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.position, self.first_seq), self.__dict__)


class UnprojectableError(ProjectionError):
    """An event decoded but its rows could not be built or written: an Arrow or DuckDB conversion
    refused a value. The projector never stops on it: it projects the batch again, event by
    event, and quarantines what cannot become a row (``reason`` says why)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"rows of the batch cannot be written: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason,), self.__dict__)


class QueryError(ProjectionError):
    def __init__(self, sql: str, reason: str) -> None:
        self.sql = sql
        self.reason = reason
        super().__init__(f"query failed: {reason}. The tables and their columns are listed in docs/tables.md")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.sql, self.reason), self.__dict__)


class ContentNotGrantedError(ProjectionError):
    """``--content`` asked by a caller who may not open content: ``missing`` says which half of the
    grant it lacks (the master key, or a login that may read run keys), ``reason`` the details."""

    def __init__(self, missing: str, reason: str, role: str | None = None, where: str | None = None) -> None:
        self.missing = missing
        self.reason = reason
        self.role = role
        self.where = where
        who = f"the {role} login" if role else "this caller"
        if "master key" in missing:
            text = f"{missing}: {reason}"  # the master key's own error says where it looked and what to do
        else:
            folder = where or "<credentials folder>"
            text = (
                f"{missing} ({reason}). An operator grants content to analysts with `runledger up --secure "
                "--grant-content analyst` (and gives them the master key); operators read it: "
                f"--creds {folder}/operator.json"
            )
        super().__init__(f"content stays sealed for {who}: {text}. Without --content queries run with content sealed")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.missing, self.reason, self.role, self.where), self.__dict__)
