"""Agents whose recorded runs are golden recordings (tests/fixtures/recordings), and changed versions
of them: code that makes another decision, calls with other arguments, or calls past the record.

Ordinary agent code: keyword-argument tools, calls made together (``asyncio.gather``), tool results
in no sorted order fed back into the next prompt."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from runledger import AgentSpec, Run, ScriptedModel, tool
from runledger.examples.refund_agent import agent as refund

# -- keyword-argument tools, called together ---------------------------------------------------------------

CALLS: list[str] = []  # every real call of a tool below: a replay must never add one


@tool
def stock(sku: str, warehouse: str = "main") -> dict[str, Any]:
    """A keyword tool: validated arguments, a result in no sorted order."""
    CALLS.append(f"stock:{sku}:{warehouse}")
    return {"warehouse": warehouse, "sku": sku, "units": len(sku) * 7 % 11, "alpha": [warehouse, 1.5]}


@tool
def price(sku: str, currency: str = "EUR") -> dict[str, Any]:
    CALLS.append(f"price:{sku}:{currency}")
    return {"sku": sku, "amount": round(len(sku) * 3.25, 2), "currency": currency}


@tool(effect="write", key=lambda a: f"reserve:{a['sku']}")
def reserve(sku: str, units: int) -> dict[str, Any]:
    CALLS.append(f"reserve:{sku}:{units}")
    return {"reserved": units, "sku": sku}


def _planner(messages: list[dict[str, Any]]) -> str:
    text = str(messages[-1]["content"])
    if text.startswith("plan"):
        return json.dumps({"skus": ["kettle-2l", "mug", "teapot-xl"]})
    found = json.loads(text.split("\n", 1)[1])
    best = max(found, key=lambda f: f["stock"]["units"])
    return json.dumps({"reserve": best["stock"]["sku"], "units": 2})


async def _lookups(run: Run, skus: list[str], warehouse: str) -> list[dict[str, Any]]:
    stocks = await asyncio.gather(*(run.tool("stock", {"sku": s, "warehouse": warehouse}) for s in skus))
    prices = await asyncio.gather(*(run.tool("price", {"sku": s}) for s in skus))
    return [{"stock": st, "price": pr} for st, pr in zip(stocks, prices, strict=True)]


def _shop(warehouse: str) -> Any:
    async def shop(run: Run) -> dict[str, Any]:
        plan = json.loads((await run.model([{"role": "user", "content": f"plan {run.input['basket']}"}])).content)
        found = await _lookups(run, plan["skus"], warehouse)
        decision = json.loads((await run.model([{"role": "user", "content": "found\n" + json.dumps(found)}])).content)
        reserved = await run.tool("reserve", {"sku": decision["reserve"], "units": decision["units"]})
        return {"reserved": reserved, "seen": len(found)}

    return shop


def shop_spec() -> AgentSpec:
    """Three stock lookups at once, three prices at once, a model decision, a keyed reservation."""
    return AgentSpec(
        "shop", _shop("main"), ScriptedModel(_planner, name="scripted-shop"), tools=[stock, price, reserve]
    )


def shop_other_warehouse_spec() -> AgentSpec:
    """Changed code: it looks in another warehouse (the lookups' arguments differ from step 1)."""
    return replace(shop_spec(), fn=_shop("north"))


async def _shop_and_check(run: Run) -> dict[str, Any]:
    out = await _shop("main")(run)
    out["checked"] = await run.tool("stock", {"sku": "mug"})  # one more call: past the record
    return out


def shop_checks_again_spec() -> AgentSpec:
    """Changed code: one more stock lookup after the recorded run ended."""
    return replace(shop_spec(), fn=_shop_and_check)


# -- the example refund agent, changed -----------------------------------------------------------------------


async def _cautious_ticket(run: Run) -> dict[str, Any]:
    """The example agent with an approval threshold of 40: a 49.90 refund now waits for an operator."""
    saved = refund.APPROVAL_THRESHOLD
    refund.APPROVAL_THRESHOLD = 40.0
    try:
        return await refund.handle_ticket(run)
    finally:
        refund.APPROVAL_THRESHOLD = saved


def cautious_refund_spec() -> AgentSpec:
    return replace(refund.spec(), fn=_cautious_ticket)


def strict_refund_spec() -> AgentSpec:
    """The example agent with the stricter scripted model (another model: step 0 differs)."""
    return replace(refund.spec(), model=refund.strict_model())
