"""A support agent: read a ticket, look up the order, decide, refund, email the customer.

The refund is an effect keyed ``refund:<order>`` whose reconcile function asks the
payments service, and which passes its key to the service as the ``Idempotency-Key``
(``EffectContext.current().key``); the email is an effect keyed ``email:<ticket>`` written to an
outbox; refunds above ``APPROVAL_THRESHOLD`` wait for an operator's approval; the
run has a token and a turn budget. The model is scripted (no model service is
reachable here); swap in ``OpenAIChatModel`` for a real one.

Configuration (environment): ``REFUND_PAYMENTS_URL`` (the payments service),
``REFUND_OUTBOX`` (a directory for emails).
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

from runledger import NOT_FOUND, AgentSpec, Budgets, EffectContext, Run, ScriptedModel, tool

APPROVAL_THRESHOLD = 500.0
SYSTEM_PROMPT = (
    "You are a support agent for an online shop. Classify each ticket, then decide whether the "
    "order qualifies for a refund. Answer in JSON."
)

ORDERS: dict[str, dict[str, Any]] = {
    "order-8891": {"amount": 49.90, "item": "blender", "email": "ana@example.com", "status": "delivered"},
    "order-1002": {"amount": 15.00, "item": "phone case", "email": "bo@example.com", "status": "delivered"},
    "order-7777": {"amount": 950.00, "item": "laptop", "email": "cy@example.com", "status": "delivered"},
    "order-3003": {"amount": 22.50, "item": "kettle", "email": "di@example.com", "status": "shipped"},
}


def payments_url() -> str:
    url = os.environ.get("REFUND_PAYMENTS_URL")
    if not url:
        raise RuntimeError("set REFUND_PAYMENTS_URL to the payments service (see examples/refund_agent/payments.py)")
    return url


def outbox() -> Path:
    path = Path(os.environ.get("REFUND_OUTBOX") or "outbox")
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- tools ----------------------------------------------------------------------------------------------------


@tool("lookup_order", schema={"type": "object", "properties": {"order": {"type": "string"}}})
def lookup_order(args: dict[str, Any]) -> dict[str, Any]:
    order = ORDERS.get(args["order"])
    if order is None:
        raise LookupError(f"no order {args['order']!r}")
    return {"order": args["order"], **order}


def reconcile_refund(key: str) -> Any:
    order = key.split(":", 1)[1]
    with urllib.request.urlopen(f"{payments_url()}/refunds?order={order}", timeout=10) as resp:
        refunds = json.loads(resp.read())
    return refunds[0] if refunds else NOT_FOUND


def _issue_refund(args: dict[str, Any]) -> dict[str, Any]:
    # The effect's context names this attempt; its key is the same on every attempt at this refund.
    # Sent as the service's idempotency key, it makes a second attempt (a resume that took the
    # claim over from a process that was paused past its lease, then woke up) refund nothing twice.
    ctx = EffectContext.current()
    headers = {"Content-Type": "application/json"}
    if ctx is not None:  # None when called directly, outside a run
        headers["Idempotency-Key"] = ctx.key
    req = urllib.request.Request(
        f"{payments_url()}/refunds",
        data=json.dumps({"order": args["order"], "amount": args["amount"]}).encode(),
        headers=headers,
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        result: dict[str, Any] = json.loads(resp.read())
        return result


refund = tool(
    "refund",
    effect="irreversible",
    key=lambda a: f"refund:{a['order']}",
    reconcile=reconcile_refund,
    schema={"type": "object", "properties": {"order": {"type": "string"}, "amount": {"type": "number"}}},
)(_issue_refund)


def _send_email(args: dict[str, Any]) -> dict[str, Any]:
    # Deliberately not idempotent: every call appends a message to the outbox.
    with open(outbox() / "sent.jsonl", "a") as f:
        f.write(json.dumps(args) + "\n")
    return {"sent_to": args["to"]}


def _reconcile_email(key: str) -> Any:
    sent = outbox() / "sent.jsonl"
    ticket = key.split(":", 1)[1]
    if sent.exists():
        for line in sent.read_text().splitlines():
            message = json.loads(line)
            if message.get("ticket") == ticket:
                return {"sent_to": message["to"]}
    return NOT_FOUND


send_email = tool(
    "send_email",
    effect="write",
    key=lambda a: f"email:{a['ticket']}",
    reconcile=_reconcile_email,
    schema={"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}}},
)(_send_email)


# -- the scripted model ---------------------------------------------------------------------------------------


def scripted_reply(messages: list[dict[str, Any]]) -> str:
    """What a competent model would answer, deterministically."""
    last = str(messages[-1].get("content", ""))
    if last.startswith("TASK classify"):
        text = last.lower()
        wants_refund = any(w in text for w in ("refund", "money back", "broken", "damaged"))
        return json.dumps({"intent": "refund" if wants_refund else "question"})
    if last.startswith("TASK decide"):
        order = json.loads(last.split("\n", 1)[1])
        eligible = order["status"] == "delivered"
        reply = (
            f"We have refunded {order['amount']:.2f} for your {order['item']}."
            if eligible
            else f"Your {order['item']} has not been delivered yet; we cannot refund it."
        )
        return json.dumps({"refund": eligible, "amount": order["amount"], "reply": reply})
    return json.dumps({"reply": "Thanks for reaching out; we will get back to you shortly."})


def strict_reply(messages: list[dict[str, Any]]) -> str:
    """A stricter model for counterfactual branches: it never refunds without a photo."""
    last = str(messages[-1].get("content", ""))
    if last.startswith("TASK decide"):
        order = json.loads(last.split("\n", 1)[1])
        reply = f"Please send us a photo of the damaged {order['item']} so we can process your request."
        return json.dumps({"refund": False, "amount": order["amount"], "reply": reply})
    return scripted_reply(messages)


def strict_model() -> ScriptedModel:
    return ScriptedModel(strict_reply, name="scripted-strict-1")


# -- the agent ------------------------------------------------------------------------------------------------


async def handle_ticket(run: Run) -> dict[str, Any]:
    ticket = run.input
    history: list[dict[str, Any]] = [{"role": "system", "content": run.prompt}]
    history.append({"role": "user", "content": f"TASK classify\n{ticket['text']}"})
    intent = json.loads((await run.model(history)).content)["intent"]
    if intent != "refund":
        answer = json.loads((await run.model([*history, {"role": "user", "content": "TASK answer"}])).content)
        await run.tool("send_email", {"ticket": ticket["ticket"], "to": "customer", "body": answer["reply"]})
        return {"ticket": ticket["ticket"], "refunded": False}

    order = await run.tool("lookup_order", {"order": ticket["order"]})
    history.append({"role": "user", "content": "TASK decide\n" + json.dumps(order, sort_keys=True)})
    decision = json.loads((await run.model(history)).content)
    refunded = None
    if decision["refund"]:
        if decision["amount"] > APPROVAL_THRESHOLD:
            await run.approval("refund", {"order": order["order"], "amount": decision["amount"]})
        refunded = await run.tool("refund", {"order": order["order"], "amount": decision["amount"]})
    await run.tool("send_email", {"ticket": ticket["ticket"], "to": order["email"], "body": decision["reply"]})
    return {"ticket": ticket["ticket"], "refunded": bool(refunded), "refund": refunded}


def spec() -> AgentSpec:
    return AgentSpec(
        name="refund-agent",
        fn=handle_ticket,
        model=ScriptedModel(scripted_reply, name="scripted-support-1"),
        tools=[lookup_order, refund, send_email],
        prompt=SYSTEM_PROMPT,
        budgets=Budgets(turns=6, tokens=2_000, seconds=120),
    )


TICKETS: list[dict[str, Any]] = [
    {"ticket": "T-1001", "order": "order-8891", "text": "My blender arrived broken, I want my money back."},
    {"ticket": "T-1002", "order": "order-1002", "text": "Does the phone case fit the new model?"},
    {"ticket": "T-1003", "order": "order-0000", "text": "Refund please, the item never worked."},
    {"ticket": "T-1004", "order": "order-7777", "text": "The laptop screen is damaged, refund it."},
    {"ticket": "T-1005", "order": "order-3003", "text": "I want a refund for my kettle."},
]
