"""tripbot: a small trip-booking agent with three planted causes of failure, for the fix loop's tests.

Each trip: the model plans (step 0), the ``quote`` read tool prices the hotel (step 1), the model decides
(step 2, ``BOOK <hotel> <price> <currency>``), ``book_hotel`` books it (step 3, an irreversible effect keyed
by the trip), the model confirms (step 4, ``CONFIRMED <ref> total <amount> <currency>``). The causes, each
with numbers, ids and quoted values that vary from trip to trip:

- **currency** (a city whose hotels quote a currency word, ``CURRENCY_WORDS``): the model copies the
  word into its decision unless the prompt asks for ISO 4217 codes (``FIXED_PROMPT``); the agent raises
  ``ValueError: unknown currency 'franc' for trip TR-007 at 321.0`` after step 2;
- **nowhere** (a city with no hotels, ``NOWHERE``): ``quote`` raises ``LookupError`` at step 1;
- **long stays** (more than ``LONG_STAY`` nights): the confirmation names no total unless the prompt asks
  for one; the agent raises ``ValueError: confirmation 3f9a... of trip TR-011 has no total`` after step 4.

The model is a scripted function of the messages (what a deterministic model would answer), so it reads the
prompt: a prompt fix changes what it says, live, in a re-drive or in the in-process replayer.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from runledger import AgentSpec, Run, ScriptedModel, tool

PROMPT = "You book hotels for travellers. Answer BOOK <hotel> <price> <currency>."
FIXED_PROMPT = PROMPT + " Give every price in ISO 4217 currency codes and always state the total."
# A prompt that makes the model ask for another quote first: a call the record of a failure cannot answer.
REQUOTE_PROMPT = PROMPT + " Prefer longer stays: ask for a quote for one more night first."

CURRENCIES = {"EUR", "USD", "GBP", "CHF", "JPY"}
CITY_CURRENCY = {"Lisbon": "EUR", "Boston": "USD", "London": "GBP", "Kyoto": "JPY", "Zurich": "franc", "Bern": "franc"}
CURRENCY_WORDS = {"franc": "CHF"}
NOWHERE = {"Atlantis", "El Dorado", "Shangri-La"}
LONG_STAY = 9
GOOD_CITIES = ["Lisbon", "Boston", "London", "Kyoto"]


def trip(n: int) -> dict[str, Any]:
    """Trip ``n`` of a deterministic mix in which 3 trips in 10 fail, one per cause: ``n % 10 == 3`` stays
    10 nights, ``4`` goes to a city quoting francs, ``7`` to a city with no hotels."""
    nights = 1 + (n * 3) % 10
    if n % 10 == 4:
        city = ("Zurich", "Bern")[(n // 10) % 2]
    elif n % 10 == 7:
        city = sorted(NOWHERE)[(n // 10) % 3]
    else:
        city = GOOD_CITIES[n % 4]
    return {"trip": f"TR-{n:03d}", "city": city, "nights": nights}


def cause(t: dict[str, Any]) -> str:
    """Which planted cause fails trip ``t`` under ``PROMPT`` (``""``: it completes)."""
    if t["city"] in NOWHERE:
        return "nowhere"
    if CITY_CURRENCY[t["city"]] not in CURRENCIES:
        return "currency"
    return "long stay" if t["nights"] > LONG_STAY else ""


@tool("quote", schema={"type": "object", "properties": {"city": {"type": "string"}, "nights": {"type": "integer"}}})
def quote(args: dict[str, Any]) -> dict[str, Any]:
    city, nights = args["city"], int(args["nights"])
    if city in NOWHERE:
        raise LookupError(f"no hotels in {city!r} for {nights} nights")
    return {
        "hotel": f"H-{len(city) * 13 + nights}",
        "price": 80.0 * nights + len(city),
        "currency": CITY_CURRENCY[city],
    }


BOOKED: list[dict[str, Any]] = []  # every booking really made in this process (a non-idempotent service)


def _book(args: dict[str, Any]) -> dict[str, Any]:
    BOOKED.append(args)
    ref = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]
    return {"ref": ref, "hotel": args["hotel"]}


book_hotel = tool(
    "book_hotel",
    effect="irreversible",
    key=lambda a: f"book:{a['trip']}",
    schema={"type": "object", "properties": {"trip": {"type": "string"}, "hotel": {"type": "string"},
                                             "price": {"type": "number"}, "currency": {"type": "string"}}},
)(_book)  # fmt: skip


def reply(messages: list[dict[str, Any]]) -> str:
    """The scripted model: deterministic, and it follows the prompt (the first message)."""
    prompt = str(messages[0].get("content", ""))
    last = str(messages[-1].get("content", ""))
    if last.startswith("QUOTE "):
        q = json.loads(last[6:])
        if "one more night" in prompt and "requoted" not in last:
            return "REQUOTE"
        currency = q["currency"]
        if "ISO 4217" in prompt:
            currency = CURRENCY_WORDS.get(currency, currency)
        return f"BOOK {q['hotel']} {q['price']} {currency}"
    if last.startswith("BOOKED "):
        booked = json.loads(last[7:])
        if booked["nights"] > LONG_STAY and "the total" not in prompt:
            return f"CONFIRMED {booked['ref']}"
        return f"CONFIRMED {booked['ref']} total {booked['price']} {booked['currency']}"
    return "PLAN quote the hotel, then book it"


async def tripbot(run: Run) -> dict[str, Any]:
    t = run.input
    asked = f"Trip {t['trip']}: {t['nights']} nights in {t['city']}"
    history: list[dict[str, Any]] = [{"role": "system", "content": run.prompt}, {"role": "user", "content": asked}]
    await run.model(history)
    q = await run.tool("quote", {"city": t["city"], "nights": t["nights"]})
    decision = (
        await run.model([*history, {"role": "user", "content": "QUOTE " + json.dumps(q, sort_keys=True)}])
    ).content
    if decision == "REQUOTE":
        q = await run.tool("quote", {"city": t["city"], "nights": t["nights"] + 1})
        q["requoted"] = True
        decision = (
            await run.model([*history, {"role": "user", "content": "QUOTE " + json.dumps(q, sort_keys=True)}])
        ).content
    _, hotel, price, currency = decision.split()
    if currency not in CURRENCIES:
        raise ValueError(f"unknown currency {currency!r} for trip {t['trip']} at {price}")
    booking = await run.tool(
        "book_hotel", {"trip": t["trip"], "hotel": hotel, "price": float(price), "currency": currency}
    )
    ref = str(booking.get("ref") or "simulated")
    booked = {"ref": ref, "nights": t["nights"], "price": float(price), "currency": currency}
    confirmation = (
        await run.model([*history, {"role": "user", "content": "BOOKED " + json.dumps(booked, sort_keys=True)}])
    ).content
    if "total" not in confirmation:
        raise ValueError(f"confirmation {ref} of trip {t['trip']} has no total")
    return {"trip": t["trip"], "confirmation": confirmation}


def spec(prompt: str = PROMPT) -> AgentSpec:
    return AgentSpec("tripbot", tripbot, ScriptedModel(reply, name="scripted-trips-1"), tools=[quote, book_hotel],
                     prompt=prompt)  # fmt: skip


def fixed_spec() -> AgentSpec:
    """The fix: the same agent with ``FIXED_PROMPT``."""
    return spec(FIXED_PROMPT)


def requote_spec() -> AgentSpec:
    """A candidate whose model asks for a quote the record of a failure never made."""
    return spec(REQUOTE_PROMPT)
