"""The CI gate of a sweep: one verdict per recorded run, judged at the fork, as text, JSON and JUnit XML,
with an exit code a CI system acts on, and what each branch cost.

A sweep (``runledger rerun --where SQL ...``, runledger.sandbox.sweep) re-drives recorded runs with a
change. Each becomes a ``Case``. Without a check its verdict compares outcomes:

=================  ==============================================================================
``pass``           the parent completed and the branch completed
``improved``       the parent did not complete (failed, suspended) and the branch completed
``still_failing``  neither completed: the change did not fix this run (the gate closes, unless
                   ``--allow-still-failing``: a gate over failures opens only on a fix)
``regressed``      the parent completed and the branch did not (the gate closes)
``not_exercised``  the branch never exercised its change from the fork on (no model call past the
                   fork for a model, prompt or tools change; a branch that stopped before its fork:
                   runledger.sandbox.decision), whatever its outcome: nothing was tested. It counts
                   as still failing when the parent did not complete, and closes the gate likewise
``error``          the run could not be re-run (another agent's run, an erased run...)
=================  ==============================================================================

Outcomes at the end of a run are a weak judge of a change to a decision: a branch whose changed model
asks for a photo where the parent refunded "diverges" from the record (the next call is not one the
record can answer) and so never completes, although its decision may be exactly the one wanted. A user
check (``--expect MODULE:FN``) judges the decision at the fork instead: ``FN(fork)`` receives a ``Fork``
(the parent's and the branch's steps from the fork step on, their outcomes) and returns ``"pass"``,
``"fail"`` or ``"improved"``, optionally with a message (a ``CheckResult``, a ``(verdict, message)``
pair, or the verdict alone). A check that raises is a ``fail`` with its error as the message. The steps
a check receives (``ForkStep``) carry the arguments each was called with (a model call's request) beside
its output, as the caller's connection may open them: a caller without the run's content grant gets
sealed values sealed (``{"$enc": ...}``), as ``runledger show`` would show them.

Exit codes (``runledger.cli.exits.Exit``, the one table of every command): 0 (``OK``), the gate is
open (no case regressed, failed its check or still fails); 1 (``FAILED``), a case regressed, failed its
check, or (without ``--allow-still-failing``) a failure still fails; 3
(``NOT_RERUN``), the gate is open but some runs could not be re-run; 4 (``ERROR``), the sweep itself
could not run (the server, Docker, a bad ``--where`` or ``--expect``: the message says which); 2
(``USAGE``), the command line does not parse.

JUnit XML: one ``testsuite`` (the sweep) with one ``testcase`` per recorded run (``classname`` the
agent, ``name`` the run id, ``time`` the re-run's seconds); a case that closes the gate is a
``failure`` element (message: the verdict's reason and the branch's exception; text: the exception
type and message of the recorded run and of the branch, the divergence and the ``runledger diff``
command that shows it), ``error`` an ``error`` element, a still failing case the gate allows a
``skipped`` one, ``pass`` and ``improved`` plain test cases. Each test case carries properties: the
branch id, verdict, first differing step, tokens and cost. ``--json`` has the same per case
(``parent_error`` and ``branch_error``: type, message, step, reason).

Samples (``--samples N``, runledger.sandbox.samples): a case then holds N branches of the same change and
a fix rate (``fixed 3/5``); its verdict is ``improved`` only when the rate reaches ``--min-fix-rate``
(default 1.0: every sample), and it carries whether the unchanged re-drive (the baseline) is flaky.
``Case.fixed`` stays what a matrix counts (runledger.sandbox.matrix ranks candidates by it). The JUnit
properties and ``--json`` carry ``samples``, ``fixes``, ``fix_rate`` and ``flaky``.
"""

from __future__ import annotations

import inspect
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from runledger.cli.exits import Exit
from runledger.errors import ConfigurationError
from runledger.ops.prices import PriceTable
from runledger.record.fold import Checkpoint, StepRecord
from runledger.record.records import Recorded
from runledger.sandbox.decision import exercise_of
from runledger.sdk.agent import CodeAllowList, load_named

Verdict = Literal["pass", "improved", "still_failing", "regressed", "fail", "not_exercised", "error"]
CheckVerdict = Literal["pass", "fail", "improved"]
CLOSES_THE_GATE: frozenset[str] = frozenset({"regressed", "fail"})  # whatever --allow-still-failing says
# Where a step's event records the arguments its digest covers (a model call's: its request).
_ARGS_FIELD = {"model.called": "request", "tool.called": "args", "effect.intended": "args",
               "effect.simulated": "args", "approval.requested": "args"}  # fmt: skip


@dataclass
class ForkStep(StepRecord):
    """A step as a check sees it: the fold's record of it (``output``, ``status``...) and ``args``, the
    arguments it was called with (a model call's request: messages and parameters), as the caller may
    open them (module docstring); None when the record holds none (a clock read)."""

    args: Any = None


def step_args(records: Iterable[Recorded]) -> dict[int, Any]:
    """Each step's arguments (``ForkStep.args``) from a run's events, by step."""
    out: dict[int, Any] = {}
    for r in records:
        name = _ARGS_FIELD.get(r.event.type)
        step = r.event.payload.get("step")
        if name is not None and isinstance(step, int) and step not in out:
            out[step] = r.event.payload.get(name)
    return out


def error_of(cp: Checkpoint) -> dict[str, Any] | None:
    """A failed run's exception as reports carry it: type, message (at most 2,000 characters), the
    step it failed at and the failure's reason; None for a run that did not fail."""
    if cp.status != "failed":
        return None
    error = cp.error if isinstance(cp.error, dict) else {}
    message = str(error.get("message") or "")
    return {"type": str(error.get("type") or ""), "message": message if len(message) <= 2000 else message[:1999] + "…",
            "step": cp.failed_step, "reason": cp.failure_reason}  # fmt: skip


def describe_error(error: dict[str, Any] | None) -> str:
    """``ValueError: too many values to unpack (expected 2)`` of an ``error_of``; "" for None."""
    if not error:
        return ""
    text = ": ".join(x for x in (error.get("type"), error.get("message")) if x)
    return text or str(error.get("reason") or "")


@dataclass(frozen=True)
class Fork:
    """What a user check judges: a recorded run and its branch from the fork step on."""

    parent_run_id: str
    branch_run_id: str
    fork_step: int
    parent_steps: list[ForkStep]  # the parent's steps numbered fork_step and later, in order, with their args
    branch_steps: list[ForkStep]  # the branch's, likewise
    parent_status: str
    branch_status: str
    branch_reason: str | None  # why the branch did not complete (``diverged``...), None when it did
    parent_output: Any = None
    branch_output: Any = None
    parent_error: dict[str, Any] | None = None  # a failed run's exception (``error_of``)
    branch_error: dict[str, Any] | None = None

    def step(self, which: Literal["parent", "branch"], n: int) -> ForkStep | None:
        """Step ``n`` of the parent or the branch (None: that run has no such step)."""
        steps = self.parent_steps if which == "parent" else self.branch_steps
        return next((s for s in steps if s.step == n), None)


@dataclass(frozen=True)
class CheckResult:
    verdict: CheckVerdict
    message: str = ""


Check = Callable[[Fork], Any]


def load_check(ref: str, *, allowed: CodeAllowList | None = None) -> Check:
    """The function ``ref`` (``MODULE:FN``) names: a function of one argument, the ``Fork``. A name outside
    the operator's allow-list (``$RUNLEDGER_ALLOW_CODE``) is refused before its module is imported."""

    def is_check(obj: Any) -> bool:
        if not callable(obj):
            return False
        try:
            inspect.signature(obj).bind(None)
        except (TypeError, ValueError):
            return False
        return True

    obj = load_named(ref, "expect", "a check of one argument (the Fork)", is_check,
                     allowed=allowed or CodeAllowList.from_env())  # fmt: skip
    if not is_check(obj):
        raise ConfigurationError(f"--expect {ref!r} must name a function of one argument (the Fork)")
    check: Check = obj
    return check


def run_check(check: Check, fork: Fork) -> CheckResult:
    """Call ``check`` and read its answer; one that raises, or answers anything else, is a ``fail``."""
    try:
        answer = check(fork)
    except Exception as exc:  # the user's code: whatever it raises is its verdict
        return CheckResult("fail", f"the check raised {type(exc).__name__}: {exc}")
    if isinstance(answer, CheckResult):
        return answer
    verdict, message = answer if isinstance(answer, tuple) and len(answer) == 2 else (answer, "")
    if verdict not in get_args(CheckVerdict):
        return CheckResult("fail", f"the check answered {answer!r}: expected 'pass', 'fail' or 'improved'")
    return CheckResult(verdict, str(message))


@dataclass
class Cost:
    """Tokens of a run's model steps and what they cost (``usd`` None: no price table, or a model without
    a price: ``priced`` says whether every model step had one)."""

    tokens: int = 0
    usd: float | None = None
    priced: bool = False

    @classmethod
    def of(cls, steps: Iterable[StepRecord], prices: PriceTable | None) -> Cost:
        steps = list(steps)
        tokens = sum(s.tokens for s in steps if s.kind == "model")
        if prices is None or not prices.prices:
            return cls(tokens)
        usd, priced = prices.run_cost(steps)
        return cls(tokens, usd, priced)


@dataclass
class Case:
    """One recorded run of the sweep and its branch, judged."""

    parent_run_id: str
    agent: str = ""
    branch_run_id: str | None = None
    parent_status: str = ""
    branch_status: str | None = None
    branch_reason: str | None = None
    verdict: Verdict = "error"
    message: str = ""  # the verdict's reason
    checked: bool = False  # the verdict is a user check's
    first_difference: int | None = None
    seconds: float = 0.0
    parent_cost: Cost = field(default_factory=Cost)
    branch_cost: Cost = field(default_factory=Cost)
    fork_step: int | None = None
    change: str = ""  # the branch's change in one line (``agent code changed: code:ab12 -> code:cd34``)
    parent_error: dict[str, Any] | None = None  # the recorded run's exception (``error_of``)
    branch_error: dict[str, Any] | None = None  # the branch's
    samples: int = 0  # --samples: the branches of this change (0: one branch, no sampling)
    fixes: int = 0  # of them, those judged ``improved``
    sample_branches: list[str] = field(default_factory=list)
    baseline_samples: int = 0  # unchanged re-drives (runledger.sandbox.samples): 0 when not measured
    baseline_flips: int = 0  # of them, those whose outcome differs from the record's

    @property
    def fix_rate(self) -> float | None:
        return self.fixes / self.samples if self.samples else None

    @property
    def flaky(self) -> bool | None:
        """The unchanged re-drive does not always end as the record did (None: no baseline was measured)."""
        return self.baseline_flips > 0 if self.baseline_samples else None

    @property
    def diff_command(self) -> str | None:
        return f"runledger diff {self.parent_run_id} {self.branch_run_id}" if self.branch_run_id else None

    @property
    def fixed(self) -> bool:
        """The change fixed this run: it had not completed (or a check said so) and its branch is judged
        ``improved``. What a matrix counts per candidate (a rate, once a case holds samples)."""
        return self.verdict == "improved"

    @property
    def still_fails(self) -> bool:
        """A run that had not completed and is not fixed: ``still_failing``, or ``not_exercised`` on a failure."""
        if self.verdict == "still_failing":
            return True
        return self.verdict == "not_exercised" and self.parent_status not in ("completed", "")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["diff_command"] = self.diff_command
        out["fix_rate"], out["flaky"] = self.fix_rate, self.flaky
        return out

    @property
    def sampled(self) -> str:
        """``fixed 3/5`` and the baseline's flakiness, for a sampled case ("" otherwise)."""
        if not self.samples:
            return ""
        text = f"fixed {self.fixes}/{self.samples}"
        if self.baseline_samples:
            text += (f", FLAKY: unchanged re-drive ended otherwise than the record {self.baseline_flips}/"
                     f"{self.baseline_samples}" if self.flaky else ", baseline steady")  # fmt: skip
        return text


def outcome_verdict(parent_status: str, branch_status: str) -> tuple[Verdict, str]:
    """The verdict when no check judges: outcomes compared (module docstring)."""
    if parent_status == "completed":
        if branch_status == "completed":
            return "pass", "completed before and after the change"
        return "regressed", f"completed before the change, {branch_status} after it"
    if branch_status == "completed":
        return "improved", f"{parent_status} before the change, completed after it"
    return "still_failing", f"{parent_status} before the change, {branch_status} after it"


def judge(
    parent: Checkpoint,
    branch: Checkpoint,
    fork_step: int,
    *,
    branch_reason: str | None,
    check: Check | None = None,
    args: tuple[Mapping[int, Any], Mapping[int, Any]] = ({}, {}),
) -> tuple[Verdict, str]:
    """The verdict of one case: ``not_exercised`` when the branch never exercised its change from the fork
    on (runledger.sandbox.decision: nothing was tested, whatever a check or the outcome would say), else
    the user's check of the decision at the fork if there is one, else outcomes. ``args``: each run's
    step arguments (``step_args``), for the check's ``ForkStep``s."""
    exercised = exercise_of(branch)
    if exercised is not None and not exercised.exercised:
        return "not_exercised", f"not exercised: {exercised.why} ({parent.status} before, {branch.status} after)"
    if check is None:
        return outcome_verdict(parent.status, branch.status)

    def steps(cp: Checkpoint, found: Mapping[int, Any]) -> list[ForkStep]:
        return [ForkStep(**vars(s), args=found.get(n)) for n, s in sorted(cp.steps.items()) if n >= fork_step]

    fork = Fork(
        parent_run_id=parent.run_id, branch_run_id=branch.run_id, fork_step=fork_step,
        parent_steps=steps(parent, args[0]), branch_steps=steps(branch, args[1]),
        parent_status=parent.status, branch_status=branch.status,
        branch_reason=None if branch.status == "completed" else branch_reason,
        parent_output=parent.output, branch_output=branch.output,
        parent_error=error_of(parent), branch_error=error_of(branch),
    )  # fmt: skip
    result = run_check(check, fork)
    return result.verdict, result.message


@dataclass
class GateReport:
    """Every case of a sweep, and what the gate says of them."""

    cases: list[Case] = field(default_factory=list)
    mode: str = ""
    change: dict[str, str] = field(default_factory=dict)
    where: str = ""
    allow_still_failing: bool = False  # --allow-still-failing: a failure the change does not fix keeps it open
    min_fix_rate: float = 1.0  # --min-fix-rate: with samples, a fix rate below it is not a fix
    model_calls: int | None = None  # --cache-responses: live model requests sent (None: no cache)
    cached_calls: int | None = None  # and those answered from the cache (runledger.sandbox.responses)

    def count(self, verdict: Verdict) -> int:
        return sum(1 for c in self.cases if c.verdict == verdict)

    def closes(self, case: Case) -> bool:
        """Whether ``case`` closes the gate: it regressed, failed its check, or (unless allowed) still fails."""
        return case.verdict in CLOSES_THE_GATE or (case.still_fails and not self.allow_still_failing)

    @property
    def exit_code(self) -> Exit:
        if any(self.closes(c) for c in self.cases):
            return Exit.FAILED
        if any(c.verdict == "error" for c in self.cases):
            return Exit.NOT_RERUN
        return Exit.OK

    def cost(self, which: Literal["parent", "branch"]) -> Cost:
        costs = [c.parent_cost if which == "parent" else c.branch_cost for c in self.cases]
        priced = [c.usd for c in costs if c.usd is not None]
        return Cost(
            tokens=sum(c.tokens for c in costs),
            usd=sum(priced) if priced else None,
            priced=bool(costs) and all(c.priced for c in costs),
        )

    def to_dict(self) -> dict[str, Any]:
        verdicts: dict[str, int] = {v: self.count(v) for v in get_args(Verdict)}
        return {
            "where": self.where, "mode": self.mode, "change": self.change,
            "exit_code": int(self.exit_code), "gate": "closed" if self.exit_code == Exit.FAILED else "open",
            "allow_still_failing": self.allow_still_failing, "verdicts": verdicts,
            "min_fix_rate": self.min_fix_rate, "model_calls": self.model_calls, "cached_calls": self.cached_calls,
            "still_failing": [c.parent_run_id for c in self.cases if c.still_fails],
            "cost": {"recorded": asdict(self.cost("parent")), "branches": asdict(self.cost("branch"))},
            "cases": [c.to_dict() for c in self.cases],
        }  # fmt: skip

    def render(self) -> str:
        """The per-run lines and the gate's line (the sweep's own summary stands above them)."""
        lines = []
        for c in self.cases:
            cost = f"{c.branch_cost.tokens} tokens" + (f", ${c.branch_cost.usd:.4f}" if c.branch_cost.usd is not None
                                                        else "")  # fmt: skip
            check = " (check)" if c.checked else ""
            branch = c.branch_run_id or "-"
            raised = describe_error(c.branch_error)
            sampled = f" [{c.sampled}]" if c.samples else ""
            lines.append(f"  {c.verdict:<13} {c.parent_run_id} -> {branch}{check}{sampled}: {c.message}"
                         + (f"; {_short(raised)}" if raised else "") + f" [{cost}]")  # fmt: skip
        spent = self.cost("branch")
        total = f"{spent.tokens} tokens" + (f", ${spent.usd:.4f}" if spent.usd is not None else "")
        if spent.usd is not None and not spent.priced:
            total += " (some models have no price)"
        counts = ", ".join(f"{self.count(v)} {v}" for v in get_args(Verdict) if self.count(v))
        of_samples = [c for c in self.cases if c.samples]
        if of_samples:
            fixes, drawn = sum(c.fixes for c in of_samples), sum(c.samples for c in of_samples)
            flaky = sum(1 for c in of_samples if c.flaky)
            lines.append(f"fix rate: {fixes}/{drawn} samples over {len(of_samples)} runs; {flaky} flaky "
                         f"(--min-fix-rate {self.min_fix_rate:g})")  # fmt: skip
        if self.model_calls is not None:
            lines.append(f"model calls: {self.model_calls} made, {self.cached_calls} served from the cache "
                         "(--cache-responses)")  # fmt: skip
        gate = {Exit.OK: "open", Exit.FAILED: "CLOSED", Exit.NOT_RERUN: "open, but some runs were not re-run"}
        lines.append(f"gate: {gate[self.exit_code]} ({counts or 'no runs'}); branches cost {total}")
        failing = [c for c in self.cases if c.still_fails]
        if failing and self.allow_still_failing:
            lines.append(f"{len(failing)} still failing, allowed (--allow-still-failing)")
        elif failing:
            lines.append(f"closed by {len(failing)} still failing: a gate over failures opens when the change fixes "
                         "them (--allow-still-failing keeps it open for those)")  # fmt: skip
        return "\n".join(lines)

    def junit(self, suite: str = "runledger sweep") -> str:
        """The report as JUnit XML (module docstring)."""
        root = ET.Element("testsuites")
        failures = sum(1 for c in self.cases if self.closes(c))
        errors = self.count("error")
        skipped = sum(1 for c in self.cases if not self.closes(c) and c.verdict in ("still_failing", "not_exercised"))
        ts = ET.SubElement(root, "testsuite", {
            "name": suite, "tests": str(len(self.cases)), "failures": str(failures), "errors": str(errors),
            "skipped": str(skipped), "time": f"{sum(c.seconds for c in self.cases):.3f}",
        })  # fmt: skip
        props = ET.SubElement(ts, "properties")
        for name, value in (("where", self.where), ("mode", self.mode),
                            *((f"change.{k}", v) for k, v in sorted(self.change.items())),
                            *((("model_calls", str(self.model_calls)), ("cached_calls", str(self.cached_calls)))
                              if self.model_calls is not None else ())):  # fmt: skip
            ET.SubElement(props, "property", {"name": name, "value": value})
        for c in self.cases:
            tc = ET.SubElement(ts, "testcase", {"classname": c.agent or "runledger", "name": c.parent_run_id,
                                                "time": f"{c.seconds:.3f}"})  # fmt: skip
            cprops = ET.SubElement(tc, "properties")
            for name, value in (
                ("branch", c.branch_run_id or ""), ("verdict", c.verdict), ("checked", str(c.checked).lower()),
                ("first_difference", "" if c.first_difference is None else str(c.first_difference)),
                ("tokens.recorded", str(c.parent_cost.tokens)), ("tokens.branch", str(c.branch_cost.tokens)),
                ("usd.branch", "" if c.branch_cost.usd is None else f"{c.branch_cost.usd:.6f}"),
                *((("samples", str(c.samples)), ("fixes", str(c.fixes)), ("fix_rate", f"{c.fix_rate:.3f}"),
                   ("flaky", "" if c.flaky is None else str(c.flaky).lower())) if c.samples else ()),
            ):  # fmt: skip
                ET.SubElement(cprops, "property", {"name": name, "value": value})
            raised = describe_error(c.branch_error)
            if self.closes(c):
                message = c.message + (f": {_short(raised, 300)}" if raised else "")
                ET.SubElement(tc, "failure", {"message": message, "type": c.verdict}).text = _detail(c)
            elif c.verdict == "error":
                ET.SubElement(tc, "error", {"message": c.message, "type": "not_rerun"}).text = _detail(c)
            elif c.verdict in ("still_failing", "not_exercised"):
                ET.SubElement(tc, "skipped", {"message": c.message})
        ET.indent(root)
        return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _short(text: str, width: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _detail(c: Case) -> str:
    """A JUnit failure's text: the verdict's reason, each run's exception, the divergence, the diff command."""

    def raised(which: str, error: dict[str, Any] | None) -> str:
        if not error:
            return ""
        step = f" at step {error['step']}" if error.get("step") is not None else ""
        return f"{which} failed{step} ({error.get('reason')}): {describe_error(error)}"

    return "\n".join(x for x in (
        c.message,
        c.change,
        raised(f"recorded run {c.parent_run_id}", c.parent_error),
        f"branch {c.branch_run_id}: {c.branch_status}" + (f" ({c.branch_reason})" if c.branch_reason else "")
        if c.branch_run_id else "",
        raised(f"branch {c.branch_run_id}", c.branch_error),
        f"first difference at step {c.first_difference}" if c.first_difference is not None else "",
        f"compare with: {c.diff_command}" if c.diff_command else "",
    ) if x)  # fmt: skip
