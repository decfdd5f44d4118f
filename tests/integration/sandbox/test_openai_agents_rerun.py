"""A counterfactual of an OpenAI Agents SDK agent's instructions at step k, in a real Docker sandbox.

The shop agent (tests/openai_agents_shop.py: a lookup, a refund that is an effect, a handoff to the
closer) is recorded against the fake Responses API on loopback; then re-run in the sandbox (the image
built with `--extra openai-agents`: the guest imports the SDK and runs the agent) as a counterfactual of
its prompt, the support agent's instructions, forked at its second model call: the steps before the fork
are served from the record (the fake is not asked again), and from the fork on the host makes the model
calls the guest's agent asks for, with the new instructions, which tell the model never to refund: the
branch hands off to the closer without refunding (the refund's witness still holds the parent's one line).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sandbox.containers import SandboxPolicy, SandboxPool
from runledger.sandbox.image import find_image
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.lifecycle import start_run
from tests import openai_agents_shop as shop
from tests.integration.sandbox.owned import containers_of

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(240)]
AGENT = "tests.openai_agents_shop:spec"


@pytest.fixture
async def agents_rerunner(docker: Any, client: LedgerClient) -> AsyncIterator[Rerunner]:
    pool = SandboxPool(docker, SandboxPolicy(image=find_image(docker, ["openai-agents"]), timeout_s=90), size=0)
    try:
        yield Rerunner(client, pool)
    finally:
        await pool.close()
        assert containers_of(docker, os.getpid()) == [], "a sandbox container was left behind"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[shop.FakeResponses]:
    responses = shop.FakeResponses()
    with responses.serving() as url:
        monkeypatch.setenv("OA_SHOP_URL", url)  # the host's model calls go there; the guest has no network
        monkeypatch.setenv("OA_SHOP_LOG", str(tmp_path))
        yield responses


def refunds(tmp_path: Path) -> list[str]:
    log = tmp_path / "tools.log"
    return [line for line in log.read_text().splitlines() if line.startswith("refund ")] if log.exists() else []


async def test_a_counterfactual_of_the_instructions_at_step_k_runs_in_the_sandbox(
    client: LedgerClient, agents_rerunner: Rerunner, fake: shop.FakeResponses, tmp_path: Path
) -> None:
    parent = await start_run(client, shop.spec(), "My order o-cf arrived broken.", run_id="oa-cf-parent")
    assert parent.status == "completed", parent.error
    assert refunds(tmp_path) == ["refund o-cf 30.0 refund:o-cf"] and len(fake.requests) == 4

    instructions = f"{shop.SUPPORT} Policy: {shop.NEVER}; hand the case to the closer."
    request = RerunRequest(parent_run_id="oa-cf-parent", agent=AGENT, mode="counterfactual", fork_step=2,
                           change={"prompt": instructions}, base_mode="live", live_tools=["transfer_to_closer"],
                           timeout_s=90)  # fmt: skip
    result = await agents_rerunner.rerun(request)
    assert result.status == "completed", result.error
    assert result.changed == "prompt_hash" and result.fork_step == 2
    # Before the fork: the record (the first request and the lookup were not made again). From it: the
    # support agent's call with the new instructions, then the closer's.
    asked = fake.bodies[4:]
    assert [b["instructions"] for b in asked] == [instructions, shop.CLOSER], asked
    assert result.output == 'Closed: {"assistant": "closer"}', result.output
    assert refunds(tmp_path) == ["refund o-cf 30.0 refund:o-cf"], "the branch refunded"
    branch = fold((await load_run(client, result.run_id)).records)
    kinds = [(branch.steps[s].kind, branch.steps[s].name) for s in sorted(branch.steps)]
    assert kinds == [("model", "fake-support"), ("tool", "lookup_order"), ("model", "fake-support"),
                     ("tool", "transfer_to_closer"), ("model", "fake-support")], kinds  # fmt: skip
