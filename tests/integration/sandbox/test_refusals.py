"""Every refusal a re-run can raise, each predicted by its plan first (``rerun --plan``).

``SCENARIOS`` holds one recorded parent and request per ``runledger.sandbox.errors.Refusal`` class: the
plan (``plan_branch``, what ``rerun --plan`` prints and queues nothing for) must name the class, then the
re-run itself (``Rerunner.rerun``, in a real sandbox when it gets that far) must raise it (a refusal of
the request) or fail its branch with it (a step the mode's rules refuse). A class added to ``Refusal``
without a scenario fails ``test_every_refusal_class_has_a_scenario``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import runledger.sandbox.rerun as rerun_module
from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.record.fold import Checkpoint, fold
from runledger.sandbox.containers import SandboxPool
from runledger.sandbox.errors import Refusal, refusal_of
from runledger.sandbox.plan import check_image, plan_branch, refusals
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.agent import CodeAllowList
from runledger.sdk.lifecycle import start_run
from tests.agents import family_sandboxed_spec
from tests.sandbox_agents.counterfactual import agent as cf
from tests.sandbox_agents.modes import agent as modes

pytestmark = [pytest.mark.integration, pytest.mark.docker]
CF = "tests.sandbox_agents.counterfactual.agent"
MODES = "tests.sandbox_agents.modes.agent:spec"


@dataclass(frozen=True)
class Scenario:
    record: Callable[[LedgerClient, str], Awaitable[Any]]  # records the parent under the given run id
    request: dict[str, Any]  # the RerunRequest's fields but the parent
    edit: Callable[[Checkpoint], None] | None = None  # what the parent's record says that a plain run cannot


async def counterfactual_parent(client: LedgerClient, run_id: str) -> Any:
    return await start_run(client, cf.spec(), None, run_id=run_id)


async def unpackaged_parent(client: LedgerClient, run_id: str) -> Any:
    return await start_run(client, cf.unpackaged_spec(), None, run_id=run_id)


async def modes_parent(client: LedgerClient, run_id: str) -> Any:
    return await start_run(client, modes.spec(), None, run_id=run_id)


async def failed_charge_parent(client: LedgerClient, run_id: str) -> Any:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(modes.CHARGE_DOWN, "1")
        return await start_run(client, modes.spec(), None, run_id=run_id)  # step 8, the charge, failed


async def family_parent(client: LedgerClient, run_id: str) -> Any:
    return await start_run(client, family_sandboxed_spec(), {"x": 4}, run_id=run_id)


def no_start(cp: Checkpoint) -> None:
    cp.version = None


def erased(cp: Checkpoint) -> None:
    cp.erased = {"by": "dpo", "reason": "a data subject's request"}


AGENT = f"{CF}:spec"
SCENARIOS: dict[Refusal, Scenario] = {
    Refusal.REPLAY: Scenario(counterfactual_parent, {"agent": AGENT, "mode": "replay"}),
    Refusal.CHANGE: Scenario(counterfactual_parent, {"agent": AGENT, "mode": "redrive", "change": {"prompt": "p"}}),
    Refusal.NOT_ALLOWED: Scenario(counterfactual_parent, {"agent": AGENT, "mode": "counterfactual",
                                                          "change": {"model": "os:abort"}}),
    Refusal.AGENT: Scenario(counterfactual_parent, {"agent": f"{CF}:nothing_here", "mode": "redrive"}),
    Refusal.NOT_PACKAGED: Scenario(unpackaged_parent, {"agent": f"{CF}:unpackaged_spec", "mode": "redrive"}),
    Refusal.NO_START: Scenario(counterfactual_parent, {"agent": AGENT, "mode": "redrive"}, no_start),
    Refusal.ERASED: Scenario(counterfactual_parent, {"agent": AGENT, "mode": "redrive"}, erased),
    # Other code alone is a counterfactual of the agent element (code edited in place): another change on
    # top of it would make two.
    Refusal.VERSION: Scenario(counterfactual_parent, {"agent": "tests.sandbox_agents.counterfactual.changed.agent:spec",
                                                      "mode": "counterfactual", "change": {"prompt": "p"}}),
    Refusal.CANDIDATE: Scenario(counterfactual_parent, {"agent": AGENT, "mode": "counterfactual",
                                                        "change": {"model": f"{CF}:no_such_model"}}),
    Refusal.ELEMENT: Scenario(counterfactual_parent, {"agent": AGENT, "mode": "counterfactual",
                                                      "change": {"prompt": cf.PROMPT}}),
    Refusal.TOOL_CODE: Scenario(counterfactual_parent, {"agent": AGENT, "mode": "counterfactual",
                                                        "change": {"tools": f"{CF}:REIMPLEMENTED_TOOLS"}}),
    Refusal.FORK_STEP: Scenario(counterfactual_parent, {"agent": AGENT, "mode": "redrive", "fork_step": 99}),
    Refusal.IMAGE: Scenario(counterfactual_parent, {"agent": AGENT, "mode": "counterfactual", "change": {
        "agent": "tests.sandbox_agents.counterfactual.heavy.agent:spec"}}),
    # Refused at a step, by the mode's rules: the branch runs until it gets there.
    Refusal.NO_OUTCOME: Scenario(failed_charge_parent, {"agent": MODES, "mode": "redrive", "fork_step": 9}),
    Refusal.TOOL_NOT_LIVE: Scenario(modes_parent, {"agent": MODES, "mode": "live", "fork_step": 3,
                                                   "live_tools": []}),
    Refusal.CHILD_LIVE: Scenario(family_parent, {"agent": "tests.agents:family_sandboxed_spec", "mode": "live",
                                                 "fork_step": 1}),
}  # fmt: skip
# What the re-run learns only once its branch is under way: it fails the branch (RerunResult.refusal)
# instead of raising before one starts.
FAILS_THE_BRANCH = {Refusal.IMAGE, Refusal.NO_OUTCOME, Refusal.TOOL_NOT_LIVE, Refusal.CHILD_LIVE}


def test_every_refusal_class_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(Refusal)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("refusal", list(Refusal))
async def test_the_plan_names_each_refusal_before_the_rerun_raises_it(
    client: LedgerClient, rerunner: Rerunner, pool: SandboxPool, refusal: Refusal, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    monkeypatch.setenv("TEST_CALLS_LOG", str(tmp_path / "calls.log"))
    modes.reset()
    scenario = SCENARIOS[refusal]
    run_id = f"refused-{refusal}"
    await scenario.record(client, run_id)
    request = RerunRequest(parent_run_id=run_id, **scenario.request)

    def edited(cp: Checkpoint) -> Checkpoint:
        if scenario.edit is not None and cp.run_id == run_id:
            scenario.edit(cp)
        return cp

    # The plan first, from the parent's record: it names the class, and every refusal it reports has one.
    parent = edited(fold((await load_run(client, run_id, open_content=False)).records, check_chain=False))
    plan = plan_branch(parent, request, CodeAllowList.from_env())
    await check_image(plan, request, pool)  # what `rerun --plan` adds once the host's checks passed
    assert refusal in plan.refused(), (plan.problems, plan.steps)
    assert all(found is not None for found, _ in refusals(parent, request)), plan.problems
    real_fold = rerun_module.fold
    monkeypatch.setattr(rerun_module, "fold", lambda records, **kw: edited(real_fold(records, **kw)))

    # Then the re-run: a refused request raises, a refused step fails the branch; either names the class.
    if refusal in FAILS_THE_BRANCH:
        result = await rerunner.rerun(request)
        assert (result.status, result.refusal) == ("failed", refusal), result
    else:
        assert not plan.ok
        with pytest.raises(Exception) as caught:
            await rerunner.rerun(request)
        assert refusal_of(caught.value) is refusal, caught.value
        assert str(caught.value) in plan.problems
