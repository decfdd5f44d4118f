"""Tools listed from outside the code (runledger.sdk.deferred_tools) on the in-memory ledger: the
listing recorded in ``run.started``, a resume that declares the tools from it and lists the source
only before a live call to it, a changed or unreachable source refused there with nothing recorded.

The source is a ``Shelf`` standing for a server, that counts how often it was listed; each ``spec()``
reaches it through a ``Catalog`` of its own, as each ``runledger`` process that loads the agent does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from runledger.errors import ConfigurationError, VersionMismatchError
from runledger.log.client import LedgerClient
from runledger.log.memory import MemoryLedger
from runledger.ops.decisions import approve
from runledger.protect.loading import load_run
from runledger.record.events import RunStarted
from runledger.record.fold import Checkpoint, fold
from runledger.sdk import deferred_tools
from runledger.sdk.agent import AgentSpec
from runledger.sdk.deferred_tools import DeferredTools
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.sdk.models import ScriptedModel
from runledger.sdk.tools import Tool, tool

SCHEMA = {"type": "object", "properties": {"order": {"type": "string"}, "limit": {"type": "number", "maximum": 5.0}}}


class Shelf:
    """A source of tools: ``tools`` maps each name to its schema; ``down`` makes a listing fail."""

    def __init__(self, tools: dict[str, dict[str, Any]] | None = None) -> None:
        self.tools = tools or {"lookup": SCHEMA, "refund": SCHEMA}
        self.down = False
        self.listings = 0
        self.calls: list[str] = []


class Catalog(DeferredTools):
    """The tools of a shelf, listed from it."""

    source = "catalog"

    def __init__(self, shelf: Shelf) -> None:
        self.shelf = shelf

    def list_source(self) -> Any:
        self.shelf.listings += 1
        if self.shelf.down:
            raise ConfigurationError("cannot list the tools of the catalog: it is down")
        return {"tools": [{"name": name, "schema": schema} for name, schema in self.shelf.tools.items()]}

    def declare_listed(self, listing: Any) -> list[Tool]:
        def called(name: str) -> Any:
            return lambda args: self.shelf.calls.append(name) or {"tool": name, **args}

        return [
            Tool(t["name"], called(t["name"]), schema=t["schema"], effect_class="read" if t["name"] == "lookup"
                 else "write", key=None if t["name"] == "lookup" else (lambda a: f"refund:{a['order']}"))
            for t in listing["tools"]
        ]  # fmt: skip


SHELF = Shelf()
CATALOG = Catalog(SHELF)  # the catalog of the spec built last


async def shop(run: Any) -> Any:
    """Looks up, refunds, with an approval after ``approve_after`` of those calls."""
    listed = CATALOG.in_this_run().listing()
    outputs = []
    for n, name in enumerate(["lookup", "refund"]):
        if n == run.input["approve_after"]:
            await run.approval("go on", {"order": "A1"})
        try:
            outputs.append(await run.tool(name, {"order": "A1"}))
        except (VersionMismatchError, ConfigurationError):
            if not run.input.get("swallow"):
                raise
            outputs.append("the agent swallowed the refusal")
    if run.input["approve_after"] == 2:
        await run.approval("close", {"order": "A1"})
    return {"listed": listed, "outputs": outputs}


@pytest.fixture
async def client() -> AsyncIterator[LedgerClient]:
    global SHELF
    SHELF = Shelf()
    yield await MemoryLedger().connect()


def spec() -> AgentSpec:
    """The agent as a process that loads it builds it: with a catalog of its own, nothing listed yet."""
    global CATALOG
    CATALOG = Catalog(SHELF)
    return AgentSpec("deferred", shop, ScriptedModel(["unused"]), tools=CATALOG, agent_version="1")


async def started(client: LedgerClient, run_id: str, **inputs: Any) -> Checkpoint:
    """Start run ``run_id`` (it suspends at its approval), approve it, and return its checkpoint."""
    first = await start_run(client, spec(), inputs, run_id=run_id)
    assert first.status == "suspended", first
    await approve(client, run_id, first.pending[0], by="op")
    return await checkpoint(client, run_id)


async def checkpoint(client: LedgerClient, run_id: str) -> Checkpoint:
    return fold((await load_run(client, run_id, open_content=False)).records)


async def test_the_listing_is_recorded_and_a_resume_with_every_call_recorded_never_lists_the_source(
    client: LedgerClient,
) -> None:
    cp = await started(client, "all-recorded", approve_after=2)
    assert SHELF.listings == 1 and SHELF.calls == ["lookup", "refund"]
    [listing] = cp.tool_listings
    # In the form the record keeps (format 2: an integral float is an integer), beside the hashes it backs.
    assert listing["source"] == "catalog" and listing["listing"]["tools"][0]["schema"]["properties"]["limit"] == {
        "type": "number", "maximum": 5}  # fmt: skip
    assert sorted(cp.version["tool_schema_hashes"]) == ["lookup", "refund"]  # type: ignore[index]
    assert Checkpoint.from_dict(cp.to_dict()).tool_listings == cp.tool_listings  # a journal snapshot keeps it

    SHELF.down = True
    SHELF.tools["refund"] = {"type": "object"}  # changed too: no call goes to it, so nothing asks
    done = await resume_run(client, spec(), "all-recorded")
    assert done.status == "completed", done
    assert SHELF.listings == 1 and SHELF.calls == ["lookup", "refund"]  # never listed, never called
    assert done.output["listed"] == listing["listing"]  # the listing handed to the agent live, from the record


async def test_a_call_left_lists_the_source_first_and_a_changed_one_is_refused_with_nothing_recorded(
    client: LedgerClient,
) -> None:
    before = await started(client, "one-left", approve_after=1)
    SHELF.tools["refund"] = {**SCHEMA, "required": ["order"]}  # another input schema
    with pytest.raises(VersionMismatchError, match="tool_schema_hashes") as refused:
        await resume_run(client, spec(), "one-left")
    assert refused.value.differs == ["tool_schema_hashes"]
    assert SHELF.listings == 2 and SHELF.calls == ["lookup"]  # listed before the refund, which never ran
    after = await checkpoint(client, "one-left")
    assert after.status == "running" and after.steps.keys() == before.steps.keys()  # nothing of the call

    SHELF.tools["refund"] = SCHEMA  # as recorded: the run goes on
    done = await resume_run(client, spec(), "one-left")
    assert done.status == "completed" and SHELF.calls == ["lookup", "refund"]
    assert SHELF.listings == 3  # once more, before the refund


async def test_an_unreachable_source_refuses_the_live_call_and_the_run_is_not_failed(client: LedgerClient) -> None:
    await started(client, "down", approve_after=1)
    SHELF.down = True
    with pytest.raises(ConfigurationError, match="cannot list the tools of the catalog: it is down") as refused:
        await resume_run(client, spec(), "down")
    assert "resume it again once their source answers" in str(refused.value)
    assert (await checkpoint(client, "down")).status == "running" and SHELF.calls == ["lookup"]
    SHELF.down = False
    assert (await resume_run(client, spec(), "down")).status == "completed"


async def test_a_refusal_the_agent_caught_still_refuses_the_run(client: LedgerClient) -> None:
    await started(client, "swallowed", approve_after=1, swallow=True)
    SHELF.tools["refund"] = {"type": "object"}
    with pytest.raises(VersionMismatchError):
        await resume_run(client, spec(), "swallowed")  # the agent returned: its output is not recorded
    assert (await checkpoint(client, "swallowed")).status == "running"


async def test_a_run_started_without_listings_records_none_and_concatenated_tools_stay_deferred(
    client: LedgerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    @tool
    def note(order: str) -> str:
        return order

    plain = AgentSpec("deferred", shop, ScriptedModel(["unused"]), tools=[note], agent_version="1")
    assert plain.tool_listings() is None
    assert "tool_listings" not in RunStarted(agent="a", version=plain.version()).model_dump()

    other = Shelf({"find": SCHEMA})
    both = AgentSpec("deferred", shop, ScriptedModel(["unused"]), tools=Catalog(SHELF) + [note] + Catalog(other))  # noqa: RUF005
    assert SHELF.listings == other.listings == 0  # nothing listed where the spec is built
    assert list(both.tool_map) == ["lookup", "refund", "note", "find"]
    listings = both.tool_listings()
    assert listings is not None and [entry["listing"]["tools"][0]["name"] for entry in listings] == ["lookup", "find"]
    SHELF.down = other.down = True
    fresh = AgentSpec("deferred", shop, ScriptedModel(["unused"]), tools=Catalog(SHELF) + [note] + Catalog(other))  # noqa: RUF005
    resumed = fresh.from_record(listings)
    assert resumed.version() == both.version() and (SHELF.listings, other.listings) == (1, 1)
    assert fresh.from_record(listings[:1]) is fresh  # not one listing for each part: declared by listing
    monkeypatch.setattr(deferred_tools, "MAX_RECORDED_LISTINGS", 100)
    assert both.tool_listings() is None  # too large to record beside the run's input: a resume lists them


async def test_the_replayer_declares_the_tools_from_the_recording_and_never_lists_the_source(
    client: LedgerClient,
) -> None:
    from runledger.testing.export import read_recording
    from runledger.testing.replayer import Replayer

    await started(client, "exported", approve_after=2)
    assert (await resume_run(client, spec(), "exported")).status == "completed"
    recording = await read_recording(client, "exported")
    SHELF.down = True
    result = await Replayer(spec()).replay(recording)
    assert result.ok and result.version_changes == {}, result
    assert SHELF.listings == 1  # at the run's start only
