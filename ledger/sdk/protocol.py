"""``Run``: the one typed interface an agent function receives, wherever it runs.

Three classes implement it: ``RecordedRun`` (a live or resumed run recording to the log),
the sandbox guest's ``RemoteRun`` (every call is a request to the host's broker), and the
host side of a re-run (``BranchRun``, a ``RecordedRun`` with a mode's rules). An agent
annotated ``async def handle(run: Run)`` type-checks once and works in all three; the sync
facade (``SyncRun``) wraps any of them. ``tests/unit/test_run_api.py`` checks each
implementation's signatures against this protocol, and ``tests/run_contract.py`` their behaviour:
one scripted agent through each, the same observations and events.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from runledger.sdk.agent import AgentSpec
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

    async def tool(
        self, tool: str | Tool, args: Any = None, *, fn: ToolFn | None = None, tool_call_id: str | None = None
    ) -> Any:
        """Call a tool (an effect when the tool is declared with one); recorded before it returns.
        ``tool_call_id``: the model's id of this call, when it made it (an effect's context carries it)."""
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
        tool_call_id: str | None = None,
        lease_s: float | None = None,
    ) -> Any:
        """Perform a side effect at most once per idempotency ``key``, across processes.

        ``fn`` may take the attempt's ``EffectContext`` (runledger.sdk.context); ``tool_call_id``
        is the model's id of the call this answers; the claim holds a lease of ``lease_s`` seconds."""
        ...

    async def approval(self, action: str, args: Any = None) -> dict[str, Any]:
        """Wait for an operator's decision on ``action`` with ``args``; suspends the run until then."""
        ...

    async def child(self, spec: AgentSpec, input: Any = None) -> Any:
        """Run ``spec`` as a child run (its own run, recorded with this run's id and step) and return
        its output as this step's result; recorded as ``child.started`` then ``child.completed`` or
        ``child.failed`` (ChildFailedError). A resume does not run a completed child again and resumes
        an unfinished one; a suspended child suspends this run (ChildSuspendedError)."""
        ...

    async def now(self) -> dt.datetime:
        """The wall clock, recorded so that a replay sees the same time."""
        ...

    async def commit(self) -> None:
        """Return once every step so far is durably recorded (before showing a partial result
        to a person; the run commits by itself before its effects, approvals and outcome)."""
        ...

    async def random(self) -> float:
        """A random float in [0, 1), recorded so that a replay sees the same value."""
        ...
