"""Every JetStream API call a role could send, with each role's own credentials from ``up --secure``.

The attacks of the third trust round, as the attacker acts: the analyst deletes another reader's
durable consumer on LEDGER; any role that reads blobs creates a push consumer on OBJ_LEDGER_BLOBS
delivering to another agent's operator subject, where a plain subscriber listens. Both refused by
the server now, and the witness (the admin) finds the consumer still there, nothing created,
nothing delivered. Then every call of tests/jetstream_api.py (every row of docs/data-protection.md's
table, for every stream and scope) is sent raw on a socket logged in as each role: the server lets
through exactly what ``runledger.protect.roles`` allows (its violation, ``-ERR 'Permissions
Violation ...'``, arrives before the PONG of a PING sent after the call, so a refusal is told from
an answer without waiting for a timeout). And the project's own readers work under these
permissions without a single violation in the server's log.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import nats
import pytest

from runledger import AgentSpec, Run, ScriptedModel
from runledger.log.client import LedgerClient, connect
from runledger.log.credentials import RoleCredentials
from runledger.log.reader import follow_events, read_raw
from runledger.log.server import ServerState
from runledger.log.subjects import (
    BLOB_BUCKET,
    CMD_STREAM,
    LEDGER_STREAM,
    RERUN_CONSUMER,
    RERUN_SUBJECT,
    run_subject,
)
from runledger.ops.verify import verify_runs
from runledger.projections.projector import project
from runledger.protect.blobs import BlobStore
from runledger.protect.capture import DataPolicy
from runledger.protect.loading import load_run
from runledger.record.events import Event
from runledger.sdk.lifecycle import start_run
from tests.conftest import eventually
from tests.jetstream_api import AGENT, Call, calls, permitted

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BLOB_STREAM = f"OBJ_{BLOB_BUCKET}"
VICTIM = f"ledger.run.{AGENT}.X.o"  # the finding's subject: an operator's decision on the agent's run
ROLE_USERS = {"agent": f"agent-{AGENT}", "analyst": "analyst", "operator": "operator", "worker": "worker"}


def creds(state: ServerState, user: str) -> str:
    return str(Path(state.creds_dir) / f"{user}.json")


async def login(state: ServerState, user: str) -> LedgerClient:
    return await connect(state.url, user_credentials=creds(state, user))


@pytest.fixture
async def admin(secure_server: ServerState) -> AsyncIterator[LedgerClient]:
    c = await login(secure_server, "admin")  # creates the streams and the work queue's consumer
    try:
        yield c
    finally:
        await c.close()


class RawLogin:
    """A socket logged in as one user, speaking the protocol: each call, then a PING; a violation of
    a call arrives before that PING's PONG. Answers to the calls are kept by subject."""

    def __init__(self, state: ServerState, user: str) -> None:
        self.creds = RoleCredentials.read(creds(state, user))
        self.url = urlparse(state.url)
        self.inbox = f"{self.creds.inbox_prefix}.probe"
        self.violations: list[str] = []
        self.answers: dict[str, bytes] = {}
        self._asked: dict[str, str] = {}  # reply subject: the call's subject

    async def __aenter__(self) -> RawLogin:
        self.reader, self.writer = await asyncio.open_connection(self.url.hostname, self.url.port)
        await self.reader.readline()  # INFO
        connect = {"user": self.creds.user, "pass": self.creds.password, "headers": True, "verbose": False,
                   "pedantic": False, "protocol": 1, "no_responders": True}  # fmt: skip
        self.writer.write(f"CONNECT {json.dumps(connect)}\r\nSUB {self.inbox}.* 1\r\n".encode())
        await self.round_trip()
        assert not self.violations, self.violations
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()

    async def round_trip(self) -> None:
        """PING, and read everything up to its PONG."""
        self.writer.write(b"PING\r\n")
        await self.writer.drain()
        while await self._item() != "PONG":
            pass

    async def _item(self) -> str:
        line = (await asyncio.wait_for(self.reader.readline(), 10)).decode()
        if line.startswith(("MSG ", "HMSG ")):
            parts = line.split()
            data = await self.reader.readexactly(int(parts[-1]) + 2)
            if parts[1] in self._asked:
                self.answers[self._asked[parts[1]]] = data[:-2]
        elif line.startswith("-ERR"):
            self.violations.append(line.strip())
        elif line.startswith("PING"):
            self.writer.write(b"PONG\r\n")
        return line.strip()

    async def call(self, subject: str, payload: bytes) -> bool:
        """Send one call; True when the server refused it (a permissions violation on its subject)."""
        reply = f"{self.inbox}.{len(self._asked)}"
        self._asked[reply] = subject
        before = len(self.violations)
        self.writer.write(f"PUB {subject} {reply} {len(payload)}\r\n".encode() + payload + b"\r\n")
        await self.round_trip()
        refused = [v for v in self.violations[before:] if "permissions violation" in v.lower()]
        assert all(f'"{subject.lower()}"' in v.lower() for v in refused), (subject, refused)
        return bool(refused)

    async def settle(self) -> None:
        """Read the answers that came after their PONG (the JetStream API answers on its own time)."""
        with_answers = 0
        for _ in range(20):
            await self.round_trip()
            if len(self.answers) == with_answers:
                break
            with_answers = len(self.answers)
            await asyncio.sleep(0.05)


def _error(answer: bytes | None) -> str:
    """The JetStream API's error in an answer ("" when it answered without one)."""
    body = json.loads(answer or b"{}")
    return str((body.get("error") or {}).get("description", "")) if isinstance(body, dict) else ""


async def test_an_analyst_cannot_delete_another_readers_durable_consumer(
    admin: LedgerClient, secure_server: ServerState
) -> None:
    """The finding: the analyst deleted another reader's durable consumer on LEDGER ({"success":true}).
    Every role but the admin is refused, and the consumer is still there."""
    await admin.js.add_consumer(LEDGER_STREAM, durable_name="dashboard", filter_subject="ledger.run.>")
    for user in ROLE_USERS.values():
        async with RawLogin(secure_server, user) as raw:
            assert await raw.call(f"$JS.API.CONSUMER.DELETE.{LEDGER_STREAM}.dashboard", b""), user
            assert await raw.call(f"$JS.API.CONSUMER.DELETE.{CMD_STREAM}.{RERUN_CONSUMER}", b""), user
            await raw.settle()
            assert raw.answers == {}, (user, raw.answers)
    assert (await admin.js.consumer_info(LEDGER_STREAM, "dashboard")).name == "dashboard"
    assert (await admin.js.consumer_info(CMD_STREAM, RERUN_CONSUMER)).config.deliver_subject is None


async def test_no_role_pushes_blobs_onto_a_subject_of_its_choice(
    admin: LedgerClient, secure_server: ServerState
) -> None:
    """The finding: a role that reads blobs created a push consumer on OBJ_LEDGER_BLOBS delivering to
    ``ledger.run.alice.X.o``, and a plain subscriber there received an "approval" for alice. Now every
    such create is refused (named with a filter, named, unnamed, durable), nothing is created, and
    the subscriber (the admin: no other role may listen there) receives nothing."""
    beta = await login(secure_server, "agent-beta")
    try:
        forged = json.dumps({"type": "approval.resolved", "payload": {"approved": True}}).encode()
        ref = await BlobStore(beta).put(forged)
    finally:
        await beta.close()
    chunks = f"$O.{BLOB_BUCKET}.C.>"
    heard: list[bytes] = []

    async def on_msg(msg: Any) -> None:
        heard.append(msg.data)

    listener = await admin.nc.subscribe(VICTIM, cb=on_msg)
    config = {"deliver_subject": VICTIM, "deliver_policy": "all", "ack_policy": "none", "filter_subject": chunks}
    for user in ROLE_USERS.values():
        async with RawLogin(secure_server, user) as raw:
            for subject, cfg in (
                (f"$JS.API.CONSUMER.CREATE.{BLOB_STREAM}.push.{chunks}", {**config, "name": "push"}),
                (f"$JS.API.CONSUMER.CREATE.{BLOB_STREAM}.push", {**config, "name": "push"}),
                (f"$JS.API.CONSUMER.CREATE.{BLOB_STREAM}", config),
                (f"$JS.API.CONSUMER.DURABLE.CREATE.{BLOB_STREAM}.push", {**config, "durable_name": "push"}),
            ):
                body = json.dumps({"stream_name": BLOB_STREAM, "config": cfg}).encode()
                assert await raw.call(subject, body), (user, subject)
            # The same blob by a direct get is what the roles read instead: it works.
            assert not await raw.call(f"$JS.API.DIRECT.GET.{BLOB_STREAM}", b'{"seq": 1, "batch": 8}')
    await admin.nc.flush()
    await asyncio.sleep(0.5)  # what a push consumer would deliver, it delivers at once
    await listener.unsubscribe()
    assert heard == [] and await admin.js.consumers_info(BLOB_STREAM) == []
    assert ref["sha256"] and forged not in heard


async def test_an_agents_own_push_consumer_writes_nothing_anywhere(
    admin: LedgerClient, secure_server: ServerState
) -> None:
    """What an agent's consumers can still do (docs/data-protection.md): one filtered to its own runs
    may push them to a subject it names. Into LEDGER itself the server refuses it (a delivery into
    the consumer's own stream); onto the re-run queue's subject the server delivers only where a
    subscription listens, which no role but the admin may make there: no re-run request is queued."""
    own = run_subject(AGENT, "r1")
    alpha = await login(secure_server, f"agent-{AGENT}")
    try:
        await alpha.js.publish(own, b'{"parent_run_id": "victim", "mode": "live"}')
        start = len(Path(secure_server.log).read_bytes())
        listen = await alpha.nc.subscribe(RERUN_SUBJECT)  # an agent may not listen there to make it deliver
        await logged_after(secure_server, start, "Subscription Violation", RERUN_SUBJECT)
        await listen.unsubscribe()
    finally:
        await alpha.close()
    async with RawLogin(secure_server, f"agent-{AGENT}") as raw:
        for name, deliver in (("into-ledger", "ledger.run.beta.victim.o"), ("onto-queue", RERUN_SUBJECT)):
            config = {"name": name, "deliver_subject": deliver, "filter_subject": own, "ack_policy": "none"}
            body = json.dumps({"stream_name": LEDGER_STREAM, "config": config}).encode()
            assert not await raw.call(f"$JS.API.CONSUMER.CREATE.{LEDGER_STREAM}.{name}.{own}", body)
        await raw.settle()
        answers = {s.split(".")[5]: _error(a) for s, a in raw.answers.items()}
    assert answers == {"into-ledger": "consumer deliver subject forms a cycle", "onto-queue": ""}
    await asyncio.sleep(0.5)  # what a push consumer would deliver, it delivers at once
    assert (await admin.js.stream_info(CMD_STREAM)).state.messages == 0, "a push delivery was queued as a re-run"
    info = await admin.js.stream_info(LEDGER_STREAM, subjects_filter="ledger.run.beta.>")
    assert not info.state.subjects, "a push delivery was stored on another agent's run"


async def logged_after(state: ServerState, start: int, *needles: str) -> None:
    """Wait (bounded) until the server's log, from byte ``start`` on, has a line with every needle."""

    def logged() -> bool:
        written = Path(state.log).read_bytes()[start:].decode(errors="replace")
        return any(all(n in line for n in needles) for line in written.splitlines())

    await eventually(logged, timeout=5.0)


async def test_each_role_may_send_exactly_the_api_calls_its_permissions_allow(
    admin: LedgerClient, secure_server: ServerState
) -> None:
    every = calls()
    for role, user in ROLE_USERS.items():
        async with RawLogin(secure_server, user) as raw:
            refused = {call.subject for call in every if await raw.call(call.subject, call.payload)}
            await raw.settle()
        allowed = [call for call in every if permitted(role, call.subject)]
        assert refused == {c.subject for c in every} - {c.subject for c in allowed}, user
        for call in allowed:
            if ".CONSUMER.CREATE." in call.subject:
                _push_refused_or_the_agents_own(role, call, raw.answers.get(call.subject))
    # The admin may do everything (its harmless calls answered, none refused).
    async with RawLogin(secure_server, "admin") as raw:
        for subject in ("$JS.API.INFO", "$JS.API.STREAM.NAMES", f"$JS.API.STREAM.INFO.{LEDGER_STREAM}"):
            assert not await raw.call(subject, b"")
    # What the calls left: no consumer but the work queue's (a pull consumer still) and the agent's own.
    for stream in (BLOB_STREAM, f"KV_{'LEDGER_KEYS'}"):
        assert await admin.js.consumers_info(stream) == [], stream
    [queue] = await admin.js.consumers_info(CMD_STREAM)
    assert queue.name == RERUN_CONSUMER and queue.config.deliver_subject is None
    for consumer in await admin.js.consumers_info(LEDGER_STREAM):
        assert re.fullmatch(rf"ledger\.(run|effect)\.{AGENT}\..*", consumer.config.filter_subject or ""), consumer


def _push_refused_or_the_agents_own(role: str, call: Call, answer: bytes | None) -> None:
    """Every create a role may send asks for a push consumer (tests/jetstream_api.py): the worker's,
    on the work queue's pull consumer, is refused by the server; an agent's own is made."""
    if role == "worker":
        assert "push" in _error(answer), (call.subject, answer)
    else:
        assert role == "agent" and call.scope == "own" and _error(answer) == "", (role, call.subject, answer)


async def test_the_readers_work_under_these_permissions_without_a_violation(
    admin: LedgerClient, secure_server: ServerState, tmp_path: Path
) -> None:
    """The project's own readers, each with its role: an agent loads its run (its blob too), the
    analyst verifies, follows and projects, the operator loads, the worker reads blobs and the queue."""

    async def agent(run: Run) -> Any:
        doc = await run.tool("read", {"id": 1}, fn=lambda a: "z" * 5000)  # a blob (threshold below)
        return len(doc)

    spec = AgentSpec(AGENT, agent, ScriptedModel([]), agent_version="v1", data_policy=DataPolicy(blob_threshold=1024))
    start = len(Path(secure_server.log).read_bytes())
    clients = {user: await login(secure_server, user) for user in ROLE_USERS.values()}
    try:
        alpha, analyst = clients[f"agent-{AGENT}"], clients["analyst"]
        seen: list[Event] = []
        async with follow_events(analyst, seen.append):
            assert (await start_run(alpha, spec, None, run_id="readers")).status == "completed"
            await eventually(lambda: [e.type for e in seen][-1:] == ["run.completed"])
        log = await load_run(alpha, "readers", agent=AGENT)
        ref = next(r.event.payload["output"] for r in log.records if r.event.type == "tool.called")
        assert ref["$ref"] == "blob"
        assert len(await read_raw(alpha, run_subject(AGENT, "readers"))) == len(log.records)
        assert all(r.ok for r in await verify_runs(analyst))
        assert (await project(analyst, tmp_path / "p.duckdb")).events >= len(log.records)
        assert (await load_run(clients["operator"], "readers")).records[-1].event.type == "run.completed"
        for user in ("worker", "analyst", "operator", f"agent-{AGENT}"):
            assert len(await BlobStore(clients[user]).fetch(ref)) == ref["size"]
        sub = await clients["worker"].js.pull_subscribe("ledger.cmd.rerun", durable=RERUN_CONSUMER, stream=CMD_STREAM)
        with pytest.raises(nats.errors.TimeoutError):  # an empty queue, read: not refused
            await sub.fetch(1, timeout=0.5)
    finally:
        for c in clients.values():
            await c.close()
    assert "Violation" not in Path(secure_server.log).read_bytes()[start:].decode(errors="replace")
