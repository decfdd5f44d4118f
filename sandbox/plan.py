"""The plan of a re-run: before anything is queued, what each step of the parent will be in the branch.

``plan_branch(parent, request)`` is a pure function of the parent's checkpoint and the request: for
every recorded step it says whether the branch will serve it from the parent's record, run it
live, stub it (a dry-run effect, recorded as ``effect.simulated``) or refuse it, and why, by the
rules ``runledger.sandbox.branch.BranchRun`` applies (its docstring has the table). It predicts
the branch that repeats the parent's calls: a branch whose live model answers differently makes
other calls past the first difference, and those are judged when they happen (a re-drive then
diverges). ``problems`` lists what would stop a worker before the first step: the plan runs
``Rerunner.rerun``'s own checks (``runledger.sandbox.rerun.preflight``: mode, allow-list, agent load,
version tuple, counterfactual change, fork step, erased run, code to mount), collecting every refusal
instead of raising the first. ``refusals`` names each by its class (``runledger.sandbox.errors.Refusal``),
those of the request and those of the steps the mode's rules refuse, the classes the re-run raises.

``runledger rerun RUN --agent ... --mode ... --plan`` prints it (``render_plan``; ``--json``:
``BranchPlan.to_dict``) and queues nothing; the page (``runledger ui``) shows the same plan
before its queue button.

Rejected: asking the ledger for each effect key's state while planning (a live branch judges a key
by its history when it reaches it). The plan would then depend on the moment it was made and need
the operator's connection to read every key; a key the parent committed is the parent's lineage's
own, which is what the record says.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from runledger.record.fold import Checkpoint, StepRecord
from runledger.sandbox.candidate import check_in_image, describe_change
from runledger.sandbox.containers import SandboxPool
from runledger.sandbox.decision import Exercise, default_fork, predict
from runledger.sandbox.errors import Refusal, refusal_of
from runledger.sandbox.rerun import RerunRequest, preflight
from runledger.sdk.agent import CodeAllowList, load_agent

Action = Literal["record", "live", "stub", "refused"]
ACTIONS: tuple[Action, ...] = ("record", "live", "stub", "refused")
ACTION_TEXT: dict[Action, str] = {
    "record": "served from the record",
    "live": "run live",
    "stub": "stubbed",
    "refused": "refused",
}


@dataclass(frozen=True)
class StepPlan:
    """What the branch does at one of the parent's recorded steps."""

    step: int
    kind: str
    name: str
    recorded: str  # the step's status in the parent
    action: Action
    why: str
    refusal: Refusal | None = None  # the class of a refused step (runledger.sandbox.errors.Refusal)


@dataclass
class BranchPlan:
    parent_run_id: str
    branch_run_id: str
    mode: str  # as requested
    base_mode: str  # what runs from the fork: redrive or live (a counterfactual's base mode)
    fork_step: int
    allow_effects: bool
    steps: list[StepPlan] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why a worker would refuse the request
    refusals: list[Refusal] = field(default_factory=list)  # their classes, then the refused steps'
    fork_rule: str = ""  # why the fork is at fork_step: the request's --at-step, or the decision
    changed: str | None = None  # the version-tuple element the branch changes, from what to what
    changed_from: Any = None
    changed_to: Any = None
    in_place: bool = False  # the agent named is code edited since the record: an agent counterfactual
    exercise: Exercise | None = None  # whether the change will be exercised from the fork (predicted)

    def refused(self) -> list[Refusal]:
        """Every refusal class the plan predicts: the request's, then the steps' (each once)."""
        out = list(dict.fromkeys([*self.refusals, *(s.refusal for s in self.steps if s.refusal)]))
        return [r for r in out if r is not None]

    @property
    def ok(self) -> bool:
        return not self.problems

    def counts(self) -> dict[str, int]:
        """Steps from the fork on, by action."""
        out: dict[str, int] = dict.fromkeys(ACTIONS, 0)
        for s in self.steps:
            if s.step >= self.fork_step:
                out[s.action] += 1
        return out

    @property
    def change(self) -> str:
        """The change in one line (``agent code changed: code:ab12 -> code:cd34``); "" when none."""
        return describe_change(self.changed, self.changed_from, self.changed_to)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "counts": self.counts(), "refused": [str(r) for r in self.refused()],
                "change": self.change}  # fmt: skip


def _from_record(rec: StepRecord, when: str) -> tuple[Action, str]:
    """The action at a step the parent's record answers (before the fork in every mode, after it in a
    re-drive; ``when`` says which), by ``BranchRun``'s rules: a step whose record holds no outcome is
    not served (before the fork a NondeterminismError, after it a divergence)."""
    kind, status = rec.kind, rec.status
    if kind == "effect":
        if status in ("committed", "simulated") and rec.key:
            return "record", f"{when}: the recorded outcome of key {rec.key!r} ({status}); not acted again"
        return "refused", f"{when}: the record holds no outcome for key {rec.key!r} ({status}): the branch stops here"
    if kind == "approval":
        if status == "approved":
            return "record", f"{when}: approved in the parent; the decision is served"
        return "live", f"asked again ({status} in the parent): the branch suspends for a decision"
    if kind == "child":
        if status in ("completed", "failed"):
            return "record", f"{when}: the child run's recorded outcome is served; it is not started"
        return "refused", f"the child run has no outcome in the record ({status}): the branch stops here"
    return "record", f"{when}: served from the parent's record" + (" by position" if when == "re-drive" else "")


def _after_fork(rec: StepRecord, mode: str, request: RerunRequest) -> tuple[Action, str]:
    """The action at a step from the fork on, in ``mode`` (redrive or live)."""
    kind, status = rec.kind, rec.status
    if kind == "model":
        return "live", "the branch's model is called live from the fork on, in every mode"
    if mode == "redrive":
        return _from_record(rec, "re-drive")
    # live
    if kind == "tool":
        if request.live_tools is not None and rec.name not in request.live_tools:
            return "refused", f"not marked live for this re-run (--live-tool {rec.name})"
        return "live", "a read tool runs for real, on the host, through the broker"
    if kind == "effect":
        if status == "committed":
            return "record", (
                f"key {rec.key!r} was committed by this lineage: called with the same arguments, the recorded "
                "result is served and nothing happens again (other arguments: stubbed, args_differ)"
            )
        if request.allow_effects:
            return "live", f"key {rec.key!r} has no committed outcome ({status}) and effects are allowed: it happens"
        return "stub", f"key {rec.key!r} has no committed outcome ({status}): a dry-run stub records it simulated"
    if kind == "approval":
        return "live", "asked: the branch suspends until an operator decides"
    if kind in ("clock", "random"):
        return "live", "read live"
    if kind == "child":
        return "refused", "a live re-run does not start child runs (their code would run on the host)"
    return "live", "runs live"


def plan_steps(parent: Checkpoint, request: RerunRequest, fork_step: int) -> list[StepPlan]:
    """Each recorded step of ``parent`` as the branch of ``request`` forked at ``fork_step`` treats it."""
    mode = request.base_mode if request.mode == "counterfactual" else request.mode
    out = []
    for number in sorted(parent.steps):
        rec = parent.steps[number]
        action: Action = "record"
        if request.mode == "replay":
            why = "trace replay: nothing runs, the record is read and shown"
        elif number < fork_step:
            action, why = _from_record(rec, "before the fork")
        else:
            action, why = _after_fork(rec, mode, request)
        out.append(StepPlan(number, rec.kind, rec.name, rec.status, action, why,
                            _refusal(rec, action, live=number >= fork_step and mode == "live")))  # fmt: skip
    return out


def _refusal(rec: StepRecord, action: Action, *, live: bool) -> Refusal | None:
    """The class of the error ``BranchRun`` raises at a step the plan refuses."""
    if action != "refused":
        return None
    if rec.kind == "tool":
        return Refusal.TOOL_NOT_LIVE
    if rec.kind == "child" and live:
        return Refusal.CHILD_LIVE
    return Refusal.NO_OUTCOME


def refusals(
    parent: Checkpoint, request: RerunRequest, allowed: CodeAllowList | None = None
) -> list[tuple[Refusal | None, str]]:
    """Why a worker would refuse ``request`` before its first step: each refusal's class and message,
    from ``Rerunner.rerun``'s own checks (``preflight``), every one instead of the first.

    A name outside the operator's ``allowed`` code (default: ``$RUNLEDGER_ALLOW_CODE``) is reported
    and nothing is loaded: the plan imports and calls no more than a worker would."""
    allowed = CodeAllowList.from_env() if allowed is None else allowed
    found: list[Exception] = []
    preflight(parent, request, allowed, found)
    # Every error preflight collects carries its class (None would be a refusal the plan cannot name:
    # tests/integration/sandbox/test_refusals.py fails on it).
    return [(refusal_of(exc), str(exc)) for exc in found]


def problems(
    parent: Checkpoint, request: RerunRequest, fork_step: int | None = None, allowed: CodeAllowList | None = None
) -> list[str]:
    """The messages of ``refusals`` (``fork_step``: unused, the request's is checked)."""
    return [message for _, message in refusals(parent, request, allowed)]


def plan_branch(parent: Checkpoint, request: RerunRequest, allowed: CodeAllowList | None = None) -> BranchPlan:
    """The plan of ``request`` over its parent's checkpoint (loads the named agent to check it, if
    ``allowed``: default ``$RUNLEDGER_ALLOW_CODE``): as the branch will run it (code edited in place
    since the record is an agent counterfactual), forked at ``--at-step`` or else at the decision
    (runledger.sandbox.decision), with whether its change will be exercised from there."""
    allowed = CodeAllowList.from_env() if allowed is None else allowed
    errors: list[Exception] = []
    checked = preflight(parent, request, allowed, errors)
    found = [(refusal_of(exc), str(exc)) for exc in errors]
    if checked is not None:
        request = checked.request
    decision = default_fork(parent)
    fork_step, rule = (decision.step, decision.why) if request.fork_step is None else (request.fork_step, "--at-step")
    base = request.base_mode if request.mode == "counterfactual" else request.mode
    plan = BranchPlan(parent.run_id, request.branch_run_id, request.mode, base, fork_step, request.allow_effects,
                      fork_rule=rule)  # fmt: skip
    plan.steps = plan_steps(parent, request, fork_step)
    plan.problems = [message for _, message in found]
    plan.refusals = list(dict.fromkeys(refusal for refusal, _ in found if refusal is not None))
    if checked is not None:
        plan.changed, plan.changed_from, plan.changed_to = checked.changed, checked.before, checked.after
        plan.in_place = checked.in_place
        plan.exercise = predict(parent, fork_step, checked.changed)
    return plan


async def check_image(plan: BranchPlan, request: RerunRequest, pool: SandboxPool) -> None:
    """Add to ``plan`` (one that passed every check on this host) whether the code the branch runs
    (``--set agent=``'s candidate, else ``--agent``) loads in ``pool``'s sandbox image as the same
    version (``runledger.sandbox.candidate``: one sandbox started, the agent loaded, removed):
    ``Refusal.IMAGE`` when it does not. Raises SandboxError when no sandbox can be started."""
    if not plan.ok:
        return
    ref = request.change.get("agent", request.agent) if request.mode == "counterfactual" else request.agent
    problem = await check_in_image(pool, load_agent(ref, allowed=CodeAllowList.from_env()), ref)
    if problem:
        plan.problems.append(problem)
        plan.refusals.append(Refusal.IMAGE)


def render_plan(plan: BranchPlan) -> str:
    """The plan as ``runledger rerun --plan`` prints it."""
    lines = [
        f"re-run plan of {plan.parent_run_id}: {plan.mode}"
        + (f" on {plan.base_mode}" if plan.mode == "counterfactual" else "")
        + f" from step {plan.fork_step}"
        + ("; effects allowed" if plan.allow_effects else ""),
    ]
    if plan.fork_rule and plan.fork_rule != "--at-step":
        lines.append(f"fork at step {plan.fork_step}: {plan.fork_rule} (--at-step K to choose another)")
    if plan.change:
        lines.append(
            plan.change
            + (
                " (the code --agent names is not the code that recorded the run: edited since, "
                "it is re-run as a counterfactual of the agent element)"
                if plan.in_place
                else ""
            )
        )
    if plan.exercise is not None:
        lines.append(("exercised: " if plan.exercise.exercised else "NOT EXERCISED: ") + plan.exercise.why)
    lines.append(f"{'step':>5}  {'kind':<9} {'name':<24} {'recorded':<10} plan")
    for s in plan.steps:
        lines.append(f"{s.step:>5}  {s.kind:<9} {s.name[:24]:<24} {s.recorded:<10} {ACTION_TEXT[s.action]}: {s.why}")
    counts = plan.counts()
    lines.append("from the fork: " + ", ".join(f"{counts[a]} {ACTION_TEXT[a]}" for a in ACTIONS))
    if plan.problems:
        lines.append("a worker would refuse it:")
        lines.extend(f"  - {p}" for p in plan.problems)
    if plan.refused():
        lines.append("refusals predicted: " + ", ".join(plan.refused()))
    else:
        lines.append(
            "nothing ran, nothing was queued (--plan). Without --plan: --local runs it here (Docker); "
            "otherwise it is queued for a worker (`runledger worker`), and --wait waits for the branch"
        )
    return "\n".join(lines)
