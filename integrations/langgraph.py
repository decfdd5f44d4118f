"""A LangGraph checkpointer on the ledger: each thread is a run, its checkpoints and writes are events.

``RunledgerSaver(client)`` is a ``BaseCheckpointSaver``: pass it to ``builder.compile(checkpointer=...)``
and every checkpoint (``graph.checkpointed``) and every task's pending writes
(``graph.writes_saved``) of a thread is appended to the thread's run, fenced and acknowledged before
LangGraph goes on (write-ahead), redacted and sealed like every run's content, and stored by
reference in the object store when large; a list channel that grows (``messages``) is recorded as
its new elements after the parent checkpoint's list (``tail_record``), so a checkpoint costs what
its step added, not what the thread holds. Model and tool calls inside the graph's nodes, wrapped
with ``saver.model(...)`` and ``saver.tool(...)`` (runledger.integrations.langchain), are steps of
the same run, so ``runledger show``, ``verify`` and the projection's ``steps`` table see one record
per thread, and a tool declared as an effect is applied at most once across crashes.

How it behaves: exactly like LangGraph's ``InMemorySaver``, which it extends. The in-memory
structures are an index of the log: filled from the thread's run the first time this process
needs the thread, then kept in step with every append (the append first). So ``get_tuple``,
``list`` (namespace, ``filter``, ``before``, ``limit``, newest first), pending writes and their
order, parent configs, namespaces of subgraphs, interrupts, ``Send`` and time travel are the
reference implementation's, over state that survives the process.

Recovery is LangGraph's own: a resumed process invokes the graph on the same thread, LangGraph
loads the latest checkpoint and runs the tasks that have no saved writes. The thread's run is
reopened with ``runledger.sdk.lifecycle.open_run`` (fenced: a second process driving the same
thread stops with FencedError at its next append) and later steps continue its numbering. A node
that a crash interrupted runs again from its start, as with every checkpointer: its model calls are
made again (and recorded as new steps), its effects are not (the effect ledger answers a committed
key with its recorded result; ``reconcile`` settles one in doubt; the idempotency key reaches the
service).

Rejected: recording checkpoints as steps and replaying the graph from the top, as ``resume_run``
does for an agent function. LangGraph names checkpoints with time-based ids (uuid6) and derives
task ids, and with them interrupt ids, from them: a replay from the top would name everything
anew, and LangGraph's resume-from-a-checkpoint, which its users rely on, would be bypassed.

Re-runs (``runledger rerun``) are another matter: a branch is a new run, so nothing has to keep
LangGraph's ids. ``graph_agent(fn, build)`` makes the graph an agent function (``GraphAgent``):
in the sandbox, ``redrive_thread`` builds the same graph on a ``RedriveSaver`` (LangGraph's
``InMemorySaver``; checkpoints are not steps, so the step numbers of the model, tool and effect
calls are the recorded run's) and invokes it with the thread's recorded inputs; its journaled
model and tools call the guest's Run API, so the broker serves them by step number as it serves
any agent, in every mode. The inputs (each invocation's input and each ``Command(resume=...)``
value, the human's answer to an interrupt) are read from the parent's checkpoints and writes on
the host (``GraphAgent.rerun_input``) and recorded in the branch's ``run.started``. A thread is
re-run from a record of the same graph code: ``RunledgerSaver(client, agent=spec)`` records the
spec's version tuple (its ``agent_version`` is a hash of the graph's code). Rejected for the
inputs: serving them as Run API steps (a step kind the fold, the broker and every mode would
have to learn, and steps a diff would align against) and approvals in place of ``interrupt``
(LangGraph's human-in-the-loop would no longer be LangGraph's).

Time travel (``get_state_history``, ``update_state`` on a past config, invoking from a past
``checkpoint_id``) stays on the thread, as in LangGraph: the checkpoint whose parent is not the
latest of its namespace is recorded with ``forked: true`` and its parent, which ``runledger show``
prints and SQL reads from the ``events`` table.

``delete_thread`` erases the thread's run (runledger.protect.erasure): its keys are destroyed and
its blobs deleted, so no checkpoint can be read again, and the thread starts afresh (on a new run,
``<run id>-g<n>``). The log is immutable: the events stay, sealed and unreadable, and the hash
chain still verifies. ``delete_for_runs`` and ``prune`` (``keep_latest``) record a tombstone
(``graph.checkpoints_deleted``) that loading honours: the checkpoints and their writes leave the
index, their events stay readable in the log; ``prune(strategy="delete")`` is ``delete_thread``.
How a thread's run ends by itself: runledger.integrations.langgraph_outcome.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from runledger import require_extra

require_extra("langgraph", "runledger.integrations.langgraph")

from langchain_core.runnables import RunnableConfig  # noqa: E402
from langchain_core.tools import BaseTool, StructuredTool  # noqa: E402
from langgraph.checkpoint.base import (  # noqa: E402
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.serde.base import SerializerProtocol  # noqa: E402
from langgraph.pregel import Pregel  # noqa: E402

from runledger import (  # noqa: E402
    AgentSpec,
    Budgets,
    ConfigurationError,
    DataPolicy,
    GraphCheckpointed,
    GraphCheckpointsDeleted,
    GraphWritesSaved,
    LedgerClient,
    ModelAdapter,
    PayloadUnavailableError,
    RecordedRun,
    RunCompleted,
    RunFailed,
    RunNotFoundError,
    RunSuspended,
    erase_run,
    is_subject_token,
    list_runs,
    load_run,
    open_run,
)
from runledger.integrations.langchain import (  # noqa: E402
    JournaledChatModel,
    LangChainModelAdapter,
    declare_tool,
    journaled_tool,
)
from runledger.integrations.langgraph_connection import SaverConnection  # noqa: E402
from runledger.integrations.langgraph_outcome import (  # noqa: E402
    BreakpointHandler,
    Outcome,
    continues_outcome,
    outcome_event,
    outcome_of_writes,
    recorded_outcome,
    rests,
)
from runledger.integrations.langgraph_rerun import (  # noqa: E402
    GraphAgent,
    RedriveSaver,
    graph_agent,
    redrive_thread,
    thread_invocations,
)
from runledger.integrations.langgraph_sync import BlockingTwins  # noqa: E402
from runledger.integrations.langgraph_values import (  # noqa: E402
    DEFAULT_AGENT,
    START_CHANNEL,
    TAIL,
    Typed,
    record_to_typed,
    splice_tail,
    tail_record,
    typed_to_record,
)

T = TypeVar("T")
G = TypeVar("G", bound=Pregel[Any, Any, Any, Any])

THREAD_LABEL = "langgraph.thread_id"
# The fields of a checkpoint recorded in the clear (GraphCheckpointed.header): what LangGraph
# schedules with. Redaction must never see them: a version's random digits can pass for a card
# number, and a channel named "token" is a credential-named key to a detector.
_HEADER = ("v", "id", "ts", "channel_versions", "versions_seen", "updated_channels")
# The metadata's LangGraph run id, in the header too: an id (``delete_for_runs`` selects by it), which
# a card-number detector could take for one in the redacted metadata (a uuid's digits pass at times).
_RUN_ID = "metadata.run_id"


# -- threads and their runs ---------------------------------------------------------------------------------------


def thread_run_id(thread_id: str, generation: int = 1) -> str:
    """The run that records ``thread_id``: the thread id itself when it can stand in a subject,
    else ``lg-`` and a digest of it; ``-g<n>`` from the second generation (after a ``delete_thread``)."""
    base = thread_id if is_subject_token(thread_id) and len(thread_id) <= 100 else "lg-" + _digest(thread_id)
    return base if generation == 1 else f"{base}-g{generation}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class _Thread:
    """What this process knows of one thread: its generation, and its run once opened for writing."""

    thread_id: str
    generation: int = 1
    loaded: bool = False
    run: RecordedRun | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Appends and the outcomes they imply, one at a time (LangGraph saves a step's writes from
    # several tasks at once): the outcome recorded last in this process, None while running.
    appending: asyncio.Lock = field(default_factory=asyncio.Lock)
    ended: Outcome | None = None
    # The outcome the record ends at when this process loaded the thread (None: running).
    rested: RunCompleted | RunFailed | RunSuspended | None = None

    @property
    def run_id(self) -> str:
        return thread_run_id(self.thread_id, self.generation)


async def _no_agent_function(run: Any) -> None:
    raise ConfigurationError("a LangGraph thread's run is driven by its graph: invoke the graph with the saver")


def _no_agent_function_of(fn: Callable[..., Any]) -> Callable[[Any], Awaitable[None]]:
    """``_no_agent_function`` wrapping the graph agent's function ``fn``: the threads' runs record the
    code hash of ``fn``'s import closure (runledger.sdk.code_identity unwraps it), the graph's code,
    not this module's."""
    return functools.wraps(fn)(_no_agent_function_copy())


def _no_agent_function_copy() -> Callable[[Any], Awaitable[None]]:
    async def no_agent_function(run: Any) -> None:
        await _no_agent_function(run)

    return no_agent_function


class RunledgerSaver(BlockingTwins):
    """A LangGraph checkpointer whose state is the ledger (see the module docstring).

    ``client``: a connected ``LedgerClient`` (anything else, a URL say, is refused: for a saver with
    a connection of its own use ``from_conn_string``); the saver's async methods must run on its event loop,
    and its sync methods (``graph.invoke``) are allowed only from other threads (as LangGraph's own
    async savers: they hand the work to that loop). ``agent``: the agent name the threads' runs
    are recorded under (a subject token), or the graph's agent (``graph_agent``), whose name,
    version tuple, budgets and data policy the threads' runs record, so that ``runledger rerun``
    accepts them. ``data_policy``: what the record keeps of content (the default redacts and seals;
    ``hash-only`` is refused: a checkpointer must read its values back). ``by``: who
    ``delete_thread`` names as the eraser."""

    def __init__(
        self,
        client: LedgerClient,
        *,
        agent: str | AgentSpec = DEFAULT_AGENT,
        data_policy: DataPolicy | None = None,
        agent_version: str | None = None,
        serde: SerializerProtocol | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        by: str = "langgraph",
    ) -> None:
        super().__init__(serde=serde)
        if not isinstance(client, LedgerClient):
            raise ConfigurationError(
                f"RunledgerSaver needs a connected LedgerClient, not a {type(client).__name__}: with a URL, "
                "use `with RunledgerSaver.from_conn_string(url) as saver:` (or `async with`), "
                "or pass `await runledger.connect(url)`"
            )
        given = agent if isinstance(agent, AgentSpec) else None
        name = given.name if given is not None else str(agent)
        if not is_subject_token(name):
            raise ConfigurationError(f"agent {name!r} cannot be used in a subject: use 1-128 of A-Z a-z 0-9 _ -")
        policy = data_policy or (given.data_policy if given is not None else DataPolicy())
        if policy.capture == "hash-only":
            raise ConfigurationError("a checkpointer reads its values back: use capture 'redacted' or 'full'")
        self.client = client
        self.agent = name
        self.by = by
        # Outside a call the adapter names the version tuple's model: the re-run spec's, when given.
        self._adapter = LangChainModelAdapter(given.model.name if given is not None else "langchain")
        # The adapter's name is a property (the wrapped model's, per call): cast for the Protocol's attribute.
        # With a spec (graph_agent), the threads record its version tuple, so `runledger rerun` accepts them.
        self.spec = AgentSpec(
            name,
            _no_agent_function_of(given.fn) if given is not None else _no_agent_function,
            cast(ModelAdapter, self._adapter),
            tools=given.tools if given is not None else (),
            prompt=given.prompt if given is not None else "",
            agent_version=agent_version or (given.version().agent_version if given is not None else "langgraph"),
            budgets=given.budgets if given is not None else Budgets(),
            data_policy=policy,
        )
        self._threads: dict[str, _Thread] = {}
        # For tail records: the channel versions of each indexed checkpoint, (thread, ns, checkpoint id) -> ...
        self._versions: dict[tuple[str, str, str], dict[str, Any]] = {}
        # Checkpoints a tombstone took out of the index (entry, writes), for copy_thread.
        self._removed: dict[tuple[str, str, str], tuple[Any, dict[Any, Any]]] = {}
        self._all_loaded = False
        self._guard = threading.Lock()
        try:
            self.loop = loop or asyncio.get_running_loop()
        except RuntimeError as exc:
            raise ConfigurationError(
                "create RunledgerSaver inside the event loop of its client (or pass loop=)"
            ) from exc

    @classmethod
    def from_conn_string(
        cls, url: str | None = None, *, connect_options: dict[str, Any] | None = None, **saver_options: Any
    ) -> SaverConnection[RunledgerSaver]:
        """A saver on a connection of its own to ``url`` (by default where the ``runledger`` commands
        find the ledger: ``$RUNLEDGER_NATS_URL``, else the local cluster, else the embedded server), for
        a ``with`` block (sync graphs: the connection runs on a loop in its own thread) or an
        ``async with`` block (async graphs: on the running loop), closed at the end of the block
        (runledger.integrations.langgraph_connection). ``saver_options`` are the constructor's
        (``agent``, ``data_policy``, ...); ``connect_options`` go to ``runledger.connect``
        (``user_credentials``, ``ensure``, ...)."""
        return SaverConnection(url, lambda client, loop: cls(client, loop=loop, **saver_options), connect_options)

    # -- the journal of a thread, for runledger.integrations.langchain ------------------------------------------------

    async def run_for(self, config: RunnableConfig) -> RecordedRun:
        """The run of the thread ``config`` names, opened for writing (started, or continued fenced)."""
        return await self._opened(self._thread(_thread_id(config)))

    def model(self, chat_model: Any) -> JournaledChatModel:
        """``chat_model`` (any LangChain chat model) with its calls recorded as steps of the thread's run."""
        return JournaledChatModel(model=chat_model, saver=self)

    def tool(self, lc_tool: BaseTool, **declaration: Any) -> StructuredTool:
        """``lc_tool`` (any LangChain tool) with its calls recorded as steps; ``effect``, ``key``,
        ``reconcile``, ``lease_s`` declare it an effect (runledger.integrations.langchain.declare_tool)."""
        return journaled_tool(lc_tool, self, declare_tool(lc_tool, **declaration))

    async def acomplete(self, config: RunnableConfig, output: Any = None) -> None:
        """Record ``output`` as what the thread's graph produced (``run.completed``). Not needed for
        the run's status: the saver records the end of every invocation by itself
        (runledger.integrations.langgraph_outcome); this adds an output of the caller's choosing."""
        thread = self._thread(_thread_id(config))
        async with thread.appending:
            ended = thread.ended
            if ended is not None and ended.status != "completed":
                thread.run, thread.ended = None, None  # re-opened: completed from here
            run = await self._opened(thread)
            await run.record(RunCompleted(output=output))
            # Called while running: whatever comes next is a new invocation (no checkpoint is older than "").
            thread.ended = ended if ended is not None and ended.status == "completed" else Outcome("completed", "")

    def complete(self, config: RunnableConfig, output: Any = None) -> None:
        """Sync twin of ``acomplete``."""
        self.call_sync(self.acomplete(config, output))

    def watch(self, graph: G) -> G:
        """``graph`` (compiled with this saver) with the saver's ``BreakpointHandler`` in its config's
        callbacks, so that a static breakpoint (``interrupt_before`` / ``interrupt_after``), which
        reaches no checkpointer, ends the thread's run ``suspended`` as ``interrupt()`` does
        (runledger.integrations.langgraph_outcome); ``graph.invoke(None, config)`` goes on from it."""
        return graph.with_config(callbacks=[BreakpointHandler(self._suspend_at_breakpoint)])

    def _suspend_at_breakpoint(self, checkpoint_id: str, status: str) -> None:
        thread_id = next((t for t, by_ns in self.storage.items() if checkpoint_id in by_ns.get("", {})), None)
        if thread_id is not None:
            self.call_sync(self._asuspend(self._thread(thread_id), checkpoint_id, status))

    async def _asuspend(self, thread: _Thread, checkpoint_id: str, status: str) -> None:
        async with thread.appending:
            if thread.ended is not None:
                return  # the invocation's end is recorded already (an interrupt() or an error of its tasks)
            run = await self._opened(thread)
            await run.record(RunSuspended(step=run.checkpoint.last_step, request_id=checkpoint_id, reason=status))
            thread.ended = Outcome("suspended", checkpoint_id, breakpoint=True)

    # -- loading ---------------------------------------------------------------------------------------------

    def _thread(self, thread_id: str) -> _Thread:
        with self._guard:
            thread = self._threads.get(thread_id)
            if thread is None:
                thread = self._threads[thread_id] = _Thread(str(thread_id))
            return thread

    async def _loaded(self, thread_id: str) -> _Thread:
        thread = self._thread(thread_id)
        if not thread.loaded:
            async with thread.lock:
                if not thread.loaded:
                    await self._load(thread)
        return thread

    async def _load(self, thread: _Thread) -> None:
        """Fill the index with the thread's live generation: the first run of it that is not erased."""
        while True:
            try:
                log = await load_run(self.client, thread.run_id, agent=self.agent, fetch=True)
            except RunNotFoundError:
                break
            events = [rec.event for rec in log.records]
            labels = events[0].payload.get("labels", {}) if events and events[0].type == "run.started" else {}
            if labels.get(THREAD_LABEL, thread.thread_id) != thread.thread_id:
                raise ConfigurationError(
                    f"run {thread.run_id} records thread {labels.get(THREAD_LABEL)!r}, not {thread.thread_id!r}: "
                    "give the saver another agent name"
                )
            if any(ev.type == "run.erased" for ev in events):
                thread.generation += 1
                continue
            for ev in events:
                if ev.type == GraphCheckpointed.TYPE:
                    self._index_checkpoint(ev.payload)
                elif ev.type == GraphWritesSaved.TYPE:
                    self._index_writes(ev.payload)
                elif ev.type == GraphCheckpointsDeleted.TYPE:
                    self._drop(thread.thread_id, ev.payload.get("checkpoints") or {})
            thread.rested = recorded_outcome(events)
            break
        thread.loaded = True

    async def _load_all(self) -> None:
        if self._all_loaded:
            return
        for summary in await list_runs(self.client, agent=self.agent):
            if summary.run_id in {t.run_id for t in self._threads.values()}:
                continue
            try:
                log = await load_run(self.client, summary.run_id, agent=self.agent, open_content=False)
            except RunNotFoundError:
                continue
            first = log.records[0].event if log.records else None
            thread_id = (first.payload.get("labels") or {}).get(THREAD_LABEL) if first else None
            if thread_id is not None:
                await self._loaded(str(thread_id))
        self._all_loaded = True

    async def _opened(self, thread: _Thread) -> RecordedRun:
        if thread.run is None:
            async with thread.lock:
                if not thread.loaded:
                    await self._load(thread)
                if thread.run is None:
                    thread.run = await open_run(
                        self.client, self.spec, thread.run_id, {"thread_id": thread.thread_id},
                        labels={THREAD_LABEL: thread.thread_id},
                    )  # fmt: skip
        return thread.run

    # -- appending, and the outcome an append implies ------------------------------------------------------------

    async def _append(
        self,
        thread: _Thread,
        event: GraphCheckpointed | GraphWritesSaved,
        index: Callable[[RecordedRun], None],
        writes: Sequence[tuple[str, Any]] = (),
        *,
        judge: bool = True,
    ) -> None:
        """Record ``event`` on the thread's run, then ``index`` it, then the outcome it implies
        (``judge``; ``writes``: the live values of a writes event). An append after an outcome
        re-opens the run unless it is a late write of the superstep that ended."""
        async with thread.appending:
            ended = thread.ended
            task = event.task_id if isinstance(event, GraphWritesSaved) else None
            late = ended is not None and continues_outcome(ended, event.checkpoint_id, task, event.channels)
            if ended is not None and not late:
                thread.run, thread.ended = None, None  # a new invocation: the run is re-opened (run.resumed)
            run = await self._opened(thread)
            await run.record(event)
            index(run)
            if not judge or event.checkpoint_ns != "" or (late and task is None):
                return  # a subgraph's end is not the thread's (its parent task reports it)
            if isinstance(event, GraphCheckpointed):
                outcome = Outcome("completed", event.checkpoint_id) if rests(event.header) else None
            else:
                outcome = outcome_of_writes(event.checkpoint_id, event.task_id, writes)
            if outcome is None:
                return
            if thread.ended is not None and (thread.ended.status == "failed" or outcome.status != "failed"):
                thread.ended = replace(thread.ended, by=thread.ended.by | outcome.by)  # already recorded
                return
            await run.record(outcome_event(outcome, event.checkpoint_id, run.checkpoint.last_step))
            thread.ended = outcome

    # -- the index (InMemorySaver's structures), from events ----------------------------------------------------------

    def _index_checkpoint(
        self, p: Mapping[str, Any], typed: Mapping[str, Typed] | None = None, run: RecordedRun | None = None
    ) -> None:
        """Index a checkpoint's event; ``typed``: the values as serialized, when this process wrote them;
        ``run``: the run this process appended the event to, whose record gives the header back in its
        own form (keys in canonical order), the form indexed here too: what ``get_tuple`` returns in
        this process is what it returns in one that reads the thread from the log."""
        thread_id, ns, cid = p["thread_id"], p.get("checkpoint_ns", ""), p["checkpoint_id"]
        values = dict(zip(p.get("channels") or [], p.get("values") or [], strict=False))
        for channel, version in (p.get("new_versions") or {}).items():
            record = values.get(channel)
            if typed is not None and channel in typed:
                value = typed[channel]
            elif record is None:
                value = ("empty", b"")
            elif isinstance(record, Mapping) and record.get("type") == TAIL:
                value = self._spliced(thread_id, ns, cid, p.get("parent_checkpoint_id"), channel, record)
            else:
                value = record_to_typed(record)
            self.blobs[(thread_id, ns, channel, version)] = value
        self._versions[(thread_id, ns, cid)] = dict((p.get("header") or {}).get("channel_versions") or {})
        rest = self.serde.loads_typed(record_to_typed(p["checkpoint"])) if p.get("checkpoint") else {}
        header = dict((run.as_recorded(p.get("header")) if run is not None else p.get("header")) or {})
        run_id, metadata = header.pop(_RUN_ID, None), record_to_typed(p["metadata"])
        if run_id is not None and (opened := self.serde.loads_typed(metadata)).get("run_id") != run_id:
            metadata = self.serde.dumps_typed({**opened, "run_id": run_id})
        self.storage[thread_id][ns][p["checkpoint_id"]] = (
            self.serde.dumps_typed({**header, **rest}),
            metadata,
            p.get("parent_checkpoint_id"),
        )

    def _spliced(
        self, thread_id: str, ns: str, cid: str, parent: str | None, channel: str, record: Mapping[str, Any]
    ) -> Typed:
        version = self._versions.get((thread_id, ns, parent or ""), {}).get(channel)
        base = self.blobs.get((thread_id, ns, channel, version)) if version is not None else None
        try:
            if base is None:
                raise ValueError(f"its parent checkpoint {parent} holds no earlier value of the channel")
            return splice_tail(base, record)
        except (ValueError, TypeError, KeyError) as exc:
            raise PayloadUnavailableError(
                f"channel {channel!r} of checkpoint {cid} of LangGraph thread {thread_id!r}", str(exc)
            ) from exc

    def _record_value(self, thread_id: str, ns: str, parent: str | None, channel: str, typed: Typed) -> Any:
        """``typed`` as a record: its tail when it extends the channel's value in the parent checkpoint."""
        version = self._versions.get((thread_id, ns, parent or ""), {}).get(channel)
        base = self.blobs.get((thread_id, ns, channel, version)) if version is not None else None
        if base is not None and channel != START_CHANNEL:  # an input is read on its own (thread_invocations)
            found = tail_record(base, typed)
            if found is not None:
                return found
        return typed_to_record(typed)

    def _index_writes(self, p: Mapping[str, Any]) -> None:
        outer_key = (p["thread_id"], p.get("checkpoint_ns", ""), p["checkpoint_id"])
        task_id, task_path = p["task_id"], p.get("task_path", "")
        for idx, (channel, record) in enumerate(zip(p.get("channels") or [], p.get("writes") or [], strict=False)):
            inner_key = (task_id, WRITES_IDX_MAP.get(channel, idx))
            if inner_key[1] >= 0 and inner_key in self.writes.get(outer_key, {}):
                continue  # as InMemorySaver.put_writes: a task's regular writes are saved once
            self.writes[outer_key][inner_key] = (task_id, channel, record_to_typed(record), task_path)

    # -- async methods (the event loop of the client) ----------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        await self._loaded(_thread_id(config))
        return InMemorySaver.get_tuple(self, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        if config is None:
            await self._load_all()
        else:
            await self._loaded(_thread_id(config))
        if config is not None and config["configurable"].get("checkpoint_ns") is not None:
            for item in InMemorySaver.list(self, config, filter=filter, before=before, limit=limit):
                yield item  # one namespace of one thread: newest first already
            return
        # Across namespaces (and threads), newest first as the durable savers (SqliteSaver,
        # PostgresSaver: ORDER BY checkpoint_id DESC) list, where InMemorySaver goes namespace by namespace.
        found = list(InMemorySaver.list(self, config, filter=filter, before=before))
        found.sort(key=lambda t: str(t.config["configurable"]["checkpoint_id"]), reverse=True)
        for item in found if limit is None else found[: max(limit, 0)]:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id = _thread_id(config)
        ns = config["configurable"]["checkpoint_ns"]
        parent = config["configurable"].get("checkpoint_id")
        thread = await self._loaded(thread_id)
        saved = self.storage[thread_id][ns]
        stored: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = stored.pop("channel_values")
        header = {k: stored.pop(k) for k in _HEADER if k in stored}
        if not stored.get("pending_sends"):
            stored.pop("pending_sends", None)  # always empty since checkpoint format 4
        merged = get_checkpoint_metadata(config, metadata)
        if isinstance(merged.get("run_id"), str):
            header[_RUN_ID] = merged["run_id"]
        channels = [k for k in new_versions if k in values]
        typed = {k: self.serde.dumps_typed(values[k]) for k in channels}
        step = merged.get("step")
        event = GraphCheckpointed(
            thread_id=thread_id,
            checkpoint_ns=ns,
            checkpoint_id=checkpoint["id"],
            parent_checkpoint_id=parent,
            source=merged.get("source"),
            graph_step=step if isinstance(step, int) else None,
            forked=bool(parent and saved and parent != max(saved)),
            header=header,
            new_versions=dict(new_versions),
            channels=channels,
            values=[self._record_value(thread_id, ns, parent, k, typed[k]) for k in channels],
            metadata=typed_to_record(self.serde.dumps_typed(merged)),
            checkpoint=typed_to_record(self.serde.dumps_typed(stored)) if stored else None,
        )
        # write-ahead: the index changes only after the ack
        await self._append(thread, event, lambda run: self._index_checkpoint(event.model_dump(), typed, run))
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        thread_id = _thread_id(config)
        ns = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id = config["configurable"]["checkpoint_id"]
        thread = await self._loaded(thread_id)
        known = self.writes.get((thread_id, ns, checkpoint_id), {})
        new = [
            (task_id, WRITES_IDX_MAP.get(c, idx)) not in known or WRITES_IDX_MAP.get(c, idx) < 0
            for idx, (c, _) in enumerate(writes)
        ]
        if not any(new):
            return  # nothing InMemorySaver would store: nothing to record
        event = GraphWritesSaved(
            thread_id=thread_id,
            checkpoint_ns=ns,
            checkpoint_id=checkpoint_id,
            task_id=task_id,
            task_path=task_path,
            channels=[c for c, _ in writes],
            writes=[typed_to_record(self.serde.dumps_typed(v)) for _, v in writes],
        )
        await self._append(thread, event, _ignoring_run(lambda: self._index_writes(event.model_dump())), writes)

    async def adelete_thread(self, thread_id: str) -> None:
        thread = await self._loaded(thread_id)
        async with thread.lock:
            try:
                await erase_run(
                    self.client, thread.run_id, reason=f"LangGraph delete_thread({thread_id!r})", by=self.by
                )
            except RunNotFoundError:
                return  # nothing was ever recorded for the thread
            finally:
                InMemorySaver.delete_thread(self, thread_id)
                for key in [k for k in self._versions if k[0] == thread_id]:
                    del self._versions[key]
            thread.run, thread.ended, thread.rested = None, None, None
            thread.generation += 1
            for key in [k for k in self._removed if k[0] == thread_id]:
                del self._removed[key]

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint whose metadata names one of ``run_ids`` (LangGraph run ids), with
        its pending writes, in every thread of the saver's agent: a ``graph.checkpoints_deleted``
        tombstone on each thread's run (module docstring; the events stay in the log)."""
        wanted = {str(r) for r in run_ids}
        if not wanted:
            return
        await self._load_all()
        for thread_id in list(self.storage):
            found = {
                ns: [
                    cid for cid, (_, md, _) in by_id.items() if str(self.serde.loads_typed(md).get("run_id")) in wanted
                ]
                for ns, by_id in self.storage[thread_id].items()
            }
            found = {ns: ids for ns, ids in found.items() if ids}
            if found:
                await self._delete(self._thread(thread_id), found, "delete_for_runs", sorted(wanted))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: delete all but the latest checkpoint of each namespace of each thread (a
        tombstone, as ``delete_for_runs``); ``delete``: ``delete_thread`` each thread (an erasure)."""
        if strategy not in ("keep_latest", "delete"):
            raise ConfigurationError(f"prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        for thread_id in map(str, thread_ids):
            if strategy == "delete":
                await self.adelete_thread(thread_id)
                continue
            thread = await self._loaded(thread_id)
            older = {ns: sorted(ids)[:-1] for ns, ids in self.storage[thread_id].items() if len(ids) > 1}
            if older:
                await self._delete(thread, older, "prune")

    async def _delete(
        self, thread: _Thread, checkpoints: dict[str, list[str]], reason: str, run_ids: Sequence[str] = ()
    ) -> None:
        event = GraphCheckpointsDeleted(
            thread_id=thread.thread_id, checkpoints=checkpoints, reason=reason, run_ids=list(run_ids)
        )
        async with thread.appending:
            reopening = thread.run is None
            run = await self._opened(thread)
            await run.record(event)
            self._drop(thread.thread_id, checkpoints)
            if reopening and thread.rested is not None:
                # Opened only to record the deletion (run.resumed): the run was at rest and stays so.
                await run.record(thread.rested)
                thread.ended = Outcome(thread.rested.TYPE.removeprefix("run."), "")

    def _drop(self, thread_id: str, checkpoints: Mapping[str, Sequence[str]]) -> None:
        """Honour a tombstone: the checkpoints and their writes leave the index (kept aside for
        ``copy_thread``). Channel values stay: a kept checkpoint may read a version a deleted one stored."""
        for ns, ids in checkpoints.items():
            for cid in ids:
                entry = self.storage[thread_id][ns].pop(cid, None)
                writes = self.writes.pop((thread_id, ns, cid), {})
                if entry is not None:
                    self._removed[(thread_id, ns, cid)] = (entry, writes)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Record every checkpoint, write and deletion of ``source_thread_id`` again, in order, on the
        run of ``target_thread_id`` (the values as this saver holds them: live values where it wrote
        them), so the target reads as the source does."""
        source = await self._loaded(source_thread_id)
        try:
            log = await load_run(self.client, source.run_id, agent=self.agent, open_content=False)
        except RunNotFoundError:
            return  # nothing recorded: nothing to copy
        kinds = (GraphCheckpointed.TYPE, GraphWritesSaved.TYPE, GraphCheckpointsDeleted.TYPE)
        events = [r.event for r in log.records if r.event.type in kinds]
        if not events:
            return
        target = await self._loaded(target_thread_id)
        for ev in events:
            p = ev.payload
            if ev.type == GraphCheckpointsDeleted.TYPE:
                await self._delete(target, p.get("checkpoints") or {}, p["reason"], p.get("run_ids") or [])
                continue
            ns, cid = p.get("checkpoint_ns", ""), p["checkpoint_id"]
            removed = self._removed.get((source_thread_id, ns, cid))  # deleted since: copied, then deleted
            copied: GraphCheckpointed | GraphWritesSaved
            if ev.type == GraphCheckpointed.TYPE:
                rest, metadata, _ = removed[0] if removed else self.storage[source_thread_id][ns][cid]
                versions = p.get("new_versions") or {}
                rest_value = self.serde.loads_typed(rest)
                extra = {k: v for k, v in rest_value.items() if k not in _HEADER}
                copied = GraphCheckpointed(
                    **{k: v for k, v in p.items() if k not in ("values", "metadata", "checkpoint", "thread_id")},
                    thread_id=target_thread_id,
                    values=[typed_to_record(self.blobs[(source_thread_id, ns, c, versions[c])]) for c in p["channels"]],
                    metadata=typed_to_record(metadata),
                    checkpoint=typed_to_record(self.serde.dumps_typed(extra)) if extra else None,
                )
                await self._append(
                    target, copied, functools.partial(self._index_checkpoint, copied.model_dump(), None), judge=False
                )
            else:
                saved = removed[1] if removed else self.writes.get((source_thread_id, ns, cid), {})
                keys = [(p["task_id"], WRITES_IDX_MAP.get(c, i)) for i, c in enumerate(p.get("channels") or [])]
                copied = GraphWritesSaved(
                    **{k: v for k, v in p.items() if k not in ("writes", "thread_id")},
                    thread_id=target_thread_id,
                    writes=[typed_to_record(saved[k][2]) if k in saved else {"type": "null"} for k in keys],
                )
                await self._append(
                    target,
                    copied,
                    _ignoring_run(functools.partial(self._index_writes, copied.model_dump())),
                    judge=False,
                )

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        await self._loaded(_thread_id(config))
        return InMemorySaver.get_delta_channel_history(self, config=config, channels=channels)


def _ignoring_run(index: Callable[[], None]) -> Callable[[RecordedRun], None]:
    """An index of an event that reads nothing of the run it was appended to (a task's writes: values only)."""
    return lambda run: index()


def _thread_id(config: RunnableConfig) -> str:
    try:
        return str(config["configurable"]["thread_id"])
    except KeyError as exc:
        raise ConfigurationError(
            'a LangGraph checkpointer needs a thread: config={"configurable": {"thread_id": ...}}'
        ) from exc


__all__ = [
    "THREAD_LABEL",
    "GraphAgent",
    "RedriveSaver",
    "RunledgerSaver",
    "graph_agent",
    "record_to_typed",
    "redrive_thread",
    "thread_invocations",
    "thread_run_id",
    "typed_to_record",
]
