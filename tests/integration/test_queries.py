"""Every query of docs/queries.md, run on a known ledger, returns the expected rows."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb
import pytest

from runledger.log.client import LedgerClient
from runledger.log.reader import decode_records, read_raw
from runledger.log.subjects import run_subject
from runledger.projections.content import content_session
from runledger.projections.projector import project
from runledger.projections.queries import run_sql
from runledger.projections.store import ProjectionStore
from runledger.protect.capture import client_opener
from runledger.protect.loading import load_run
from runledger.record.failures import failure_signature
from runledger.record.fold import fold
from tests.integration.test_projector import build_ledger, runledger

pytestmark = pytest.mark.integration
DOC = Path(__file__).resolve().parents[2] / "docs" / "queries.md"
PRICES = {"scripted-support-1": (3.0, 15.0), "fixed-40": (1.0, 2.0), "m-2": (0.5, 1.5)}


def doc_queries() -> dict[str, str]:
    """``Q<n>`` -> the first sql block under its heading."""
    text = DOC.read_text()
    out = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        number = section.split(".", 1)[0]
        found = re.search(r"```sql\n(.*?)```", section, flags=re.S)
        assert found, f"{number} has no sql block"
        out[number] = found.group(1)
    return out


def columns(result: Any, *names: str) -> list[tuple[Any, ...]]:
    index = [result.columns.index(n) for n in names]
    return [tuple(row[i] for i in index) for row in result.rows]


async def model_steps(client: LedgerClient) -> list[tuple[str, str, int, int, int, str]]:
    """(agent, model, tokens, input, output, run_id) of every model step, from the fold itself."""
    good, _ = decode_records(await read_raw(client, "ledger.run.>"))
    by_run: dict[str, list[Any]] = defaultdict(list)
    for rec in good:
        by_run[rec.subject.split(".")[3]].append(rec)
    out = []
    for run_id, records in by_run.items():
        cp = fold(records)
        for step in cp.steps.values():
            if step.kind == "model":
                usage = step.output["usage"]
                out.append((cp.agent, step.name, step.tokens, usage["input_tokens"], usage["output_tokens"], run_id))
    return out


async def refunds_over_100(client: LedgerClient) -> list[tuple[str, str, float]]:
    """(run_id, key, amount) of every refund over 100, from the log with content opened, as Q12 orders them."""
    good, _ = decode_records(await read_raw(client, "ledger.run.>"))
    opener = client_opener(client)
    found = {}
    for rec in good:
        event = rec.event
        if event.type == "effect.intended" and event.payload["name"] == "refund":
            args = (await opener.open_event(event)).payload["args"]
            if float(args["amount"]) > 100:
                found.setdefault(
                    (event.run_id, event.payload["step"]), (event.run_id, event.payload["key"], float(args["amount"]))
                )
    return sorted(found.values(), key=lambda r: (-r[2], r[0]))


async def test_every_documented_query_returns_the_expected_rows(client: LedgerClient, tmp_path: Path) -> None:
    runs = await build_ledger(client, tmp_path, load_events=0)
    garbage = await client.js.publish(run_subject("refund-agent", "junk"), b"this is not an event")
    db = tmp_path / "ledger.duckdb"
    await project(client, db)
    con = duckdb.connect(str(db))
    con.executemany("INSERT INTO model_prices VALUES (?, ?, ?)", [[m, *p] for m, p in PRICES.items()])
    con.close()
    queries = doc_queries()
    assert sorted(queries, key=lambda q: int(q[1:])) == [f"Q{i}" for i in range(1, 14)]
    steps = await model_steps(client)
    with ProjectionStore(db, writer=False) as store:
        result = {number: run_sql(store.con, sql) for number, sql in queries.items()}

    assert result["Q1"].rows == [("rogue-1", "refund:order-rogue", 700.0)]

    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for agent, model, tokens, tokens_in, tokens_out, _ in steps:
        t = totals[(agent, model)]
        t[0], t[1], t[2], t[3] = t[0] + 1, t[1] + tokens_in, t[2] + tokens_out, t[3] + tokens
    expected = sorted(((a, m, *t) for (a, m), t in totals.items()), key=lambda r: (-r[5], r[0], r[1]))
    assert result["Q2"].rows == expected and len(expected) == 3

    assert columns(result["Q3"], "run_id", "failure_reason", "first_bad_step", "first_bad_kind", "first_bad_name",
                   "first_bad_status") == [
        (runs["T-1003"], "exception", 1, "tool", "lookup_order", "error"),
        (runs["T-3004"], "approval_denied", 3, "approval", "refund", "denied"),
        (runs["spender"], "budget_exhausted", None, None, None, None),
    ]  # fmt: skip

    assert result["Q4"].rows == [("refund:order-doubt", "doubt-1", 0, "refund")]
    assert columns(result["Q5"], "run_id", "action") == [(runs["T-2004"], "refund")]
    assert columns(result["Q6"], "name", "calls") == [("lookup_order", 6)]

    costs = defaultdict(float)
    for _agent, model, _tokens, tokens_in, tokens_out, run_id in steps:
        price_in, price_out = PRICES[model]
        costs[run_id] += (tokens_in * price_in + tokens_out * price_out) / 1e6
    top = sorted(costs.items(), key=lambda kv: (-round(kv[1], 6), kv[0]))[:10]
    assert [(r, pytest.approx(c, abs=1e-6)) for r, c in top] == columns(result["Q7"], "run_id", "cost_usd")

    assert result["Q8"].rows == [(runs["branch"], runs["T-1001"], 2, "redrive", "model", "completed", "completed")]
    assert columns(result["Q9"], "error", "messages", "first_seq") == [("EventDecodeError", 1, garbage.seq)]
    assert result["Q10"].rows == [(runs["spender"], "spender", 3, 120, 100, 20)]
    assert columns(result["Q11"], "agent", "status", "runs") == [
        ("backoffice", "completed", 1),
        ("backoffice", "running", 1),
        ("refund-agent", "completed", 5),
        ("refund-agent", "failed", 2),
        ("refund-agent", "suspended", 1),
        ("spender", "failed", 1),
    ]  # the garbage's subject has no valid event: no run

    # Q12 asks about content: sealed, only the unsealed run answers; opened (--content), every refund over 100.
    assert result["Q12"].rows == [("rogue-1", "refund:order-rogue", 700.0)]
    with ProjectionStore(db, writer=False) as store:
        opened = await content_session(client, store.con, lambda con: run_sql(con, queries["Q12"]))
    assert opened.rows == await refunds_over_100(client) and len(opened.rows) > 1

    # Q13: one class a failed run here (each failed its own way), as the signature of its record says.
    signatures = []
    for name in ("T-1003", "T-3004", "spender"):
        sig = failure_signature(fold((await load_run(client, runs[name])).records))
        assert sig is not None
        signatures.append((sig.class_id, sig.error_type, sig.step_kind or None, sig.step_name or None, 1))
    assert sorted(columns(result["Q13"], "class_id", "error_type", "step_kind", "step_name", "runs")) == sorted(
        signatures
    )
    assert [r[1:5] for r in sorted(signatures, key=lambda r: r[1])] == [
        ("ApprovalDeniedError", "approval", "refund", 1),
        ("BudgetExhaustedError", "model", "fixed-40", 1),
        ("ToolFailedError", "tool", "lookup_order", 1),
    ]

    # The same through the command, as an analyst runs it.
    cli = runledger(client.url, "sql", queries["Q4"], "--db", str(db), "--format", "json")
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout) == [{"key": "refund:order-doubt", "run_id": "doubt-1", "step": 0, "name": "refund"}]
