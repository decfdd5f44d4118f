"""runledger's projections: DuckDB read models of the ledger stream, SQL for analysts."""

from projections.errors import (
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
from projections.partition import BatchRows, PartitionProjector
from projections.projector import Projector, ProjectResult, default_db_path, project, rebuild, stream_status
from projections.queries import QueryResult, checkpoint_at, export_parquet, format_result, run_sql
from projections.store import ProjectionStore, ProjectorState, StreamIdentity

__all__ = [
    "BatchRows",
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
    "default_db_path",
    "export_parquet",
    "format_result",
    "project",
    "rebuild",
    "run_sql",
    "stream_status",
]
