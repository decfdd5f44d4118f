"""An agent that pays an order once, at a payments service that IGNORES idempotency keys, and whose
effect function checks its claim right before the call (tests/integration/test_frozen_holder_check.py
and tests/integration/test_fencing_helper.py drive it in a process of its own, as
``tests.integration.frozen_payer:spec``).

The effect function sends no ``Idempotency-Key``, so the example's payments service pays every call:
only the ledger and the function's own check stand between a woken holder and a second payment.
Configured by the environment, read at each call (the holder's process and the resuming test
process set it differently):

- ``FROZEN_PAYMENTS_URL``: the payments service (runledger.examples.refund_agent.payments);
- ``FROZEN_CHECK``: ``clock`` (``ctx.check()``), ``ledger`` (``await ctx.acheck(ledger=True)``),
  ``none`` (the old behaviour: no check), or ``token`` (``ctx.check()``, then the call sends the
  attempt's key and fencing token, ``ctx.fencing_headers()``, for a service that keeps the highest
  token per key);
- ``FROZEN_MARKERS``: a directory where the function marks ``entered`` when it starts,
  ``checking`` right before its check (the test freezes it between the two), ``checked`` after a
  ``token`` check, and ``refused-<error type>`` when the check or the service refused;
- ``FROZEN_PREP_S``: seconds of work (blocking, as a real function's) between the two;
- ``FROZEN_GO``: after a ``token`` check, the function holds until this file exists (the test
  freezes it there: after its check, before its call).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from runledger import NOT_FOUND, AgentSpec, EffectContext, Run, ScriptedModel, StaleClaimError, StaleFencingTokenError


def _mark(name: str) -> None:
    markers = os.environ.get("FROZEN_MARKERS")
    if markers:
        Path(markers, name).touch()


def _post(args: dict[str, Any], fencing: dict[str, str] | None = None) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{os.environ['FROZEN_PAYMENTS_URL']}/refunds",
        data=json.dumps({"order": args["order"], "amount": args["amount"]}).encode(),
        # Without fencing headers no Idempotency-Key: the service pays every call. With them the key
        # goes too, and the service (honour_keys=False) still ignores it: only the token counts.
        headers={"Content-Type": "application/json", **(fencing or {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            paid: dict[str, Any] = json.loads(resp.read())
            return paid
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise
        refused = json.loads(exc.read())
        _mark("refused-StaleFencingTokenError")
        raise StaleFencingTokenError(refused["key"], refused["token"], refused["highest"]) from None


def _hold() -> None:
    """Hold until the test's go file exists (it freezes this process meanwhile)."""
    go = os.environ.get("FROZEN_GO")
    while go and not Path(go).exists():
        time.sleep(0.005)


async def pay(args: dict[str, Any], ctx: EffectContext) -> dict[str, Any]:
    _mark("entered")
    deadline = time.monotonic() + float(os.environ.get("FROZEN_PREP_S", "0"))
    while time.monotonic() < deadline:  # the function's own work before its call
        time.sleep(0.005)
    _mark("checking")
    check = os.environ.get("FROZEN_CHECK", "clock")
    try:
        if check in ("clock", "token"):
            ctx.check()
        elif check == "ledger":
            await ctx.acheck(ledger=True)
    except StaleClaimError as exc:
        _mark(f"refused-{type(exc).__name__}")
        raise
    if check == "token":
        _mark("checked")
        _hold()
        return _post(args, ctx.fencing_headers())
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
