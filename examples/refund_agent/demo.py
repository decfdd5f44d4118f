"""``runledger demo``: the refund agent over a handful of tickets, then the trace."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import connect
from runledger.ops.decisions import approve
from runledger.ops.trace import list_runs, render_run
from runledger.ops.verify import verify_runs
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.lifecycle import resume_run, start_run


async def main(url: str, show: Callable[[str], None] = print) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="runledger-demo-"))
    payments = PaymentsService(workdir / "payments.log").start()
    os.environ["REFUND_PAYMENTS_URL"] = payments.url
    os.environ["REFUND_OUTBOX"] = str(workdir / "outbox")
    client = await connect(url)
    try:
        agent = spec()
        show(f"runledger demo: refund agent on {len(TICKETS)} tickets (ledger at {url}, files in {workdir})\n")
        run_ids = []
        for ticket in TICKETS:
            result = await start_run(client, agent, ticket, labels={"ticket": ticket["ticket"]})
            run_ids.append(result.run_id)
            show(
                f"  {ticket['ticket']}: run {result.run_id} {result.status}"
                + (f" ({result.reason})" if result.reason else "")
            )
            if result.status == "suspended" and result.pending:
                request = result.pending[0]
                await approve(client, result.run_id, request, by="demo-operator", reason="checked the photos")
                resumed = await resume_run(client, agent, result.run_id)
                show(f"      approved {request} as demo-operator, resumed: {resumed.status}")
        show(
            f"\npayments service received {len(payments.calls())} refund calls "
            f"for {len({c['order'] for c in payments.calls()})} orders\n"
        )
        show("$ runledger runs")
        for r in await list_runs(client):
            if r.run_id in run_ids:
                show(f"  {r.run_id}  {r.status:<10} steps {r.steps:>2}  tokens {r.tokens:>4}  {r.error or ''}")
        show(f"\n$ runledger show {run_ids[0]}")
        log = await load_run(client, run_ids[0])
        show(render_run(log, fold(log.records)))
        results = [v for v in await verify_runs(client) if v.run_id in run_ids]
        show(f"\n$ runledger verify: {sum(v.ok for v in results)} of {len(results)} demo runs verified")
        return 0 if all(v.ok for v in results) else 1
    finally:
        await client.close()
        payments.stop()
