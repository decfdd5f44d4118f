"""``runledger export otlp`` against a real OTLP/HTTP receiver in the test process.

The receiver is an ``http.server`` on loopback that decodes each ``ExportTraceServiceRequest``
with opentelemetry-proto, as a collector would. Runs are recorded on a real nats-server by the
example refund agent (one with a secret planted in a tool's input, which the redactor replaces),
a branch forked from one of them and an agent whose model turn asks for two tool calls run in
parallel. The checks: one trace per run, span names and parentage, the GenAI attributes and
token counts equal to the recorded ones, effects and approvals, ids equal on a second export,
the branch's link to its parent, overlapping parallel steps, and no secret in any attribute.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from runledger import AgentSpec, ModelResponse, Run, ScriptedModel
from runledger.cli.app import main
from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.integrations.otel import export_runs, follow_runs, otlp_exporter, span_id_of, trace_id_of
from runledger.log.client import LedgerClient
from runledger.log.server import ServerState
from runledger.ops.decisions import approve
from runledger.protect.loading import load_run
from runledger.record.events import RunForked
from runledger.sdk.lifecycle import start_run
from tests.conftest import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SECRET = "sk-proj-Q9x8W7v6U5t4S3r2Q1p0OnMlKjIhGfEd"
PLANTED = {"ticket": "T-6001", "order": f"order-8891 {SECRET}", "text": "Broken blender, refund it."}


# -- the receiver ----------------------------------------------------------------------------------------


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint on loopback: keeps every request it decoded, and its raw bytes."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver.lock:
                    receiver.requests.append(request)
                    receiver.bodies.append(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """(resource attributes, span) of everything received, in arrival order."""
        out = []
        with self.lock:
            for request in self.requests:
                for rs in request.resource_spans:
                    resource = attributes(rs.resource.attributes)
                    out.extend((resource, span) for ss in rs.scope_spans for span in ss.spans)
        return out

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()
            self.bodies.clear()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    r.thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


def named(spans: list[Span], name: str) -> Span:
    return next(s for s in spans if s.name == name)


def by_trace(received: list[tuple[dict[str, Any], Span]], run_id: str) -> list[Span]:
    trace_id = trace_id_of(run_id).to_bytes(16, "big")
    return [span for _, span in received if span.trace_id == trace_id]


# -- the recorded runs -----------------------------------------------------------------------------------


async def lookup(args: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0.3)  # long enough that the two calls visibly overlap
    return {"id": args["id"], "found": True}


def parallel_spec() -> AgentSpec:
    turn = ModelResponse(
        content="",
        tool_calls=[
            {"id": "call_A1", "type": "function", "function": {"name": "lookup", "arguments": '{"id": 1}'}},
            {"id": "call_B2", "type": "function", "function": {"name": "lookup", "arguments": '{"id": 2}'}},
        ],
        finish_reason="tool_calls",
        input_tokens=31,
        output_tokens=17,
    )

    async def agent(run: Run) -> list[Any]:
        reply = await run.model([{"role": "user", "content": "look up orders 1 and 2"}])
        calls = [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.tool_calls]
        return list(await asyncio.gather(*(run.tool(name, args, fn=lookup) for _, name, args in calls)))

    return AgentSpec("parallel-agent", agent, ScriptedModel([turn], name="scripted-tools-1"), agent_version="p1")


async def record(client: LedgerClient, tmp_path: Path) -> dict[str, str]:
    """ticket (or a name) -> run id of every run the tests export."""
    runs: dict[str, str] = {}
    payments = PaymentsService(tmp_path / "payments.log").start()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("REFUND_PAYMENTS_URL", payments.url)
        env.setenv("REFUND_OUTBOX", str(tmp_path / "outbox"))
        try:
            agent = spec()
            tickets = [t for t in TICKETS if t["ticket"] in ("T-1001", "T-1002", "T-1004")] + [PLANTED]
            for ticket in tickets:
                result = await start_run(client, agent, ticket)
                runs[ticket["ticket"]] = result.run_id
                if result.status == "suspended":  # T-1004 waits for an approval of the 950.00 refund
                    # Approved, not resumed: an operator's decision recorded on a suspended run.
                    await approve(client, result.run_id, result.pending[0], by="ana", reason="photos checked")
        finally:
            payments.stop()

    async def echo(run: Run) -> str:
        await run.model([{"role": "user", "content": "again"}])
        return "ok"

    fork = RunForked(forked_from=runs["T-1001"], fork_step=2, mode="redrive", changed="model", changed_to="m-2")
    branch = AgentSpec("refund-agent", echo, ScriptedModel(["ok"], name="m-2"), agent_version="branch")
    runs["branch"] = (await start_run(client, branch, {"ticket": "T-1001"}, fork=fork)).run_id
    runs["parallel"] = (await start_run(client, parallel_spec(), {})).run_id

    async def delegate(run: Run) -> Any:
        return await run.child(parallel_spec(), {})

    runs["parent"] = (
        await start_run(client, AgentSpec("lead-agent", delegate, ScriptedModel([]), agent_version="l1"))
    ).run_id
    runs["child"] = f"{runs['parent']}-c0"
    return runs


@pytest.fixture
async def recorded(client: LedgerClient, tmp_path: Path) -> dict[str, str]:
    return await record(client, tmp_path)


# -- the tests -------------------------------------------------------------------------------------------


async def test_each_run_is_one_trace_a_root_span_and_a_span_per_step(
    client: LedgerClient, recorded: dict[str, str], receiver: OtlpReceiver
) -> None:
    result = await export_runs(client, recorded.values(), otlp_exporter(receiver.url))
    assert result.runs == list(recorded.values())
    received = receiver.spans()
    assert len(received) == result.spans
    assert len({span.trace_id for _, span in received}) == len(recorded)
    for name, run_id in recorded.items():
        spans = by_trace(received, run_id)
        log = await load_run(client, run_id)
        steps = sorted({ev.step for ev in log.events if ev.step is not None})
        roots = [s for s in spans if not s.parent_span_id]
        assert len(roots) == 1, name
        root = roots[0]
        assert root.span_id == span_id_of(run_id).to_bytes(8, "big")
        assert len(spans) == 1 + len(steps), name
        children = {attributes(s.attributes)["runledger.step"]: s for s in spans if s is not root}
        assert sorted(children) == steps
        for step, span in children.items():
            assert span.parent_span_id == root.span_id
            assert span.span_id == span_id_of(run_id, step).to_bytes(8, "big")
            assert root.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano
            assert span.end_time_unix_nano <= root.end_time_unix_nano
        root_attrs = attributes(root.attributes)
        assert root_attrs["gen_ai.operation.name"] == "invoke_agent"
        assert root_attrs["runledger.run.id"] == run_id
        assert dict(receiver.spans()[0][0])["service.name"]  # every resource names its service

    refund = by_trace(received, recorded["T-1001"])
    names = [s.name for s in sorted(refund, key=lambda s: attributes(s.attributes).get("runledger.step", -1))]
    assert names == [
        "invoke_agent refund-agent",
        "chat scripted-support-1",
        "execute_tool lookup_order",
        "chat scripted-support-1",
        "execute_tool refund",
        "execute_tool send_email",
    ]
    root = next(s for s in refund if not s.parent_span_id)
    assert root.status.code == root.status.STATUS_CODE_OK
    assert attributes(root.attributes)["runledger.run.status"] == "completed"
    spans = {s.name: attributes(s.attributes) for s in refund}
    assert (
        spans["execute_tool refund"].items()
        >= {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "refund",
            "runledger.effect.key": "refund:order-8891",
            "runledger.effect.state": "committed",
            "runledger.effect.class": "irreversible",
        }.items()
    )
    assert spans["execute_tool send_email"]["runledger.effect.key"] == "email:T-1001"

    waiting = by_trace(received, recorded["T-1004"])
    root = next(s for s in waiting if not s.parent_span_id)
    assert attributes(root.attributes)["runledger.run.status"] == "suspended"
    assert root.status.code == root.status.STATUS_CODE_UNSET
    assert any(e.name == "run.suspended" for e in root.events)
    approval = attributes(next(s for s in waiting if s.name == "approval refund").attributes)
    assert approval["runledger.approval.state"] == "approved"
    assert approval["runledger.approval.by"] == "ana"
    assert approval["runledger.approval.request_id"]

    failed = by_trace(received, recorded["T-6001"])
    root = next(s for s in failed if not s.parent_span_id)
    assert root.status.code == root.status.STATUS_CODE_ERROR
    tool = next(s for s in failed if s.name == "execute_tool lookup_order")
    assert tool.status.code == tool.status.STATUS_CODE_ERROR
    assert attributes(tool.attributes)["error.type"]


async def test_genai_attributes_and_token_counts_are_the_recorded_ones(
    client: LedgerClient, recorded: dict[str, str], receiver: OtlpReceiver
) -> None:
    await export_runs(client, recorded.values(), otlp_exporter(receiver.url))
    received = receiver.spans()
    for run_id in recorded.values():
        log = await load_run(client, run_id)
        spans = by_trace(received, run_id)
        recorded_tokens = {"input": 0, "output": 0}
        for ev in log.events:
            if ev.type != "model.called":
                continue
            span = next(s for s in spans if attributes(s.attributes).get("runledger.step") == ev.step)
            attrs = attributes(span.attributes)
            assert span.name == f"chat {ev.payload['model']}"
            assert span.kind == Span.SPAN_KIND_CLIENT
            assert attrs["gen_ai.operation.name"] == "chat"
            assert attrs["gen_ai.request.model"] == ev.payload["model"]
            assert attrs["gen_ai.usage.input_tokens"] == ev.payload["usage"]["input_tokens"]
            assert attrs["gen_ai.usage.output_tokens"] == ev.payload["usage"]["output_tokens"]
            recorded_tokens["input"] += ev.payload["usage"]["input_tokens"]
            recorded_tokens["output"] += ev.payload["usage"]["output_tokens"]
        root = attributes(next(s for s in spans if not s.parent_span_id).attributes)
        assert (root["gen_ai.usage.input_tokens"], root["gen_ai.usage.output_tokens"]) == (
            recorded_tokens["input"],
            recorded_tokens["output"],
        )
        assert recorded_tokens["input"] > 0 or run_id == recorded["parent"]  # it only starts a child run

    # Parallel tool calls: each is its model turn's call (by id), and the two overlap in time as they ran.
    spans = by_trace(received, recorded["parallel"])
    tools = [s for s in spans if s.name == "execute_tool lookup"]
    tools.sort(key=lambda s: attributes(s.attributes)["runledger.step"])
    assert [attributes(s.attributes)["gen_ai.tool.call.id"] for s in tools] == ["call_A1", "call_B2"]
    assert all(attributes(s.attributes)["gen_ai.tool.name"] == "lookup" for s in tools)
    a, b = tools
    assert a.start_time_unix_nano < b.end_time_unix_nano and b.start_time_unix_nano < a.end_time_unix_nano
    for span in tools:
        assert span.end_time_unix_nano - span.start_time_unix_nano >= 250_000_000  # the recorded duration
    chat = attributes(next(s for s in spans if s.name == "chat scripted-tools-1").attributes)
    assert chat["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert (chat["gen_ai.usage.input_tokens"], chat["gen_ai.usage.output_tokens"]) == (31, 17)


async def test_exporting_twice_sends_the_same_ids_and_a_branch_links_to_its_parent(
    client: LedgerClient, recorded: dict[str, str], receiver: OtlpReceiver
) -> None:
    exporter = otlp_exporter(receiver.url)
    await export_runs(client, recorded.values(), exporter)
    first = [(s.trace_id, s.span_id, s.parent_span_id, s.name, s.start_time_unix_nano) for _, s in receiver.spans()]
    receiver.clear()
    await export_runs(client, recorded.values(), exporter)
    second = [(s.trace_id, s.span_id, s.parent_span_id, s.name, s.start_time_unix_nano) for _, s in receiver.spans()]
    assert first == second
    assert len({(t, s) for t, s, *_ in first}) == len(first)  # no two spans share an id

    branch = by_trace(receiver.spans(), recorded["branch"])
    root = next(s for s in branch if not s.parent_span_id)
    assert len(root.links) == 1
    link = root.links[0]
    assert link.trace_id == trace_id_of(recorded["T-1001"]).to_bytes(16, "big")
    assert link.span_id == span_id_of(recorded["T-1001"]).to_bytes(8, "big")
    assert attributes(link.attributes) == {
        "runledger.link": "forked_from", "runledger.fork.step": 2, "runledger.fork.mode": "redrive",
        "runledger.fork.changed": "model",
    }  # fmt: skip
    parent_roots = [s for s in by_trace(receiver.spans(), recorded["T-1001"]) if not s.parent_span_id]
    assert [s.span_id for s in parent_roots] == [link.span_id]  # the link points at a span that was exported

    # A child run (run.child): the parent's step links to the child's trace, and back.
    step = named(by_trace(receiver.spans(), recorded["parent"]), "invoke_agent parallel-agent")
    child_root = next(s for s in by_trace(receiver.spans(), recorded["child"]) if not s.parent_span_id)
    assert [(x.trace_id, x.span_id) for x in step.links] == [(child_root.trace_id, child_root.span_id)]
    assert [(x.trace_id, x.span_id) for x in child_root.links] == [(step.trace_id, step.span_id)]
    assert attributes(step.attributes)["runledger.child.run_id"] == recorded["child"]


async def test_no_secret_reaches_any_attribute_and_content_is_opt_in(
    client: LedgerClient, recorded: dict[str, str], receiver: OtlpReceiver
) -> None:
    planted = recorded["T-6001"]
    await export_runs(client, recorded.values(), otlp_exporter(receiver.url))
    for _, span in receiver.spans():  # by default: structure only
        assert not {"gen_ai.tool.call.arguments", "gen_ai.input.messages"} & set(attributes(span.attributes))
    receiver.clear()

    await export_runs(client, recorded.values(), otlp_exporter(receiver.url), content=True)
    for body in receiver.bodies:
        assert SECRET.encode() not in body
    texts = []
    for _, span in receiver.spans():
        attrs = attributes(span.attributes)
        texts += [json.dumps(attrs), span.status.message]
        texts += [json.dumps(attributes(e.attributes)) for e in span.events]
        texts += [json.dumps(attributes(link.attributes)) for link in span.links]
    assert not [t for t in texts if SECRET in t]
    tool = attributes(named(by_trace(receiver.spans(), planted), "execute_tool lookup_order").attributes)
    arguments = json.loads(tool["gen_ai.tool.call.arguments"])
    assert arguments["order"].startswith("order-8891 «redacted:openai_key:"), arguments  # exported, redacted
    chat = attributes(named(by_trace(receiver.spans(), recorded["T-1001"]), "chat scripted-support-1").attributes)
    messages = json.loads(chat["gen_ai.input.messages"])
    assert messages[0]["role"] == "system" and messages[0]["parts"][0]["type"] == "text"
    assert json.loads(chat["gen_ai.output.messages"])[0]["role"] == "assistant"


async def test_the_cli_exports_runs_by_id_and_by_where(
    nats_server: ServerState, client: LedgerClient, recorded: dict[str, str], receiver: OtlpReceiver,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    common = ["--nats", nats_server.url, "--endpoint", receiver.url]
    assert await asyncio.to_thread(main, ["export", "otlp", *common, recorded["T-1001"], recorded["branch"]]) == 0
    out = capsys.readouterr().out
    assert f"{recorded['T-1001']}  trace {trace_id_of(recorded['T-1001']):032x}" in out
    assert {s.trace_id for _, s in receiver.spans()} == {
        trace_id_of(recorded[n]).to_bytes(16, "big") for n in ("T-1001", "branch")
    }
    receiver.clear()

    db = ["--db", str(tmp_path / "ledger.duckdb")]
    argv = ["export", "otlp", *common, *db, "--where", "agent = 'parallel-agent' AND child_of_run_id IS NULL"]
    assert await asyncio.to_thread(main, argv) == 0
    assert {s.trace_id for _, s in receiver.spans()} == {trace_id_of(recorded["parallel"]).to_bytes(16, "big")}

    # Parquet export is still `export --parquet`, and `export` alone says what it needs.
    parquet = ["export", "--nats", nats_server.url, *db, "--parquet", str(tmp_path / "pq")]
    assert await asyncio.to_thread(main, parquet) == 0
    assert (tmp_path / "pq" / "runs").exists()
    assert (
        await asyncio.to_thread(main, ["export", "--nats", nats_server.url, *db]) == 4
    )  # Exit.ERROR: the command cannot do its work as asked
    assert "--parquet DIR" in capsys.readouterr().err


async def test_follow_exports_runs_as_they_settle(client: LedgerClient, receiver: OtlpReceiver) -> None:
    stop = asyncio.Event()
    ready = asyncio.Event()
    following = asyncio.create_task(follow_runs(client, otlp_exporter(receiver.url), stop, ready=ready.set))
    await asyncio.wait_for(ready.wait(), timeout=30)
    run_id = (await start_run(client, parallel_spec(), {})).run_id
    trace_id = trace_id_of(run_id).to_bytes(16, "big")
    await eventually(lambda: any(s.trace_id == trace_id for _, s in receiver.spans()), timeout=30)
    stop.set()
    result = await asyncio.wait_for(following, timeout=30)
    assert result.runs == [run_id]
