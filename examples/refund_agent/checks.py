"""User checks for the refund agent's CI gate: each judges a branch's decision at its fork.

    runledger rerun --where "status = 'completed'" --agent runledger.examples.refund_agent.agent:spec \\
        --mode counterfactual --at-step 2 --set model=runledger.examples.refund_agent.agent:strict_model \\
        --expect runledger.examples.refund_agent.checks:no_refund_without_a_photo --junit sweep.xml

The stricter model asks for a photo where the recorded model refunded: its branches "diverge" from the
record (the refund the record holds is never asked for again), so by outcomes they would all be
regressions. The check reads the decision itself, the first model reply from the fork on.
"""

from __future__ import annotations

import json
from typing import Any

from runledger.sandbox.gate import CheckResult, Fork


def _decision(steps: list[Any]) -> dict[str, Any] | None:
    """The first refund decision among ``steps``: a model reply with a ``refund`` field (a fork before the
    decision also holds the classification and the answers to questions, which decide nothing)."""
    for step in steps:
        if step.kind == "model" and isinstance(step.output, dict):
            try:
                decided = json.loads(str(step.output.get("content", "")))
            except ValueError:
                continue
            if isinstance(decided, dict) and "refund" in decided:
                return decided
    return None


def no_refund_without_a_photo(fork: Fork) -> CheckResult:
    """Pass when the branch's decision at the fork refunds nothing and asks for a photo; fail otherwise."""
    decision, before = _decision(fork.branch_steps), _decision(fork.parent_steps)
    if decision is None:
        if before is None:
            return CheckResult("pass", f"no refund decided from step {fork.fork_step} in either run")
        return CheckResult("fail", f"the branch decides nothing from step {fork.fork_step} where the record did")
    if decision["refund"]:
        return CheckResult("fail", f"the branch refunds {decision.get('amount')} without a photo")
    if "photo" not in str(decision.get("reply", "")).lower():
        return CheckResult("fail", "the branch refunds nothing but does not ask for a photo either")
    if before is not None and before["refund"]:
        return CheckResult("improved", "asks for a photo where the recorded run refunded at once")
    return CheckResult("pass", "refunds nothing and asks for a photo")
