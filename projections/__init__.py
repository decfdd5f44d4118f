"""runledger's projections: DuckDB read models of the ledger stream, SQL for analysts.

Needs the ``projections`` extra (``pip install 'runledger[projections]'``): importing this
package without it raises ``MissingExtraError`` saying so.

Names are imported on first use (PEP 562), as ``runledger``'s are: the package's sub-commands
(``runledger.projections.cli``) are registered for every ``runledger`` command, ``--help``
included, and must not load DuckDB, pyarrow and numpy for it (tests/unit/test_cli_imports.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runledger.extras import require_extra
from runledger.lazy import lazy_names

require_extra("projections", "runledger.projections")

if TYPE_CHECKING:
    from runledger.projections.content import content_session
    from runledger.projections.errors import (
        ContentNotGrantedError,
        EventsExpiredError,
        ProjectionError,
        ProjectionFileError,
        ProjectionLockedError,
        QueryError,
        SchemaTooNewError,
        SequenceGapError,
        StreamMismatchError,
        StreamReadError,
    )
    from runledger.projections.partition import BatchRows, PartitionProjector
    from runledger.projections.projector import (
        Projector,
        ProjectResult,
        default_db_path,
        project,
        rebuild,
        stream_status,
    )
    from runledger.projections.queries import QueryResult, checkpoint_at, export_parquet, format_result, run_sql
    from runledger.projections.store import ProjectionStore, ProjectorState, StreamIdentity

_MODULE_OF: dict[str, str] = {
    "content_session": "runledger.projections.content",
    **dict.fromkeys(
        [
            "ContentNotGrantedError",
            "EventsExpiredError",
            "ProjectionError",
            "ProjectionFileError",
            "ProjectionLockedError",
            "QueryError",
            "SchemaTooNewError",
            "SequenceGapError",
            "StreamMismatchError",
            "StreamReadError",
        ],
        "runledger.projections.errors",
    ),
    **dict.fromkeys(["BatchRows", "PartitionProjector"], "runledger.projections.partition"),
    **dict.fromkeys(
        ["Projector", "ProjectResult", "default_db_path", "project", "rebuild", "stream_status"],
        "runledger.projections.projector",
    ),
    **dict.fromkeys(
        ["QueryResult", "checkpoint_at", "export_parquet", "format_result", "run_sql"], "runledger.projections.queries"
    ),
    **dict.fromkeys(["ProjectionStore", "ProjectorState", "StreamIdentity"], "runledger.projections.store"),
}

__all__ = [
    "BatchRows",
    "ContentNotGrantedError",
    "EventsExpiredError",
    "PartitionProjector",
    "ProjectResult",
    "ProjectionError",
    "ProjectionFileError",
    "ProjectionLockedError",
    "ProjectionStore",
    "Projector",
    "ProjectorState",
    "QueryError",
    "QueryResult",
    "SchemaTooNewError",
    "SequenceGapError",
    "StreamIdentity",
    "StreamMismatchError",
    "StreamReadError",
    "checkpoint_at",
    "content_session",
    "default_db_path",
    "export_parquet",
    "format_result",
    "project",
    "rebuild",
    "run_sql",
    "stream_status",
]


__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF, globals(), __all__)
