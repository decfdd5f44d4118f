"""The blocking twins of ``RunledgerSaver``'s async methods (``graph.invoke``, ``get_state``).

Each hands its coroutine to the event loop of the saver's client and waits for it, from another
thread: LangGraph runs a sync graph's checkpointer calls from its worker threads, and
``RunledgerSaver.from_conn_string`` in a ``with`` block runs that loop in a thread of its own. On
the loop's own thread a blocking call would deadlock, so it is refused (``call_in_loop``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from langgraph.checkpoint.memory import InMemorySaver

from runledger.integrations.langgraph_rerun import call_in_loop

T = TypeVar("T")


class BlockingTwins(InMemorySaver):
    """Sync methods that run the async ones (which a subclass overrides) on ``self.loop``."""

    loop: asyncio.AbstractEventLoop

    def call_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the saver's event loop from another thread and return its result (what every
        sync method does). Raises InvalidStateError on the loop's own thread, which it would block."""
        return call_in_loop(self.loop, coro, type(self).__name__)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.call_sync(self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        yield from self.call_sync(collect())

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.call_sync(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self.call_sync(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self.call_sync(self.adelete_thread(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.call_sync(self.acopy_thread(source_thread_id, target_thread_id))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self.call_sync(self.aget_delta_channel_history(config=config, channels=channels))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.call_sync(self.adelete_for_runs(run_ids))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.call_sync(self.aprune(thread_ids, strategy=strategy))
