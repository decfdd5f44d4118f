"""runledger's projections: DuckDB read models of the ledger stream, SQL for analysts.

Needs the ``projections`` extra (``pip install 'runledger[projections]'``): importing this
package without it raises ``MissingExtraError`` saying so.
"""

from runledger.extras import require_extra

require_extra("projections", "runledger.projections")

# ruff: noqa: E402  (the check above must run before DuckDB is imported)

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
from runledger.projections.projector import Projector, ProjectResult, default_db_path, project, rebuild, stream_status
from runledger.projections.queries import QueryResult, checkpoint_at, export_parquet, format_result, run_sql
from runledger.projections.store import ProjectionStore, ProjectorState, StreamIdentity

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
