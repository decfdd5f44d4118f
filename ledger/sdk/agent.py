"""What an agent is to runledger: a function of a Run plus the parts of its version tuple."""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from runledger.errors import ConfigurationError
from runledger.protect.data_policy import DataPolicy
from runledger.record.budgets import Budgets
from runledger.record.versions import VersionTuple
from runledger.sdk.models import ModelAdapter
from runledger.sdk.tools import Tool

if TYPE_CHECKING:
    from runledger.sdk.api import Run

AgentFn = Callable[["Run"], Awaitable[Any]]
# When a step counts as recorded: "step", acknowledged by the server before the call returns;
# "output", acknowledged before anything leaves the process (runledger.log.window).
Durability = Literal["step", "output"]


@dataclass
class AgentSpec:
    """An agent: its name (a subject token), its function and what pins its behaviour.

    ``agent_version`` defaults to a hash of the source files of the package that
    defines ``fn`` (code identity); ``prompt`` is hashed into ``prompt_hash``; each
    tool's schema is hashed into ``tool_schema_hashes``.

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
        names = [t.name for t in self.tools]
        if len(names) != len(set(names)):
            raise ConfigurationError(f"agent {self.name}: duplicate tool names in {names}")
        self.tool_map = {t.name: t for t in self.tools}

    def version(self) -> VersionTuple:
        return VersionTuple(
            agent_version=self.agent_version or code_hash(self.fn),
            model=self.model.name,
            prompt_hash=hashlib.sha256(self.prompt.encode()).hexdigest(),
            tool_schema_hashes={t.name: t.schema_hash for t in self.tools},
        )


@functools.cache
def _dir_hash(directory: str) -> str:
    h = hashlib.sha256()
    root = Path(directory)
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(str(path.relative_to(root)).encode())
        h.update(b"\0")
        h.update(path.read_bytes())
    return "code:" + h.hexdigest()[:16]


def code_hash(fn: Callable[..., Any]) -> str:
    """A hash of the directory of source files that defines ``fn``."""
    source = inspect.getsourcefile(inspect.unwrap(fn))
    if source is None:
        return "code:unknown"
    return _dir_hash(str(Path(source).resolve().parent))


def load_agent(ref: str) -> AgentSpec:
    """Import ``module:attribute`` and return the AgentSpec (or the result of calling a factory)."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(
            f"--agent takes module:attribute (e.g. runledger.examples.refund_agent.agent:spec), got {ref!r}"
        )
    if "" not in sys.path and os.getcwd() not in sys.path:
        # As `python -m` would: an agent module in the working directory is found from the
        # `runledger` console script too (whose sys.path starts with the script's own folder).
        sys.path.append(os.getcwd())
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load agent {ref!r}: {exc}") from exc
    if callable(obj) and not isinstance(obj, AgentSpec):
        obj = _call_factory(ref, module_name, obj)
    if not isinstance(obj, AgentSpec):
        raise ConfigurationError(f"{ref!r} is not an AgentSpec (nor a function returning one)")
    return obj


def _call_factory(ref: str, module_name: str, obj: Any) -> Any:
    """Call ``obj`` only if it is a factory of that module: a Python function defined there that takes no
    required argument. Anything else an operator (or a page's form) might name, such as ``os:abort`` or a
    class, is refused before it is called."""
    if not inspect.isfunction(obj) or obj.__module__ != module_name:
        raise ConfigurationError(
            f"{ref!r} is not an AgentSpec nor a function of {module_name} returning one: name the spec or its factory"
        )
    required = [
        p for p in inspect.signature(obj).parameters.values()
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]  # fmt: skip
    if required:
        raise ConfigurationError(f"{ref!r} takes arguments ({', '.join(p.name for p in required)}): not a factory")
    return obj()
