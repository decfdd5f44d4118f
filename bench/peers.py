"""The peers runledger is measured against, doing the same durable work per agent step.

- LangGraph's ``SqliteSaver`` (package langgraph-checkpoint-sqlite, a file-backed sqlite
  database): one ``put`` of the thread's checkpoint per step. The checkpoint carries what a
  LangGraph agent's checkpoint carries: the channel values, i.e. the whole message list so
  far (``MessagesState``'s ``add_messages`` channel is stored in full at every super-step;
  LangGraph's beta ``DeltaChannel`` would store deltas instead), as langchain-core message
  objects serialized by the saver's own serde. ``put_writes``, which a running graph also
  calls for each task, is left out: that favours LangGraph.
- The ``eventsourcing`` library with its SQLite recorder (a file): an ``Aggregate`` whose
  method triggers one event per step, and ``app.save(agg)`` per step.

Both libraries put sqlite in WAL mode and leave ``synchronous`` at its default, FULL, which
in WAL mode syncs the log at every commit: each step is on disk when the call returns, as a
runledger step is (its embedded server fsyncs before acking). ``pragmas()`` reads the
settings from the peers' own connections so the report states what was measured, not what
was assumed.

Both libraries are imported only here, when a peer is built (the ``bench`` extra).
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:  # eventsourcing's aggregate must be a module-level class (its events are found by topic)
    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate, event
except ImportError:  # pragma: no cover - the bench extra is not installed; build_* says what to do
    Application = Aggregate = None  # type: ignore[assignment,misc]
    event = None  # type: ignore[assignment]

MISSING = "the benchmark peers are not installed: pip install -e '.[bench]' (or deploy/dev.sh bench)"
SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


@dataclass(frozen=True)
class Step:
    """One agent step, as every system records it.

    model: ``args`` is the message delta sent (a list of chat messages), ``result`` the reply
    (``{"content": ..., "usage": {...}}``). tool / effect: ``args`` and ``result`` of the call;
    an effect also has its idempotency ``key``.
    """

    kind: str
    name: str
    args: Any
    result: Any
    key: str | None = None


def _pragmas(cursor: Any) -> dict[str, str]:
    cursor.execute("PRAGMA journal_mode")
    journal = str(cursor.fetchone()[0])
    cursor.execute("PRAGMA synchronous")
    sync = int(cursor.fetchone()[0])
    return {"journal_mode": journal.upper(), "synchronous": SYNCHRONOUS.get(sync, str(sync))}


# -- LangGraph ---------------------------------------------------------------------------------------------


class LangGraphThread:
    """One LangGraph thread: ``record(step)`` appends the step's messages and ``put``s the checkpoint."""

    def __init__(self, saver: Any, thread_id: str) -> None:
        self.saver = saver
        self.config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        self.messages: list[Any] = []
        self.versions: dict[str, Any] = {}
        self.step = 0

    def messages_for(self, step: Step) -> list[Any]:
        """The messages a LangGraph agent's state gains in this step (what an LLM wrapper and ToolNode make)."""
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

        if step.kind == "model":
            new: list[Any] = [HumanMessage(content=m["content"]) for m in step.args]
            usage = step.result.get("usage", {})
            new.append(
                AIMessage(
                    content=step.result["content"],
                    usage_metadata={
                        "input_tokens": usage.get("input_tokens", 0),
                        "output_tokens": usage.get("output_tokens", 0),
                        "total_tokens": usage.get("input_tokens", 0) + usage.get("output_tokens", 0),
                    },
                )
            )
            return new
        call_id = f"call_{self.step}"
        call = {"name": step.name, "args": step.args, "id": call_id, "type": "tool_call"}
        return [
            AIMessage(content="", tool_calls=[call]),
            ToolMessage(content=json.dumps(step.result), tool_call_id=call_id, name=step.name),
        ]

    def record(self, new_messages: list[Any]) -> None:
        """Append ``new_messages`` to the state and put the thread's next checkpoint (durable on return)."""
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.base.id import uuid6

        self.messages.extend(new_messages)
        node = "agent" if self.step % 2 == 0 else "tools"
        new_versions = {
            "messages": self.saver.get_next_version(self.versions.get("messages"), None),
            f"branch:to:{node}": self.saver.get_next_version(self.versions.get(f"branch:to:{node}"), None),
        }
        self.versions.update(new_versions)
        checkpoint = empty_checkpoint()
        checkpoint["id"] = str(uuid6(clock_seq=self.step))
        checkpoint["ts"] = dt.datetime.now(dt.UTC).isoformat()
        checkpoint["channel_values"] = {"messages": list(self.messages)}
        checkpoint["channel_versions"] = dict(self.versions)
        checkpoint["versions_seen"] = {node: {"messages": self.versions["messages"]}}
        checkpoint["updated_channels"] = sorted(new_versions)
        metadata = {"source": "loop", "step": self.step, "parents": {}}
        self.config = self.saver.put(self.config, checkpoint, metadata, new_versions)
        self.step += 1

    def load_latest(self) -> Any:
        """The latest checkpoint of the thread, deserialized (what resuming a LangGraph thread reads)."""
        config = {"configurable": {"thread_id": self.config["configurable"]["thread_id"], "checkpoint_ns": ""}}
        found = self.saver.get_tuple(config)
        assert found is not None and len(found.checkpoint["channel_values"]["messages"]) == len(self.messages)
        return found


class LangGraphPeer:
    """A ``SqliteSaver`` on its own sqlite file, set up as ``SqliteSaver.from_conn_string`` does."""

    name = "LangGraph SqliteSaver"

    def __init__(self, path: Path) -> None:
        try:
            from langgraph.checkpoint.sqlite import SqliteSaver
        except ImportError as exc:
            raise RuntimeError(MISSING) from exc
        self.conn = sqlite3.connect(str(path), check_same_thread=False)
        self.saver = SqliteSaver(self.conn)
        self.saver.setup()

    def thread(self, thread_id: str) -> LangGraphThread:
        return LangGraphThread(self.saver, thread_id)

    def pragmas(self) -> dict[str, str]:
        return _pragmas(self.conn.cursor())

    def set_synchronous(self, value: str) -> None:
        """Only to build a large thread fast before measuring reads; never around a measured write."""
        self.conn.execute(f"PRAGMA synchronous={value}")

    def close(self) -> None:
        self.conn.close()


# -- eventsourcing -----------------------------------------------------------------------------------------

if Aggregate is not None:

    class AgentRun(Aggregate):
        """An agent run as an event-sourced aggregate: one event per step."""

        def __init__(self, agent: str) -> None:
            self.agent = agent
            self.messages: list[Any] = []
            self.effects: dict[str, Any] = {}
            self.steps = 0

        @event("ModelCalled")
        def model_called(self, step: int, model: str, messages: list[Any], response: dict[str, Any]) -> None:
            self.messages.extend(messages)
            self.messages.append({"role": "assistant", "content": response["content"]})
            self.steps = step + 1

        @event("ToolCalled")
        def tool_called(self, step: int, name: str, args: Any, output: Any) -> None:
            self.messages.append({"role": "tool", "name": name, "content": output})
            self.steps = step + 1

        @event("EffectCommitted")
        def effect_committed(self, step: int, name: str, key: str, args: Any, result: Any) -> None:
            self.effects[key] = result
            self.messages.append({"role": "tool", "name": name, "content": result})
            self.steps = step + 1


class EventSourcingRun:
    def __init__(self, app: Any, agent: str) -> None:
        self.app = app
        self.agg = AgentRun(agent)
        app.save(self.agg)
        self.step = 0

    def record(self, step: Step) -> None:
        """Trigger the step's event on the aggregate and ``app.save`` it (durable on return)."""
        if step.kind == "model":
            self.agg.model_called(step=self.step, model=step.name, messages=step.args, response=step.result)
        elif step.kind == "tool":
            self.agg.tool_called(step=self.step, name=step.name, args=step.args, output=step.result)
        else:
            assert step.key is not None
            self.agg.effect_committed(step=self.step, name=step.name, key=step.key, args=step.args, result=step.result)
        self.app.save(self.agg)
        self.step += 1

    def load(self) -> Any:
        """The aggregate, replayed from all its stored events (``app.repository.get``)."""
        agg = self.app.repository.get(self.agg.id)
        assert agg.steps == self.step
        return agg


class EventSourcingPeer:
    """An ``eventsourcing`` Application on its SQLite recorder (a file), no snapshots, no cache."""

    name = "eventsourcing SQLite"

    def __init__(self, path: Path) -> None:
        if Aggregate is None:
            raise RuntimeError(MISSING)
        env = {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path)}
        self.app: Any = Application(env=env)

    def run(self, agent: str = "bench") -> EventSourcingRun:
        return EventSourcingRun(self.app, agent)

    def pragmas(self) -> dict[str, str]:
        with self.app.recorder.datastore.transaction(commit=False) as cursor:
            return _pragmas(cursor)

    def close(self) -> None:
        self.app.close()


def new_thread_id() -> str:
    return str(uuid.uuid4())
