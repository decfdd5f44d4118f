"""A ``tripbot`` as a user's own package, written by a test into a folder of its own (outside the project),
recorded, then edited in place as a user fixes it (``tests/tripbot.py`` is another, importable one, with
three planted causes of failure).

A trip is priced and booked: the model reads the city from the request (step 0), a read tool finds a
hotel (step 1), the model prices the stay in euros (step 2: the decision), the clock is read (step 3),
then the agent parses the price and books the hotel, an irreversible effect against a booking service
that is not idempotent (step 4: every POST books again; no idempotency key is sent). The scripted model
knows EUR, USD and GBP; for another currency it answers ``"120.0 CHF unknown"``, which the agent's
``amount, currency = answer.split()`` cannot unpack: ``ValueError: too many values to unpack (expected
2)``, raised after the last model call, at step 3.

Candidates in the package: ``mapping_model`` (knows CHF too: the fix), ``eager_model`` (prices every
currency but writes ``EUR 126.00``: fixes the CHF trips and breaks every other one), ``sometimes_model``
(maps CHF on 3 of every 5 pricing calls: a deliberately non-deterministic fix, for ``--samples``),
``counting_model`` (maps CHF, counting its calls: for the response cache). The fix in place
(``write(..., fixed=True)``) parses the answer in the agent's code instead: only the code changes.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runledger.sdk import code_identity
from runledger.sdk.agent import ALLOW_CODE_ENV

SOURCE = '''"""tripbot: prices and books a hotel for a trip."""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

from runledger import AgentSpec, ScriptedModel, tool

PROMPT = "You price hotel stays in euros. Answer: AMOUNT EUR."
RATES = {{"EUR": 1.0, "USD": 0.9, "GBP": 1.2}}
HOTELS = {{"Bern": ("Hotel Bellevue", 120.0), "Paris": ("Hotel du Nord", 150.0), "Oslo": ("Hotel Fjord", 90.0)}}


@tool("find_hotel", schema={{"type": "object", "properties": {{"city": {{"type": "string"}}}}}})
def find_hotel(args: dict[str, Any]) -> dict[str, Any]:
    name, price = HOTELS.get(args["city"], ("Hotel Central", 100.0))
    return {{"city": args["city"], "name": name, "price": price}}


def _book(args: dict[str, Any]) -> dict[str, Any]:
    # Not idempotent: every POST books again (no Idempotency-Key is sent).
    request = urllib.request.Request(
        os.environ["TRIPBOT_BOOKINGS_URL"] + "/refunds",
        data=json.dumps({{"order": args["trip"], "amount": args["amount"]}}).encode(),
        headers={{"Content-Type": "application/json"}},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return dict(json.loads(resp.read()))


book_hotel = tool(
    "book_hotel", effect="irreversible", key=lambda a: f"booking:{{a['trip']}}",
    schema={{"type": "object", "properties": {{"trip": {{"type": "string"}}, "amount": {{"type": "number"}}}}}},
)(_book)


def _reply(messages: list[dict[str, Any]], rates: dict[str, float], currency_first: tuple[str, ...] = ()) -> str:
    last = str(messages[-1]["content"])
    if last.startswith("CITY"):
        return json.dumps({{"city": last.split()[-1]}})
    asked = json.loads(last.split("\\n", 1)[1])
    rate = rates.get(asked["currency"])
    if rate is None:
        return f"{{asked['price']}} {{asked['currency']}} unknown"
    price = f"{{asked['price'] * rate:.2f}}"
    return f"EUR {{price}}" if asked["currency"] in currency_first else f"{{price}} EUR"


def model() -> ScriptedModel:
    return ScriptedModel(lambda m: _reply(m, RATES), name="scripted-trip-1")


def mapping_model() -> ScriptedModel:
    return ScriptedModel(lambda m: _reply(m, {{**RATES, "CHF": 1.05}}), name="scripted-trip-map")


def eager_model() -> ScriptedModel:
    # Maps CHF, and writes the currency first for the others: "EUR 135.00", which the agent reads as the amount.
    return ScriptedModel(lambda m: _reply(m, {{**RATES, "CHF": 1.05}}, tuple(RATES)), name="scripted-trip-eager")


_CALLS = [0]  # sometimes_model's calls in this process (the host's: a re-run's model is called there)


def _sometimes(messages: list[dict[str, Any]]) -> str:
    # Maps CHF on calls 1, 2 and 3 of every 5 pricing calls, not on 4 and 5: a fix 3 times in 5.
    if str(messages[-1]["content"]).startswith("CITY"):
        return _reply(messages, RATES)
    _CALLS[0] += 1
    return _reply(messages, {{**RATES, "CHF": 1.05}} if (_CALLS[0] - 1) % 5 < 3 else RATES)


def sometimes_model() -> ScriptedModel:
    return ScriptedModel(_sometimes, name="scripted-trip-sometimes")


CALLS_MADE = [0]  # counting_model's calls in this process: what a response cache saves


def _counted(messages: list[dict[str, Any]]) -> str:
    CALLS_MADE[0] += 1
    return _reply(messages, {{**RATES, "CHF": 1.05}})


def counting_model() -> ScriptedModel:
    return ScriptedModel(_counted, name="scripted-trip-counted")


async def agent(run: Any) -> dict[str, Any]:
    trip = run.input
    history = [{{"role": "system", "content": run.prompt}}, {{"role": "user", "content": "CITY " + trip["city"]}}]
    city = json.loads((await run.model(history)).content)["city"]
    hotel = await run.tool("find_hotel", {{"city": city}})
    asked = {{"price": hotel["price"], "currency": trip["currency"]}}
    history.append({{"role": "user", "content": "PRICE\\n" + json.dumps(asked)}})
    answer = (await run.model(history)).content
    await run.now()
{parse}
    booking = await run.tool("book_hotel", {{"trip": trip["trip"], "amount": amount}})
    return {{"trip": trip["trip"], "hotel": hotel["name"], "amount": amount, "booking": booking}}


def spec() -> AgentSpec:
    return AgentSpec("{agent}", agent, model(), tools=[find_hotel, book_hotel], prompt=PROMPT)


def books_what_it_priced(fork: Any) -> tuple[str, str]:
    """A check of the decision at the fork (``--expect``): the booking's arguments, as the check receives them."""
    booked = [s for s in fork.branch_steps if s.kind == "effect" and s.name == "book_hotel"]
    if not booked or not isinstance(booked[0].args, dict):
        return "fail", "no booking from the fork on"
    verdict = "pass" if fork.parent_status == "completed" else "improved"
    return verdict, f"books {{booked[0].args['amount']}} for {{booked[0].args['trip']}}"
'''
RECORDED = """    amount_text, currency = answer.split()
    amount = float(amount_text)"""
FIXED = """    # Fixed in place: the model's answer is parsed, and a price it could not convert is converted here.
    words = answer.split()
    amount = round(float(words[0]) * {"EUR": 1.0, "CHF": 1.05}.get(words[1], 1.0), 2)"""
TRIPS = [
    {"trip": "TR-01", "city": "Paris", "currency": "EUR"},
    {"trip": "TR-02", "city": "Bern", "currency": "CHF"},
    {"trip": "TR-03", "city": "Oslo", "currency": "USD"},
    {"trip": "TR-04", "city": "Bern", "currency": "CHF"},
]
FAILING = {"TR-02", "TR-04"}  # the currency the model does not map


def write(root: Path, package: str, agent: str, *, fixed: bool = False) -> str:
    """Write (or rewrite, in place) the package ``package`` under ``root`` and return its agent's ref. The
    process then loads it as a new process would: its modules imported again, its code hash recomputed."""
    folder = root / package
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text("")
    (folder / "agent.py").write_text(SOURCE.format(parse=FIXED if fixed else RECORDED, agent=agent))
    shutil.rmtree(folder / "__pycache__", ignore_errors=True)  # no bytecode of the code as it was
    forget(package)
    return f"{package}.agent:spec"


def forget(package: str) -> None:
    """Drop ``package`` from this process: the next load imports what the disk holds now."""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    code_identity.forget()


@contextlib.contextmanager
def installed(tmp_path: Path, bookings_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, str]]:
    """A fresh tripbot package written under ``tmp_path / "code"``, importable and allowed as re-run code,
    booking at ``bookings_url``, with a runledger home of its own: yields (package, agent name, agent ref)
    and drops the package from this process afterwards."""
    tag = os.urandom(3).hex()
    package, name = f"tripbot_{tag}", f"tripbot-{tag}"
    monkeypatch.setenv("RUNLEDGER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRIPBOT_BOOKINGS_URL", bookings_url)
    monkeypatch.setenv(ALLOW_CODE_ENV, f".,{package}")
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    ref = write(tmp_path / "code", package, name)
    try:
        yield package, name, ref
    finally:
        forget(package)
