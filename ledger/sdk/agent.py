"""What an agent is to runledger: a function of a Run plus the parts of its version tuple."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from runledger.errors import CodeNotAllowedError, ConfigurationError
from runledger.protect.data_policy import DataPolicy
from runledger.record.budgets import Budgets
from runledger.record.versions import VersionTuple
from runledger.sdk.code_identity import code_hash, legacy_code_hash
from runledger.sdk.deferred_tools import DeferredTools, RecordedTools, recorded_listings, restored_from
from runledger.sdk.models import ModelAdapter
from runledger.sdk.tools import Tool

if TYPE_CHECKING:
    from runledger.sdk.protocol import Run

AgentFn = Callable[["Run"], Awaitable[Any]]
# When a step counts as recorded: "step", acknowledged by the server before the call returns;
# "output", acknowledged before anything leaves the process (runledger.log.window).
Durability = Literal["step", "output"]


@dataclass
class AgentSpec:
    """An agent: its name (a subject token), its function and what pins its behaviour.

    ``agent_version`` is the version the operator declares (a package version, a git describe);
    when none is declared it is the code hash: the hash of the modules ``fn``'s module imports
    from the agent's own project (its import closure, runledger.sdk.code_identity), so a file
    added beside the agent changes nothing. The code hash is recorded too (``code_hash``), declared
    version or not; a resume or a re-run compares ``agent_version`` (declared with declared, hash
    with hash), never the hash of a declared version. ``prompt`` is hashed into ``prompt_hash``;
    each tool's schema is hashed into ``tool_schema_hashes``.

    ``durability``: ``"step"`` (the default) returns from a step once the server acknowledged
    its event; ``"output"`` returns at once and acknowledges in windows of at most
    ``window_events`` events or ``window_ms`` milliseconds, always before anything leaves the
    process (an effect's claim, an approval request, a child run, the run's outcome,
    ``run.commit()``). A crash then loses at most the unacknowledged window, which a resume
    runs again live: no effect can have happened inside it, but its model calls are made and
    charged again (runledger.log.window).
    """

    name: str
    fn: AgentFn
    model: ModelAdapter
    tools: Sequence[Tool] = ()
    prompt: str = ""
    agent_version: str | None = None
    budgets: Budgets = field(default_factory=Budgets)
    # What the record keeps of content (capture mode, redaction, sealing, blobs): runledger.protect.capture.
    # Its own light module (runledger.protect.data_policy): an agent module builds its spec at import.
    data_policy: DataPolicy = field(default_factory=DataPolicy)
    durability: Durability = "step"
    window_events: int = 64
    window_ms: float = 50.0

    def __post_init__(self) -> None:
        if self.durability not in get_args(Durability):
            raise ConfigurationError(
                f"agent {self.name}: durability {self.durability!r} is not one of {', '.join(get_args(Durability))}"
            )
        if not 1 <= self.window_events <= 1000 or not self.window_ms > 0:
            raise ConfigurationError(
                f"agent {self.name}: an output window holds 1 to 1000 events for a positive number of "
                f"milliseconds, not window_events={self.window_events}, window_ms={self.window_ms}"
            )
        # Tools declared from an outside listing (DeferredTools) are checked when first needed.
        self._tool_map = None if isinstance(self.tools, DeferredTools) else self._checked_tools()
        # Parts of those declared from a run's record (``from_record``), by the id of the part they stand for.
        self.restored: dict[int, RecordedTools] = {}
        self._restored_by_name: dict[str, RecordedTools] | None = None

    def _checked_tools(self) -> dict[str, Tool]:
        names = [t.name for t in self.tools]
        if len(names) != len(set(names)):
            raise ConfigurationError(f"agent {self.name}: duplicate tool names in {names}")
        return {t.name: t for t in self.tools}

    @property
    def tool_map(self) -> dict[str, Tool]:
        """The tools by name (declaring DeferredTools, on the first call)."""
        if self._tool_map is None:
            self._tool_map = self._checked_tools()
        return self._tool_map

    @property
    def deferred_parts(self) -> list[DeferredTools]:
        """The tools of this spec listed from outside the code (DeferredTools), in order."""
        return self.tools.parts() if isinstance(self.tools, DeferredTools) else []

    def tool_listings(self) -> list[dict[str, Any]] | None:
        """What a run's ``run.started`` records of the listings its tools were declared from
        (``tool_listings``: runledger.sdk.deferred_tools), declaring them first; None when none is recorded."""
        return recorded_listings(self.deferred_parts, self.name)

    def from_record(self, listings: Sequence[Mapping[str, Any]]) -> AgentSpec:
        """This agent with the tools it lists from outside the code declared from ``listings`` (a
        run's ``tool_listings``), not from their sources: what a resume drives, so that only a live
        call of one of them lists its source (``before_live``). This spec when there is nothing to
        declare so (the run recorded no listings, or not one for each part, in order)."""
        restored = restored_from(self.deferred_parts, listings)
        if not restored:
            return self
        assert isinstance(self.tools, DeferredTools)
        copy = replace(self, tools=self.tools.replaced(restored))
        copy.restored = restored
        return copy

    async def before_live(self, tool: str, run_id: str, recorded: Mapping[str, Any] | None) -> None:
        """Called before ``tool`` is called live in run ``run_id``, before anything of the call is
        recorded: when it was declared from the run's record (``from_record``), its source is listed
        (once a run) and the run refused when it now declares its tools otherwise (VersionMismatchError
        against ``recorded``, the run's version tuple) or cannot be listed (ConfigurationError)."""
        if not self.restored:
            return
        if self._restored_by_name is None:
            self._restored_by_name = {t.name: part for part in self.restored.values() for t in part}
        part = self._restored_by_name.get(tool)
        if part is not None:
            await part.check_source(run_id, recorded)

    def version(self) -> VersionTuple:
        """The version tuple a run of this agent records (``code_hash`` computed once per process)."""
        hashed = code_hash(self.fn)
        return VersionTuple(
            agent_version=self.agent_version or hashed,
            model=self.model.name,
            prompt_hash=hashlib.sha256(self.prompt.encode()).hexdigest(),
            tool_schema_hashes={t.name: t.schema_hash for t in self.tool_map.values()},
            code_hash=hashed,
        )

    def version_like(self, recorded: Mapping[str, Any] | None) -> VersionTuple:
        """This agent's version tuple computed by the rule ``recorded`` was: a run recorded before
        code hashes covered import closures (no ``code_hash``, an undeclared ``agent_version``) is
        compared with the hash of the agent's directory (``legacy_code_hash``), as it was then."""
        current = self.version()
        if recorded is None or "code_hash" in recorded or self.agent_version is not None:
            return current
        if str(recorded.get("agent_version", "")).startswith("code:"):
            return current.model_copy(update={"agent_version": legacy_code_hash(self.fn), "code_hash": None})
        return current


# The code a name given in a request may make this host import and call (CodeAllowList.from_env).
ALLOW_CODE_ENV = "RUNLEDGER_ALLOW_CODE"
WORKING_DIRECTORY = "."  # the entry for the packages and modules of the working directory
DEFAULT_ALLOWED_CODE = (WORKING_DIRECTORY, "runledger.examples")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_ATTRIBUTE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
EXAMPLES = {
    "agent": "runledger.examples.refund_agent.agent:spec",
    "model": "runledger.examples.refund_agent.agent:strict_model",
    "tools": "my_agent.tools_v2:TOOLS",
    "expect": "runledger.examples.refund_agent.checks:no_refund_without_a_photo",
}


@dataclass(frozen=True)
class CodeAllowList:
    """The code that a name in a request (``MODULE:ATTRIBUTE`` given as a re-run's ``--agent``, its
    ``--set agent=``, ``--set model=`` or ``--set tools=``, a queued re-run, the page's form) may make
    this host import and call. The operator's: ``$RUNLEDGER_ALLOW_CODE``, comma-separated, each entry a
    package (with its modules) or ``.``: the packages and modules found in the working directory,
    where ``load_agent`` looks too (``runledger`` itself excepted). Unset: ``.,runledger.examples``.

    Why a list and not only the factory rule (``_call_factory``: a function of the named module with
    no required argument): the standard library and every installed package are full of such
    functions (``http.server:test`` serves forever, ``pdb:set_trace`` waits on a terminal), and
    importing a module runs its code. A name outside the list is refused before its module is
    imported; inside it, the factory rule still decides what is called."""

    entries: tuple[str, ...] = DEFAULT_ALLOWED_CODE

    @classmethod
    def from_env(cls) -> CodeAllowList:
        raw = os.environ.get(ALLOW_CODE_ENV)
        if raw is None:
            return cls()
        return cls(tuple(entry.strip() for entry in raw.split(",") if entry.strip()))

    def describe(self) -> str:
        named = [
            f"the packages and modules of the working directory ({os.getcwd()})" if e == WORKING_DIRECTORY
            else f"{e} and its modules"
            for e in self.entries
        ]  # fmt: skip
        return "; ".join(named) or "nothing"

    def allows(self, module: str) -> bool:
        """Whether ``module`` (a dotted name) is allowed. Imports nothing."""
        if not _MODULE.fullmatch(module):
            return False
        for entry in self.entries:
            if entry == WORKING_DIRECTORY:
                # runledger itself is never the working directory's, even run from its checkout
                # (`runledger.cli.app:main` would run the CLI): its examples have their own entry.
                top = module.partition(".")[0]
                if top != "runledger" and _in_working_directory(top):
                    return True
            elif module == entry or module.startswith(entry + "."):
                return True
        return False

    def check(self, ref: str, what: str) -> None:
        """Raise CodeNotAllowedError unless ``ref`` (``module:attribute``) is allowed. Imports nothing."""
        module, _, attr = ref.partition(":")
        if not module or not attr:
            return  # not a name at all: load_named says so, importing nothing
        if not _ATTRIBUTE.fullmatch(attr) or not self.allows(module):
            raise CodeNotAllowedError(ref, what, self.describe(), ALLOW_CODE_ENV)


def _working_directory_on_path() -> None:
    if "" not in sys.path and os.getcwd() not in sys.path:
        # As `python -m` would: an agent module in the working directory is found from the
        # `runledger` console script too (whose sys.path starts with the script's own folder).
        sys.path.append(os.getcwd())


def _in_working_directory(top: str) -> bool:
    """Whether the top-level module ``top``, as an import would find it now, lies in the working
    directory. Finding a top-level module runs none of its code; a name the working directory holds
    but an earlier ``sys.path`` entry shadows (the standard library's ``test``, say) is not there."""
    _working_directory_on_path()
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if found is None:
        return False
    places = [found.origin] if found.origin and found.has_location else []
    places += list(found.submodule_search_locations or [])
    cwd = Path.cwd().resolve()
    return bool(places) and all(Path(p).resolve().is_relative_to(cwd) for p in places)


def load_named(
    ref: str, what: str, noun: str, accept: Callable[[Any], bool], *, allowed: CodeAllowList | None = None
) -> Any:
    """The object ``ref`` (``module:attribute``) names, if ``accept`` takes it, or what a factory of that
    module (``_call_factory``) returns: the one way the host turns a name into code. ``what`` names the
    option in errors (``agent``, ``model``), ``noun`` what it must be (``an AgentSpec``). With ``allowed``
    (a name from a request), a name outside it is refused (CodeNotAllowedError) before its module is
    imported. Raises ConfigurationError for anything else ``accept`` refuses, or that cannot be loaded."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"--{what} takes module:attribute (e.g. {EXAMPLES[what]}), got {ref!r}")
    if allowed is not None:
        allowed.check(ref, what)
    _working_directory_on_path()
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load {what} {ref!r}: {exc}") from exc
    if callable(obj) and not accept(obj):
        obj = _call_factory(ref, module_name, obj, noun)
    return obj


def load_agent(ref: str, *, allowed: CodeAllowList | None = None) -> AgentSpec:
    """Import ``module:attribute`` and return the AgentSpec (or the result of calling a factory).

    ``allowed``: the operator's allow-list, for a name that comes in a request (a re-run, the
    page); without it (the operator's own command line: ``runledger run``, ``resume``, the guest
    inside its sandbox) only the factory rule applies."""
    obj = load_named(ref, "agent", "an AgentSpec", lambda o: isinstance(o, AgentSpec), allowed=allowed)
    if not isinstance(obj, AgentSpec):
        raise ConfigurationError(f"{ref!r} is not an AgentSpec (nor a function returning one)")
    return obj


def is_model_adapter(obj: Any) -> bool:
    return hasattr(obj, "complete") and hasattr(obj, "name")


def load_model(ref: str, *, allowed: CodeAllowList | None = None) -> ModelAdapter:
    """The model adapter ``ref`` names (an object with ``.name`` and ``.complete()``), or what a factory
    of its module returns; ``allowed`` as for ``load_agent``."""
    obj = load_named(ref, "model", "a model adapter", is_model_adapter, allowed=allowed)
    if not is_model_adapter(obj):
        raise ConfigurationError(f"{ref!r} is not a model adapter (needs .name and .complete())")
    model: ModelAdapter = obj
    return model


def _call_factory(ref: str, module_name: str, obj: Any, noun: str = "an AgentSpec") -> Any:
    """Call ``obj`` only if it is a factory of that module: a Python function defined there that takes no
    required argument. Anything else an operator (or a page's form) might name, such as ``os:abort`` or a
    class, is refused before it is called."""
    if not inspect.isfunction(obj) or obj.__module__ != module_name:
        raise ConfigurationError(
            f"{ref!r} is not {noun} nor a function of {module_name} returning one: name it or its factory"
        )
    required = [
        p for p in inspect.signature(obj).parameters.values()
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]  # fmt: skip
    if required:
        raise ConfigurationError(f"{ref!r} takes arguments ({', '.join(p.name for p in required)}): not a factory")
    return obj()
