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

On the private PostgreSQL of ``bench.postgres`` (``fsync=on``, ``synchronous_commit=on``: a commit
returns once its WAL is flushed):

- LangGraph's ``PostgresSaver`` (langgraph-checkpoint-postgres), on a psycopg connection set up as
  ``PostgresSaver.from_conn_string`` does (autocommit): the same ``put`` per step as the SqliteSaver.
- DBOS (``dbos``): a ``@DBOS.step()`` per agent step inside one ``@DBOS.workflow()`` per run, on DBOS's
  system database. DBOS records the step's output (the reply or the tool's result) and replays it on
  recovery; the workflow is started before the run's first step and is not timed, nor is DBOS's launch.

And LangGraph's saver on runledger (``runledger.integrations.langgraph.RunledgerSaver``), driven by
the same ``LangGraphThread`` as LangGraph's own savers (through ``aput``, on the ledger client's loop).

The libraries are imported only here, when a peer is built (the ``bench`` extra).
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
import queue
import sqlite3
import threading
import time
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

try:  # DBOS's workflow and step must be module-level functions too (registered by name before launch)
    from dbos import DBOS
except ImportError:  # pragma: no cover - the bench extra is not installed
    DBOS = None  # type: ignore[assignment,misc]

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
        self.config = self.saver.put(self.config, *self._next(new_messages))
        self.step += 1

    async def arecord(self, new_messages: list[Any]) -> None:
        """``record`` through the saver's ``aput`` (a saver whose sync methods must not run on its loop)."""
        self.config = await self.saver.aput(self.config, *self._next(new_messages))
        self.step += 1

    def _next(self, new_messages: list[Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """The next checkpoint, its metadata and new versions, as a graph's super-step makes them."""
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
        return checkpoint, metadata, new_versions

    def load_latest(self) -> Any:
        """The latest checkpoint of the thread, deserialized (what resuming a LangGraph thread reads)."""
        config = {"configurable": {"thread_id": self.config["configurable"]["thread_id"], "checkpoint_ns": ""}}
        return self._checked(self.saver.get_tuple(config))

    def _checked(self, found: Any) -> Any:
        if found is None or len(found.checkpoint["channel_values"]["messages"]) != len(self.messages):
            raise RuntimeError(
                f"the saver's latest checkpoint does not hold the thread's {len(self.messages)} messages"
            )
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


class LangGraphPostgresPeer:
    """A ``PostgresSaver`` on its own database, on a connection set up as ``PostgresSaver.from_conn_string`` does."""

    name = "LangGraph PostgresSaver"

    def __init__(self, url: str) -> None:
        try:
            from langgraph.checkpoint.postgres import PostgresSaver
            from psycopg import Connection
            from psycopg.rows import dict_row
        except ImportError as exc:
            raise RuntimeError(MISSING) from exc
        self.conn: Any = Connection.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        self.saver = PostgresSaver(self.conn)
        self.saver.setup()

    def thread(self, thread_id: str) -> LangGraphThread:
        return LangGraphThread(self.saver, thread_id)

    def settings(self) -> dict[str, str]:
        """The session's durability settings, as the server reports them."""
        return {n: str(self.conn.execute(f"SHOW {n}").fetchone()[n]) for n in ("fsync", "synchronous_commit")}

    def set_synchronous_commit(self, value: str) -> None:
        """Only to build a large thread fast before measuring reads; never around a measured write."""
        if value not in ("on", "off"):
            raise ValueError(f"synchronous_commit {value!r}: 'on' or 'off'")
        self.conn.execute(f"SET synchronous_commit = {value}")

    def close(self) -> None:
        self.conn.close()


class RunledgerSaverPeer:
    """LangGraph's saver on runledger (``RunledgerSaver``) on a connected ``LedgerClient``; build it on the
    client's event loop, record through ``LangGraphThread.arecord``."""

    name = "LangGraph RunledgerSaver"

    def __init__(self, client: Any, agent: str = "bench-lg") -> None:
        try:
            from runledger.integrations.langgraph import RunledgerSaver
        except ImportError as exc:
            raise RuntimeError(MISSING) from exc
        self.saver = RunledgerSaver(client, agent=agent)

    def thread(self, thread_id: str) -> LangGraphThread:
        return LangGraphThread(self.saver, thread_id)


# -- DBOS --------------------------------------------------------------------------------------------------

# A running DBOS workflow takes its steps from here, one at a time, and answers each with the ms the
# step took (timed in the workflow's thread, around the step call alone): the workflow id's inbox and outbox.
_CHANNELS: dict[str, tuple[queue.Queue[Step | None], queue.Queue[float | BaseException]]] = {}

if DBOS is not None:

    @DBOS.step(name="runledger_bench_step")
    def dbos_step(kind: str, name: str, args: Any, result: Any) -> Any:
        """One agent step as a DBOS step: what it returns (the reply, the tool's result) is its recorded output."""
        return result

    @DBOS.workflow(name="runledger_bench_driven")
    def dbos_driven_workflow() -> int:
        """A run whose steps come one by one through ``_CHANNELS`` until ``None``; returns the number of steps."""
        workflow_id = DBOS.workflow_id
        assert workflow_id is not None
        inbox, outbox = _CHANNELS[workflow_id]
        done = 0
        while (step := inbox.get()) is not None:
            try:
                t0 = time.perf_counter()
                dbos_step(step.kind, step.name, step.args, step.result)
                outbox.put((time.perf_counter() - t0) * 1000)
            except BaseException as exc:  # the driver must hear of it, not wait forever
                outbox.put(exc)
                raise
            done += 1
        return done

    @DBOS.workflow(name="runledger_bench_batch")
    def dbos_batch_workflow(steps: list[Step]) -> int:
        """A run of ``steps`` recorded in one go (to build a run whose load is measured)."""
        for step in steps:
            dbos_step(step.kind, step.name, step.args, step.result)
        return len(steps)


class DBOSRun:
    """One DBOS workflow driven step by step: ``record(step)`` runs the step in the workflow and returns its ms."""

    def __init__(self, workflow_id: str) -> None:
        from dbos import SetWorkflowID

        self.workflow_id = workflow_id
        self.inbox: queue.Queue[Step | None] = queue.Queue()
        self.outbox: queue.Queue[float | BaseException] = queue.Queue()
        _CHANNELS[workflow_id] = (self.inbox, self.outbox)
        with SetWorkflowID(workflow_id):
            self.handle = DBOS.start_workflow(dbos_driven_workflow)
        self.steps = 0

    def record(self, step: Step) -> float:
        """Run ``step`` as the workflow's next DBOS step (durable on return); the ms it took in the workflow."""
        self.inbox.put(step)
        try:
            answer = self.outbox.get(timeout=60)
        except queue.Empty as exc:
            raise RuntimeError(f"DBOS workflow {self.workflow_id} did not run step {self.steps} within 60 s") from exc
        if isinstance(answer, BaseException):
            raise RuntimeError(f"DBOS step {self.steps} of workflow {self.workflow_id} failed: {answer!r}") from answer
        self.steps += 1
        return answer

    def finish(self) -> None:
        self.inbox.put(None)
        done = self.handle.get_result()
        _CHANNELS.pop(self.workflow_id, None)
        if done != self.steps:
            raise RuntimeError(f"DBOS workflow {self.workflow_id} ran {done} steps, not {self.steps}")


class DBOSPeer:
    """DBOS launched on a system database of the private PostgreSQL (one per process at a time: DBOS is a
    singleton). ``run()`` starts a step-by-step workflow; ``build(steps)`` records a whole run at once;
    ``load(id)`` reads every recorded step's output back (``DBOS.list_workflow_steps``)."""

    name = "DBOS step"
    _lock = threading.Lock()

    def __init__(self, url: str) -> None:
        if DBOS is None:
            raise RuntimeError(MISSING)
        import logging

        if not DBOSPeer._lock.acquire(blocking=False):
            raise RuntimeError("a DBOSPeer is already open in this process (DBOS is a singleton)")
        try:
            DBOS(config={"name": "runledger-bench", "system_database_url": url, "log_level": "WARNING"})
            DBOS.launch()
            logging.getLogger("dbos").setLevel(logging.WARNING)
        except BaseException:
            DBOS.destroy()
            DBOSPeer._lock.release()
            raise

    def run(self) -> DBOSRun:
        return DBOSRun(f"bench-{uuid.uuid4()}")

    def build(self, steps: list[Step]) -> str:
        """A finished workflow of ``steps`` recorded steps; its id."""
        from dbos import SetWorkflowID

        workflow_id = f"bench-{uuid.uuid4()}"
        with SetWorkflowID(workflow_id):
            done = dbos_batch_workflow(steps)
        if done != len(steps):
            raise RuntimeError(f"DBOS workflow {workflow_id} ran {done} steps, not {len(steps)}")
        return workflow_id

    def load(self, workflow_id: str, expected: int) -> float:
        """Read every step's recorded output back, deserialized (what recovery reads, in one query instead of
        one a step); the ms it took. DBOS refuses its sync API on a thread that runs an event loop, so the
        call runs, and is timed, on a thread of its own (the hand-over is not timed)."""

        def timed() -> float:
            t0 = time.perf_counter()
            found = DBOS.list_workflow_steps(workflow_id)
            ms = (time.perf_counter() - t0) * 1000
            if len(found) != expected:
                raise RuntimeError(f"DBOS workflow {workflow_id} holds {len(found)} steps, not {expected}")
            return ms

        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bench-dbos-load") as pool:
            return pool.submit(timed).result()

    def close(self) -> None:
        try:
            DBOS.destroy()
        finally:
            DBOSPeer._lock.release()


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
