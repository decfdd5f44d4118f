"""Tools listed from a source outside the code (an MCP server): declared when first needed, their
listing recorded with the run, and declared from the record on resume.

A ``DeferredTools`` sits on an ``AgentSpec`` like a list of tools. The spec leaves it alone until it
needs the tools: its tool map, its version tuple (a run's start, a resume that drives the agent), a
re-run's comparison. A resume with nothing to drive (a completed run, a failed one not retried)
never needs them, so it never reaches their source. What listing raises reaches that first use (a
spec built while the server is down fails where the tools are first needed, not where it is built).
``a + b`` (``server.tools() + [tool]``, two servers' tools) stays deferred: a ``ConcatenatedTools``.

**Recorded listings.** A subclass implements ``list_source`` (the source's listing as JSON, asked of
it now) and ``declare_listed`` (the tools of a listing, without I/O), or else ``declare`` (list and
declare at once, nothing recorded: every resume that drives the agent lists the source again). With
the first two, a run's start records the listing in ``run.started`` (``tool_listings``) in the form
the record keeps (``as_recorded``: the agent is handed the same listing live and on resume), and a
resume declares the tools from it (``RecordedTools``, ``AgentSpec.from_record``) without listing
anything: the version check compares the recorded hashes with the code's key functions and classes.
The source is listed only before the first live call of one of its tools (``RecordedRun`` asks
``AgentSpec.before_live`` before anything of the call is recorded), once a run: a source that now
declares them differently refuses the run as a version change (``VersionMismatchError`` naming
``tool_schema_hashes``), one that cannot be listed with a ConfigurationError saying so; either
leaves the run as it was (the drive records no outcome for it, even if the agent's code caught it). So a resume whose
calls left are all recorded (it completes, or suspends, without calling them live) never reaches
the source, and a changed source is refused before anything happens with it. While a run is driven,
``in_this_run()`` gives an integration the declaration that run uses (its record's, on resume).

Rejected: a ``tools.listed`` event after ``run.started`` (the listing one append away from the
version tuple it backs: a crash between them leaves hashes without their listing, and readers gain
an event type for one fact of the start); listing the source at every resume that drives the agent
(what was done before: a run whose calls left were all recorded still needed the server); listing it
at resume and falling back to the record when it is down (a replay-only resume then still waits on
a slow server); finding a recorded listing by a name of its source (an MCP server's command line or
URL may carry a secret and changes with a port: listings follow the spec's order, which is the
code's, and the hashes still check each tool); one declaration a process, shared by every run (a
resume of a run recorded with an older listing would replay with the newer one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, overload

from runledger.errors import ConfigurationError, VersionMismatchError
from runledger.record.canonical import CHAIN_FORMAT, as_recorded, canonical_json, jsonable
from runledger.record.versions import identity
from runledger.sdk.tools import Tool

logger = logging.getLogger(__name__)

# Above this many bytes (canonical JSON) a spec's listings are not recorded: a run.started must fit a
# NATS message (1 MiB by default) beside its input; a resume then lists the source, as before.
MAX_RECORDED_LISTINGS = 256 * 1024

# The declarations the run this task drives uses in place of a spec's DeferredTools (by id): its
# record's on resume (runledger.sdk.lifecycle.drive sets it for the drive).
_IN_RUN: ContextVar[Mapping[int, DeferredTools] | None] = ContextVar("runledger_tools_in_run", default=None)


class DeferredTools(Sequence[Tool]):
    """Tools declared from a listing made outside the code, on first use (the module says when).

    ``source``: the kind of listing, named in the record (``"mcp"``); ``declare`` runs once, at the
    first use, and what it raises reaches that use."""

    source: str = "tools"
    _declared: list[Tool] | None = None
    _listing: Any = None

    def declare(self) -> Sequence[Tool]:
        """List the source now and declare its tools (blocking). By default ``list_source``, the
        listing kept in the form the record keeps, then ``declare_listed``; a subclass may override
        this alone instead, and then records nothing."""
        if not self.recordable:
            raise NotImplementedError(
                f"{type(self).__name__} implements neither declare nor list_source/declare_listed"
            )
        listing = recorded_form(self.list_source())
        declared = self.declare_listed(listing)
        self._listing = listing
        return declared

    def list_source(self) -> Any:
        """The source's listing as JSON, asked of it now (blocking)."""
        raise NotImplementedError

    def declare_listed(self, listing: Any) -> Sequence[Tool]:
        """The tools of ``listing`` (as ``list_source`` gave it, read back from the record), without I/O.
        Raises what a listing that cannot be declared raises (a key function naming a tool it lacks)."""
        raise NotImplementedError

    @property
    def recordable(self) -> bool:
        """Whether the listing is recorded (``list_source`` and ``declare_listed`` are implemented)."""
        cls = type(self)
        return (
            cls.list_source is not DeferredTools.list_source and cls.declare_listed is not DeferredTools.declare_listed
        )

    @property
    def is_declared(self) -> bool:
        return self._declared is not None

    def listing(self) -> Any:
        """The listing the tools were declared from, as the record keeps it (declaring them first);
        None when it is not recorded."""
        self._tools()
        return self._listing

    def parts(self) -> list[DeferredTools]:
        """The listings these tools come from, in order (one, or a concatenation's)."""
        return [self]

    def replaced(self, by: Mapping[int, DeferredTools]) -> DeferredTools:
        """These tools with each part ``by`` names (by id) replaced."""
        return by.get(id(self), self)

    def in_this_run(self) -> DeferredTools:
        """These tools as the run this task drives declared them: from its record on resume
        (``RecordedTools``), else these."""
        return (_IN_RUN.get() or {}).get(id(self), self)

    def _tools(self) -> list[Tool]:
        if self._declared is None:
            self._declared = list(self.declare())
        return self._declared

    @overload
    def __getitem__(self, index: int) -> Tool: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Tool]: ...
    def __getitem__(self, index: int | slice) -> Tool | Sequence[Tool]:
        return self._tools()[index]

    def __len__(self) -> int:
        return len(self._tools())

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools())

    # ``server.tools(...) + [other]`` reads as the list it was, and lists nothing until it is needed.
    def __add__(self, other: Iterable[Tool]) -> ConcatenatedTools:
        return ConcatenatedTools([self, *_items(other)])

    def __radd__(self, other: Iterable[Tool]) -> ConcatenatedTools:
        return ConcatenatedTools([*_items(other), self])


class ConcatenatedTools(DeferredTools):
    """Tools and DeferredTools one after the other (``a + b``), each part declared when needed."""

    def __init__(self, items: Sequence[Tool | DeferredTools]) -> None:
        self.items = tuple(items)

    def declare(self) -> list[Tool]:
        return [t for item in self.items for t in (item if isinstance(item, DeferredTools) else [item])]

    def listing(self) -> Any:
        return None

    def parts(self) -> list[DeferredTools]:
        return [part for item in self.items if isinstance(item, DeferredTools) for part in item.parts()]

    def replaced(self, by: Mapping[int, DeferredTools]) -> DeferredTools:
        return ConcatenatedTools(
            [item.replaced(by) if isinstance(item, DeferredTools) else item for item in self.items]
        )

    def __add__(self, other: Iterable[Tool]) -> ConcatenatedTools:
        return ConcatenatedTools([*self.items, *_items(other)])

    def __radd__(self, other: Iterable[Tool]) -> ConcatenatedTools:
        return ConcatenatedTools([*_items(other), *self.items])

    def __repr__(self) -> str:
        return " + ".join(repr(item) for item in self.items)


def _items(other: Iterable[Tool]) -> list[Tool | DeferredTools]:
    if isinstance(other, ConcatenatedTools):
        return list(other.items)
    if isinstance(other, DeferredTools):
        return [other]
    return list(other)


class RecordedTools(DeferredTools):
    """``tools`` (a DeferredTools whose listing is recorded) declared from the listing a run
    recorded, not from their source: what a resume declares (``AgentSpec.from_record``).
    ``check_source`` lists the source, once, before the first live call of one of them."""

    def __init__(self, tools: DeferredTools, listing: Any) -> None:
        self.tools = tools
        self.recorded = listing
        self.source = tools.source
        self.checked = False
        self._lock: asyncio.Lock | None = None

    def declare(self) -> Sequence[Tool]:
        declared = self.tools.declare_listed(self.recorded)
        self._listing = self.recorded
        return declared

    def list_source(self) -> Any:
        return self.tools.list_source()

    def declare_listed(self, listing: Any) -> Sequence[Tool]:
        return self.tools.declare_listed(listing)

    async def check_source(self, run_id: str, recorded: Mapping[str, Any] | None) -> None:
        """List the source now (in a worker thread; once, whichever call asks first) and raise
        VersionMismatchError when the tools it declares differ from these (``recorded``: the run's
        version tuple, for the error), ConfigurationError when it cannot be listed or declared from."""
        if self.checked:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.checked:
                return
            try:
                fresh = await asyncio.to_thread(
                    lambda: list(self.tools.declare_listed(recorded_form(self.list_source())))
                )
            except Exception as exc:
                raise ConfigurationError(
                    f"{exc}. Run {run_id} replayed what it recorded and stopped before its first live call to "
                    f"these {self.source} tools, which are checked against its record first; nothing of the call "
                    "was recorded and the run is left as it was: resume it again once their source answers"
                ) from exc
            mine = {t.name: t.schema_hash for t in self}
            now = {t.name: t.schema_hash for t in fresh}
            if now != mine:
                version = dict(recorded or {})
                others = {k: v for k, v in (version.get("tool_schema_hashes") or {}).items() if k not in mine}
                current = {**version, "tool_schema_hashes": {**others, **now}}
                raise VersionMismatchError(run_id, identity(version), identity(current))
            self.checked = True

    def __repr__(self) -> str:
        return f"<{self.tools!r}, declared from the record>"


def recorded_form(listing: Any) -> Any:
    """``listing`` as the record keeps it, and a replay reads it back (canonical JSON of new runs)."""
    return as_recorded(jsonable(listing), CHAIN_FORMAT)


def recorded_listings(parts: Sequence[DeferredTools], agent: str) -> list[dict[str, Any]] | None:
    """What a run's ``run.started`` records of ``parts`` (``tool_listings``): their listings in order,
    or None when there is none, one is not recorded, or together they pass ``MAX_RECORDED_LISTINGS``
    (logged: a resume then lists the sources, as it did before listings were recorded)."""
    if not parts or not all(p.recordable for p in parts):
        return None
    listings = [{"source": p.source, "listing": p.listing()} for p in parts]
    size = len(canonical_json(listings, CHAIN_FORMAT))
    if size > MAX_RECORDED_LISTINGS:
        logger.warning("agent %s: its tool listings take %d bytes (more than %d): not recorded, so a resume "
                       "that drives the agent lists their sources", agent, size, MAX_RECORDED_LISTINGS)  # fmt: skip
        return None
    return listings


def restored_from(parts: Sequence[DeferredTools], listings: Sequence[Mapping[str, Any]]) -> dict[int, RecordedTools]:
    """``parts`` declared from the ``listings`` a run recorded (by id), each by its place: {} when the
    record holds none for them, or not one for each part in the same order (the code's tools are not
    the recorded ones: the version check says how)."""
    if not parts or len(listings) != len(parts):
        return {}
    if any(not p.recordable or p.source != entry.get("source") for p, entry in zip(parts, listings, strict=True)):
        return {}
    return {id(p): RecordedTools(p, entry.get("listing")) for p, entry in zip(parts, listings, strict=True)}


@contextlib.contextmanager
def declared_for_run(restored: Mapping[int, DeferredTools]) -> Iterator[None]:
    """While inside, ``in_this_run()`` of a DeferredTools answers with ``restored``'s (a run's drive)."""
    token = _IN_RUN.set(restored)
    try:
        yield
    finally:
        _IN_RUN.reset(token)
