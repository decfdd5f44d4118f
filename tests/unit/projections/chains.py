"""Hand-made events for the projection unit tests: hash chains built with ``make_event``."""

from __future__ import annotations

from typing import Any

from runledger.log.subjects import effect_subject, run_subject
from runledger.record.canonical import canonical_json, digest
from runledger.record.events import (
    GENESIS,
    ApprovalRequested,
    ApprovalResolved,
    Budgets,
    EffectCommitted,
    EffectIntended,
    ErrorInfo,
    Event,
    ModelCalled,
    Payload,
    RunCompleted,
    RunFailed,
    RunForked,
    RunStarted,
    RunSuspended,
    ToolCalled,
    Usage,
    VersionTuple,
    chain_hash,
    make_event,
)
from runledger.record.fold import OPERATOR_TYPES
from runledger.record.records import RawRecord

VERSION = VersionTuple(agent_version="code:t", model="m-1", prompt_hash="p0", tool_schema_hashes={"lookup": "h"})


class Stream:
    """An in-memory stream: appends records with increasing stream sequences."""

    def __init__(self) -> None:
        self.records: list[RawRecord] = []

    def put(self, subject: str, data: bytes) -> RawRecord:
        rec = RawRecord(len(self.records) + 1, subject, data)
        self.records.append(rec)
        return rec


class Chain:
    """One subject's hash chain, published into a ``Stream``."""

    def __init__(self, stream: Stream, subject: str, run_id: str, agent: str) -> None:
        self.stream, self.subject, self.run_id, self.agent = stream, subject, run_id, agent
        self.events: list[Event] = []
        self.ts_second = 0

    def add(self, body: Payload, ts: str | None = None) -> Event:
        prev = self.events[-1].hash if self.events else GENESIS
        self.ts_second += 1
        stamp = ts or f"2026-03-01T10:{self.ts_second // 60:02d}:{self.ts_second % 60:02d}.000000Z"
        event, data = make_event(body, run_id=self.run_id, agent=self.agent, seq=len(self.events), prev_hash=prev,
                                 ts=stamp)  # fmt: skip
        self.events.append(event)
        # An operator's decision travels on the run's operator subject (runledger.log.subjects).
        operator = (body.TYPE in OPERATOR_TYPES and self.subject.startswith("ledger.run.")) or (
            body.TYPE == "effect.resolved" and getattr(body, "by", "") != "reconcile"
        )
        self.stream.put(self.subject.rpartition(".")[0] + ".o" if operator else self.subject, data)
        return event


def run_chain(stream: Stream, run_id: str, agent: str = "support") -> Chain:
    return Chain(stream, run_subject(agent, run_id), run_id, agent)


def key_chain(stream: Stream, key: str, run_id: str, agent: str = "support") -> Chain:
    return Chain(stream, effect_subject(agent, key), run_id, agent)


def model(step: int, tokens_in: int = 30, tokens_out: int = 10, content: str = "ok") -> ModelCalled:
    request: dict[str, Any] = {"messages": [{"role": "user", "content": f"s{step}"}], "params": {}}
    return ModelCalled(
        step=step, model="m-1", request=request, args_digest=digest(request), response={"content": content},
        usage=Usage(input_tokens=tokens_in, output_tokens=tokens_out), duration_ms=12.5,
    )  # fmt: skip


def tool(step: int, output: Any = None, error: str | None = None) -> ToolCalled:
    info = ErrorInfo(type="LookupError", message=error) if error else None
    return ToolCalled(step=step, name="lookup", args={"q": step}, args_digest=digest({"q": step}), output=output,
                      error=info, duration_ms=3.0)  # fmt: skip


def full_run(stream: Stream, run_id: str, *, agent: str = "support", key: str | None = None) -> Chain:
    """A run with a model call, a tool call, an effect on its key subject, and completion."""
    run = run_chain(stream, run_id, agent)
    run.add(RunStarted(agent=agent, version=VERSION, budgets=Budgets(turns=5, tokens=1000), input={"t": run_id}))
    run.add(model(0))
    run.add(tool(1, output={"amount": 12}))
    key = key or f"refund:{run_id}"
    claim = EffectIntended(step=2, name="refund", key=key, args={"o": run_id}, args_digest=digest({"o": run_id}))
    run.add(claim)
    ledger_key = key_chain(stream, key, run_id, agent)
    ledger_key.add(claim)
    ledger_key.add(EffectCommitted(step=2, key=key, result={"refund_id": run_id}, duration_ms=5.0))
    run.add(EffectCommitted(step=2, key=key, result={"refund_id": run_id}, duration_ms=5.0))
    run.add(RunCompleted(output={"done": True}))
    return run


def approval_run(stream: Stream, run_id: str, *, resolve: bool, approved: bool = True) -> Chain:
    run = run_chain(stream, run_id)
    run.add(RunStarted(agent="support", version=VERSION))
    run.add(model(0))
    args = {"amount": 950}
    request = ApprovalRequested(step=1, request_id=f"q-{run_id}", action="refund", args=args,
                                digest=digest({"action": "refund", "args": args}))  # fmt: skip
    run.add(request)
    run.add(RunSuspended(step=1, request_id=request.request_id))
    if resolve:
        run.add(ApprovalResolved(request_id=request.request_id, digest=request.digest, approved=approved, by="ana"))
    return run


def failed_run(stream: Stream, run_id: str) -> Chain:
    run = run_chain(stream, run_id)
    run.add(RunStarted(agent="support", version=VERSION))
    run.add(model(0))
    run.add(tool(1, error="no such order"))
    run.add(RunFailed(reason="exception", error=ErrorInfo(type="ToolFailedError", message="no such order"), step=1))
    return run


def forked_run(stream: Stream, run_id: str, parent: str) -> Chain:
    run = run_chain(stream, run_id)
    run.add(RunStarted(agent="support", version=VERSION))
    run.add(RunForked(forked_from=parent, fork_step=1, mode="redrive", changed="model", changed_to="m-2"))
    run.add(model(0))
    return run


def raw_event(body: dict[str, Any]) -> bytes:
    """Wire bytes of an arbitrary envelope, hashed correctly (for wrong-schema poison)."""
    unhashed = {k: v for k, v in body.items() if k != "hash"}
    return canonical_json({**unhashed, "hash": chain_hash(unhashed["prev_hash"], unhashed)})
