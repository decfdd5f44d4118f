"""``Run``: the one typed interface an agent function receives, wherever it runs.

Three classes implement it: ``RecordedRun`` (a live or resumed run recording to the log),
the sandbox guest's ``RemoteRun`` (every call is a request to the host's broker), and the
host side of a re-run (``BranchRun``, a ``RecordedRun`` with a mode's rules). An agent
annotated ``async def handle(run: Run)`` type-checks once and works in all three; the sync
facade (``SyncRun``) wraps any of them. ``tests/unit/test_run_api.py`` checks each
implementation against this protocol.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from runledger.sdk.models import ModelResponse
    from runledger.sdk.tools import EffectClass, Tool, ToolFn


@runtime_checkable
class Run(Protocol):
    """What an agent may ask of its run. Every call is a recorded step with the next step number."""

    @property
    def run_id(self) -> str:
        """The run's id (a subject token)."""
        ...

    @property
    def agent(self) -> str:
        """The agent's name, as in the run's subject."""
        ...

    @property
    def input(self) -> Any:
        """The run's input, as recorded in ``run.started``."""
        ...

    @property
    def prompt(self) -> str:
        """The agent's prompt (its hash is part of the version tuple)."""
        ...

    async def model(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        """Call the agent's model adapter; recorded as ``model.called``."""
        ...

    async def tool(self, tool: str | Tool, args: Any = None, *, fn: ToolFn | None = None) -> Any:
        """Call a tool (an effect when the tool is declared with one); recorded before it returns."""
        ...

    async def effect(
        self,
        name: str,
        args: Any,
        *,
        key: str,
        fn: ToolFn,
        reconcile: Any = None,
        effect_class: EffectClass = "write",
    ) -> Any:
        """Perform a side effect at most once per idempotency ``key``, across processes."""
        ...

    async def approval(self, action: str, args: Any = None) -> dict[str, Any]:
        """Wait for an operator's decision on ``action`` with ``args``; suspends the run until then."""
        ...

    async def now(self) -> dt.datetime:
        """The wall clock, recorded so that a replay sees the same time."""
        ...

    async def random(self) -> float:
        """A random float in [0, 1), recorded so that a replay sees the same value."""
        ...
