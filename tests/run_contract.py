"""The ``Run`` contract: the same scripted agents through every implementation of ``Run``, by behaviour.

``RunContract`` is an abstract test case (the way eventsourcing tests each recorder and LangGraph
each checkpoint saver): a subclass says how it drives an agent (``drive``: a recorded run on the
in-memory ledger or on nats-server, a run stopped after a few steps and resumed, the blocking
``SyncRun`` facade, a re-drive ``BranchRun`` on the host, the sandbox guest's ``RemoteRun`` over
the broker) and every test here runs through it. Each compares against one expectation:

(a) what the agent observed: the value of every call as the agent received it (a model's reply,
    a keyword tool's result with its dict keys as recorded, an effect's result, two calls made at
    once with ``asyncio.gather``, ``now()`` and ``random()``: the values the run recorded);
(b) what was written: the run's events in order, by type and step with their essentials (the
    tool, its arguments and output, the effect's key and result, the outcome);
(c) side effects: the effect's function ran at most once for its key, whatever the driver.

The agents live here, importable as ``tests.run_contract:NAME`` (the sandbox guest loads them so).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

from runledger import AgentSpec, Run, ScriptedModel, SyncRun, tool
from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.record.events import Event
from runledger.sdk.sync import sync_agent
from tests.killed import killed

AGENT = "contract"
VERSION = "contract-v1"

# What the agent saw, call by call, in the drive that ran last (a resumed run's first drive is
# overwritten by the resume's, which observes everything again from its journal).
OBSERVED: list[tuple[str, Any]] = []
ACTED: list[dict[str, Any]] = []  # every time the effect's function really ran (any drive)
STOP_AFTER: list[int] = []  # when set, the agent dies (an uncaught BaseException) after this many calls


class Killed(BaseException):
    """The process dying between two steps: nothing records an outcome (drive catches Exception only)."""


def _saw(seen: list[tuple[str, Any]], kind: str, value: Any) -> Any:
    """Note what the agent observed: in ``seen`` (the agent's output carries it, across a sandbox's
    channel too) and in ``OBSERVED`` (what a driver in this process reads, as the agent had it)."""
    seen.append((kind, value))
    OBSERVED.append((kind, value))
    if STOP_AFTER and len(OBSERVED) >= STOP_AFTER[0]:
        raise Killed(f"killed after {len(OBSERVED)} calls")
    return value


@tool(inline=True)
def lookup(sku: str, qty: int = 1) -> dict[str, Any]:
    """A keyword read tool whose result is an unsorted dict."""
    return {"sku": sku, "qty": qty, "price": 3 * qty, "available": True}


def _charge(args: dict[str, Any]) -> dict[str, Any]:
    ACTED.append(args)
    return {"charged": args["amount"], "order": args["order"]}


charge = tool("charge", effect="write", key=lambda a: f"charge:{a['order']}", inline=True)(_charge)


@tool(inline=True)
def square(n: int) -> int:
    return n * n


def _reply(messages: list[dict[str, Any]]) -> str:
    return f"echo: {messages[-1]['content']}"


async def shopper(run: Run) -> Any:
    """One of each kind of call a run records."""
    seen: list[tuple[str, Any]] = []
    reply = await run.model([{"role": "user", "content": f"buy {run.input['sku']}"}])
    _saw(seen, "model", reply.content)
    _saw(seen, "lookup", await run.tool(lookup, {"qty": 2, "sku": run.input["sku"]}))
    _saw(seen, "charge", await run.tool(charge, {"order": run.input["order"], "amount": 6}))
    _saw(seen, "gather", list(await asyncio.gather(run.tool(square, {"n": 3}), run.tool(square, {"n": 4}))))
    _saw(seen, "now", (await run.now()).isoformat())
    _saw(seen, "random", await run.random())
    return {"reply": reply.content, "done": True, "observed": seen}


def sync_shopper(run: SyncRun) -> Any:
    """``shopper`` written against the blocking facade: two threads make the calls at once."""
    seen: list[tuple[str, Any]] = []
    reply = run.model([{"role": "user", "content": f"buy {run.input['sku']}"}])
    _saw(seen, "model", reply.content)
    _saw(seen, "lookup", run.tool(lookup, {"qty": 2, "sku": run.input["sku"]}))
    _saw(seen, "charge", run.tool(charge, {"order": run.input["order"], "amount": 6}))
    with ThreadPoolExecutor(2) as pool:
        _saw(seen, "gather", list(pool.map(lambda n: run.tool(square, {"n": n}), [3, 4])))
    _saw(seen, "now", run.now().isoformat())
    _saw(seen, "random", run.random())
    return {"reply": reply.content, "done": True, "observed": seen}


def spec(fn: Callable[..., Any] = shopper) -> AgentSpec:
    """A fresh spec (its scripted model answers from the messages, so a live call answers the same)."""
    return AgentSpec(AGENT, fn, ScriptedModel(_reply), agent_version=VERSION, tools=[lookup, charge, square])


def sync_spec() -> AgentSpec:
    return spec(sync_agent(sync_shopper))


INPUT = {"sku": "b-7", "order": "o-1"}
EXPECTED_OBSERVED = [
    ("model", "echo: buy b-7"),
    ("lookup", {"available": True, "price": 6, "qty": 2, "sku": "b-7"}),
    ("charge", {"charged": 6, "order": "o-1"}),
    ("gather", [9, 16]),
]
EXPECTED_EVENTS = [
    ("run.started", None, {"input": INPUT}),
    ("model.called", 0, {"response": "echo: buy b-7"}),
    ("tool.called", 1, {"name": "lookup", "args": {"qty": 2, "sku": "b-7"}, "output": EXPECTED_OBSERVED[1][1]}),
    ("effect.intended", 2, {"name": "charge", "key": "charge:o-1", "args": {"amount": 6, "order": "o-1"}}),
    ("effect.committed", 2, {"key": "charge:o-1", "result": EXPECTED_OBSERVED[2][1]}),
    ("tool.called", 3, {"name": "square", "args": {"n": 3}, "output": 9}),
    ("tool.called", 4, {"name": "square", "args": {"n": 4}, "output": 16}),
    ("clock.read", 5, {}),
    ("random.drawn", 6, {}),
    ("run.completed", None, {"output": {"done": True, "reply": "echo: buy b-7"}}),
]
# Framing events a driver adds around the agent's steps (checked by the driver's own test).
FRAMING = frozenset({"run.resumed", "run.forked"})


def essentials(event: Event) -> tuple[str, int | None, dict[str, Any]]:
    """(type, step, the payload fields the contract compares) of one event."""
    p = event.payload
    fields: dict[str, Any] = {}
    if event.type == "run.started":
        fields = {"input": p.get("input")}
    elif event.type == "model.called":
        fields = {"response": (p.get("response") or {}).get("content")}
    elif event.type == "tool.called":
        fields = {"name": p.get("name"), "args": p.get("args"), "output": p.get("output")}
    elif event.type == "effect.intended":
        fields = {"name": p.get("name"), "key": p.get("key"), "args": p.get("args")}
    elif event.type == "effect.committed":
        fields = {"key": p.get("key"), "result": p.get("result")}
    elif event.type == "run.completed":
        fields = {"output": {k: v for k, v in (p.get("output") or {}).items() if k != "observed"}}
    return event.type, p.get("step"), fields


@dataclass
class Drive:
    """What one driver produced: the run's id, its events (content opened), what the agent observed
    in the drive that ended the run, and the effect's real executions."""

    run_id: str
    status: str
    events: list[Event]
    observed: list[tuple[str, Any]] = field(default_factory=list)
    acted: list[dict[str, Any]] = field(default_factory=list)
    parent: list[Event] = field(default_factory=list)  # a re-run's: the parent run's events


async def events_of(client: LedgerClient, run_id: str) -> list[Event]:
    return (await load_run(client, run_id)).events


class RunContract:
    """The abstract contract; subclasses implement ``drive`` (and say what they add around the steps)."""

    implementation: ClassVar[str] = ""  # the class of Run the agent is driven on
    framing: ClassVar[list[str]] = []  # framing events this driver writes (FRAMING), in order
    acts: ClassVar[int] = 1  # how many times the effect's function runs in the drive

    async def drive(self, run_id: str) -> Drive:
        raise NotImplementedError

    def normalized(
        self, steps: list[tuple[str, int | None, dict[str, Any]]]
    ) -> list[tuple[str, int | None, dict[str, Any]]]:
        """The written steps as the expectation orders them (a driver whose calls made at once take
        their step numbers in no fixed order sorts them here)."""
        return steps

    async def _drive(self) -> Drive:
        OBSERVED.clear()
        ACTED.clear()
        STOP_AFTER.clear()
        os.environ.pop("RUNLEDGER_CRASH_AT", None)
        return await self.drive("contract-1")

    async def test_the_agent_observes_what_the_script_says(self) -> None:
        drive = await self._drive()
        assert drive.status == "completed", drive
        kinds = [kind for kind, _ in drive.observed]
        assert kinds == ["model", "lookup", "charge", "gather", "now", "random"]
        assert drive.observed[:4] == EXPECTED_OBSERVED
        # Dict keys as recorded (canonical: sorted), whatever order the tool built them in.
        assert list(drive.observed[1][1]) == sorted(drive.observed[1][1])
        now, rnd = drive.observed[4][1], drive.observed[5][1]
        assert isinstance(dt.datetime.fromisoformat(now), dt.datetime)
        assert isinstance(rnd, float) and 0.0 <= rnd < 1.0

    async def test_now_and_random_are_the_values_the_run_recorded(self) -> None:
        drive = await self._drive()
        by_type = {e.type: e.payload for e in drive.events}
        assert dt.datetime.fromisoformat(by_type["clock.read"]["value"]).isoformat() == drive.observed[4][1]
        assert by_type["random.drawn"]["value"] == drive.observed[5][1]

    async def test_the_events_written_are_the_script_in_order(self) -> None:
        drive = await self._drive()
        written = [essentials(e) for e in drive.events]
        assert [t for t, _, _ in written if t in FRAMING] == self.framing
        steps = self.normalized([w for w in written if w[0] not in FRAMING])
        assert steps == EXPECTED_EVENTS
        assert [e.seq for e in drive.events] == list(range(len(drive.events)))  # one gap-free chain

    async def test_a_re_run_observes_what_its_parent_recorded(self) -> None:
        drive = await self._drive()
        if not drive.parent:
            return  # not a re-run
        recorded = [(e.type, e.payload.get("value")) for e in drive.parent if e.type in ("clock.read", "random.drawn")]
        observed = [(kind, value) for kind, value in drive.observed if kind in ("now", "random")]
        assert [dt.datetime.fromisoformat(v).isoformat() if t == "clock.read" else v for t, v in recorded] == [
            v for _, v in observed
        ]
        assert [essentials(e) for e in drive.parent] == EXPECTED_EVENTS  # the parent is a recorded run

    async def test_the_effect_acts_at_most_once(self) -> None:
        drive = await self._drive()
        assert drive.acted == [{"order": "o-1", "amount": 6}] * self.acts


def finished(run_id: str, status: str, events: list[Event], parent: list[Event] | None = None) -> Drive:
    return Drive(run_id, status, events, list(OBSERVED), list(ACTED), parent or [])


# -- drivers shared by the unit (in-memory) and integration (nats-server) suites -----------------------


async def recorded(client: LedgerClient, run_id: str, make: Callable[[], AgentSpec] = spec) -> Drive:
    """``start_run``: a recorded run, driven live."""
    from runledger.sdk.lifecycle import start_run

    result = await start_run(client, make(), INPUT, run_id=run_id)
    return finished(run_id, result.status, await events_of(client, run_id))


async def resumed(client: LedgerClient, run_id: str, stop_after: int) -> Drive:
    """A run that dies after ``stop_after`` calls (no outcome recorded), then ``resume_run``: the
    resume observes everything again, from its journal up to the kill and live after it."""
    from runledger.sdk.lifecycle import resume_run, start_run

    STOP_AFTER.append(stop_after)
    await killed(start_run(client, spec(), INPUT, run_id=run_id), Killed)
    STOP_AFTER.clear()
    OBSERVED.clear()
    result = await resume_run(client, spec(), run_id)
    return finished(run_id, result.status, await events_of(client, run_id))


async def branch_in_process(client: LedgerClient, parent_id: str, fork_step: int) -> Drive:
    """The host's ``BranchRun`` of a re-drive from ``fork_step``, the agent driven on it directly
    (what the broker does for a sandboxed agent, without the channel)."""
    from runledger.log.publish import RetryPolicy
    from runledger.record.fold import fold
    from runledger.sandbox.branch import BranchRun
    from runledger.sandbox.rerun import Rerunner, RerunRequest
    from runledger.sdk.lifecycle import drive

    await recorded(client, parent_id)
    OBSERVED.clear()
    ACTED.clear()
    parent = fold((await load_run(client, parent_id, open_content=False)).records)
    request = RerunRequest(
        parent_run_id=parent_id, agent="tests.run_contract:spec", mode="redrive", fork_step=fork_step
    )
    rerunner = Rerunner(client, None)  # type: ignore[arg-type]  # no sandbox: the host side alone
    cp, writer, protector, run_input = await rerunner._open_branch(spec(), parent, request, fork_step, None, None, None)
    run = BranchRun(
        client,
        spec(),
        writer,
        cp,
        policy=RetryPolicy(),
        parent=parent,
        fork_step=fork_step,
        mode="redrive",
        protector=protector,
    )
    run._input = run_input
    result = await drive(run, spec(), record_nondeterminism=True)
    return finished(run.run_id, result.status, await events_of(client, run.run_id), await events_of(client, parent_id))


class InProcessSandbox:
    """A sandbox without a container: the guest (``runledger.sandbox.guest.serve``) runs as a task of
    this process and talks to the broker over a Unix socket, as it does inside a container."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.hello: Any = None
        self._connected: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()

    async def start(self) -> InProcessSandbox:
        from runledger.sandbox import guest
        from runledger.sandbox.channel import MAX_LINE, read_message

        self._server = await asyncio.start_unix_server(
            lambda r, w: self._connected.put_nowait((r, w)), self.path, limit=MAX_LINE
        )
        self.guest = asyncio.ensure_future(guest.serve(self.path))
        self.reader, self.writer = await asyncio.wait_for(self._connected.get(), 10)
        self.hello = await read_message(self.reader)
        return self

    async def channel(self, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return self.reader, self.writer

    async def describe(self) -> str:
        return "an in-process guest"

    async def close(self) -> None:
        self.writer.close()
        self._server.close()
        if not self.guest.done():
            self.guest.cancel()
        await asyncio.gather(self.guest, return_exceptions=True)


class InProcessPool:
    """What ``Rerunner`` asks of a ``SandboxPool``, with in-process sandboxes."""

    def __init__(self, directory: str) -> None:
        from runledger.sandbox.containers import SandboxPolicy

        self.directory = directory
        self.policy = SandboxPolicy(timeout_s=30)
        self.warm_hits = 0
        self.sandboxes: list[InProcessSandbox] = []

    async def acquire(self, code: Any, agent: str) -> InProcessSandbox:
        sandbox = await InProcessSandbox(os.path.join(self.directory, f"b{len(self.sandboxes)}.sock")).start()
        self.sandboxes.append(sandbox)
        return sandbox

    async def discard(self, sandbox: InProcessSandbox) -> None:
        await sandbox.close()

    def finish_later(self, sandbox: InProcessSandbox) -> None:
        """Closed by ``remote`` once the re-run returned (a pool lets it exit in the background)."""


async def remote(client: LedgerClient, parent_id: str, fork_step: int, pool: Any) -> Drive:
    """A re-drive through ``Rerunner.rerun``: the agent runs on the guest's ``RemoteRun``, every call a
    request to the broker, answered by the host's ``BranchRun``. ``pool``: an ``InProcessPool``, or
    a ``SandboxPool`` of containers (the guest's observations then come back in the agent's output)."""
    from runledger.sandbox.rerun import Rerunner, RerunRequest
    from runledger.sdk.agent import CodeAllowList

    await recorded(client, parent_id)
    OBSERVED.clear()
    ACTED.clear()
    request = RerunRequest(
        parent_run_id=parent_id, agent="tests.run_contract:spec", mode="redrive", fork_step=fork_step
    )
    rerunner = Rerunner(client, pool, allowed=CodeAllowList((".", "tests")))
    result = await rerunner.rerun(request)
    for sandbox in getattr(pool, "sandboxes", []):
        await sandbox.close()
    assert result.requests > 0, result  # the agent's calls crossed the channel
    drive = finished(
        result.run_id, result.status, await events_of(client, result.run_id), await events_of(client, parent_id)
    )
    if not isinstance(pool, InProcessPool):  # the agent ran in a container: what it saw is in its output
        drive.observed = [(kind, value) for kind, value in (result.output or {}).get("observed", [])]
    return drive


# -- one abstract case per implementation; a suite gives each its ``client`` -------------------------


class RecordedRunContract(RunContract):
    """``RecordedRun``, driven live by ``start_run``."""

    client: LedgerClient
    implementation = "RecordedRun"

    async def drive(self, run_id: str) -> Drive:
        return await recorded(self.client, run_id)


class ResumedRunContract(RunContract):
    """A ``RecordedRun`` killed after the effect, before the parallel calls, then resumed."""

    client: LedgerClient
    implementation = "RecordedRun"
    framing = ["run.resumed"]

    async def drive(self, run_id: str) -> Drive:
        return await resumed(self.client, run_id, stop_after=3)


class SyncRunContract(RunContract):
    """``SyncRun`` over a ``RecordedRun`` (``sync_agent``)."""

    client: LedgerClient
    implementation = "SyncRun"

    async def drive(self, run_id: str) -> Drive:
        return await recorded(self.client, run_id, sync_spec)

    def normalized(self, steps: list[Any]) -> list[Any]:
        # Two threads call at once: which takes step 3 is not fixed (the pair is sorted by argument).
        pair = sorted(steps[5:7], key=lambda s: s[2]["args"]["n"])
        return steps[:5] + [(t, 3 + i, f) for i, (t, _, f) in enumerate(pair)] + steps[7:]


class BranchRunContract(RunContract):
    """``BranchRun``: a re-drive from step 2 (the effect), served from the parent's record."""

    client: LedgerClient
    implementation = "BranchRun"
    framing = ["run.forked"]
    acts = 0  # the effect is served from the record, never acted again

    async def drive(self, run_id: str) -> Drive:
        return await branch_in_process(self.client, run_id, fork_step=2)


class RemoteRunContract(RunContract):
    """``RemoteRun``: the same re-drive with the agent in the guest, across the broker's channel."""

    client: LedgerClient
    implementation = "RemoteRun"
    framing = ["run.forked"]
    acts = 0

    async def drive(self, run_id: str) -> Drive:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="rl-guest-") as directory:  # short: a socket path is limited
            return await remote(self.client, run_id, 2, InProcessPool(directory))
