"""An agent that pays an order once, at a payments service that IGNORES idempotency keys, and whose
effect function checks its claim right before the call (tests/integration/test_frozen_holder_check.py
drives it in a process of its own, as ``tests.integration.frozen_payer:spec``).

The effect function sends no ``Idempotency-Key``, so the example's payments service pays every call:
only the ledger and the function's own check stand between a woken holder and a second payment.
Configured by the environment, read at each call (the holder's process and the resuming test
process set it differently):

- ``FROZEN_PAYMENTS_URL``: the payments service (runledger.examples.refund_agent.payments);
- ``FROZEN_CHECK``: ``clock`` (``ctx.check()``), ``ledger`` (``await ctx.acheck(ledger=True)``) or
  ``none`` (the old behaviour: no check);
- ``FROZEN_MARKERS``: a directory where the function marks ``entered`` when it starts,
  ``checking`` right before its check (the test freezes it between the two), and
  ``refused-<error type>`` when the check refused;
- ``FROZEN_PREP_S``: seconds of work (blocking, as a real function's) between the two.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

from runledger import NOT_FOUND, AgentSpec, EffectContext, Run, ScriptedModel, StaleClaimError


def _mark(name: str) -> None:
    markers = os.environ.get("FROZEN_MARKERS")
    if markers:
        Path(markers, name).touch()


def _post(args: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{os.environ['FROZEN_PAYMENTS_URL']}/refunds",
        data=json.dumps({"order": args["order"], "amount": args["amount"]}).encode(),
        headers={"Content-Type": "application/json"},  # no Idempotency-Key: the service pays every call
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        paid: dict[str, Any] = json.loads(resp.read())
        return paid


async def pay(args: dict[str, Any], ctx: EffectContext) -> dict[str, Any]:
    _mark("entered")
    deadline = time.monotonic() + float(os.environ.get("FROZEN_PREP_S", "0"))
    while time.monotonic() < deadline:  # the function's own work before its call
        time.sleep(0.005)
    _mark("checking")
    check = os.environ.get("FROZEN_CHECK", "clock")
    try:
        if check == "clock":
            ctx.check()
        elif check == "ledger":
            await ctx.acheck(ledger=True)
    except StaleClaimError as exc:
        _mark(f"refused-{type(exc).__name__}")
        raise
    return _post(args)


def reconcile(key: str) -> Any:
    order = key.split(":", 1)[1]
    with urllib.request.urlopen(f"{os.environ['FROZEN_PAYMENTS_URL']}/refunds?order={order}", timeout=10) as resp:
        paid = json.loads(resp.read())
    return paid[0] if paid else NOT_FOUND


async def pay_order(run: Run) -> Any:
    order = run.input["order"]
    return await run.effect(
        "pay",
        {"order": order, "amount": 10.0},
        key=f"pay:{order}",
        fn=pay,
        reconcile=reconcile,
        effect_class="irreversible",
    )


def spec() -> AgentSpec:
    return AgentSpec("frozen-payer", pay_order, ScriptedModel([]), agent_version="v1")
