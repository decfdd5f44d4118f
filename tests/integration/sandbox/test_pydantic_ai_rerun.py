"""Re-runs of a Pydantic AI agent in a real Docker sandbox: a deterministic re-drive and a counterfactual of
its model, each forked at step k.

The counter agent (tests/pydantic_ai_counter.py: Pydantic AI's ``FunctionModel`` with a policy that
counts, charges (an effect), counts again and answers) is recorded on a real nats-server; then re-run
in the sandbox (the image built with ``--extra pydantic-ai``: the guest imports Pydantic AI and runs
the agent). The guest has no network: from the fork on, the host makes each model request the guest's
agent asks for from the request the step carries alone (Pydantic AI's own history, tools and output
shape), with the run's model adapter (the re-drive: the agent's own model) or the counterfactual's.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
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
from tests import pydantic_ai_counter as counter
from tests.integration.sandbox.owned import containers_of

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(240)]
AGENT = "tests.pydantic_ai_counter:function_spec"


@pytest.fixture
async def pydantic_rerunner(docker: Any, client: LedgerClient) -> AsyncIterator[Rerunner]:
    pool = SandboxPool(docker, SandboxPolicy(image=find_image(docker, ["pydantic-ai"]), timeout_s=90), size=0)
    try:
        yield Rerunner(client, pool)
    finally:
        await pool.close()
        assert containers_of(docker, os.getpid()) == [], "a sandbox container was left behind"


def kinds(branch: Any) -> list[tuple[str, str]]:
    return [(branch.steps[s].kind, branch.steps[s].name) for s in sorted(branch.steps)]


async def test_a_pydantic_ai_agent_is_re_driven_and_re_run_with_another_model_in_the_sandbox(
    client: LedgerClient, pydantic_rerunner: Rerunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYAI_COUNTER_LOG", str(tmp_path))
    parent = await start_run(client, counter.function_spec(), "count and charge", run_id="pyai-sbx-parent")
    assert parent.status == "completed", parent.error
    charged = ["charge o-1 30.0 charge:o-1"]
    witness = tmp_path / "tools.log"
    assert [line for line in witness.read_text().splitlines() if line.startswith("charge")] == charged
    recorded = kinds(fold((await load_run(client, "pyai-sbx-parent")).records))
    assert recorded[:3] == [("model", "function:counter-policy"), ("tool", "count"),
                            ("model", "function:counter-policy")], recorded  # fmt: skip

    # A deterministic re-drive from the second model request: the host makes it and the later ones with the
    # agent's own model from the record's requests; tools and the charge are served from the record.
    redrive = await pydantic_rerunner.rerun(
        RerunRequest(parent_run_id="pyai-sbx-parent", agent=AGENT, mode="redrive", fork_step=2, timeout_s=90)
    )
    assert redrive.status == "completed", redrive.error
    assert redrive.output == parent.output, (redrive.output, parent.output)
    assert kinds(fold((await load_run(client, redrive.run_id)).records)) == recorded

    # A counterfactual of the model at the same step: the other model answers at once, charging nothing,
    # shown the tools and the first count's result that the record's request carries.
    other = await pydantic_rerunner.rerun(
        RerunRequest(
            parent_run_id="pyai-sbx-parent",
            agent=AGENT,
            mode="counterfactual",
            fork_step=2,
            change={"model": "tests.pydantic_ai_counter:cautious_model"},
            timeout_s=90,
        )
    )
    assert other.status == "completed", other.error
    assert other.changed == "model" and other.fork_step == 2
    assert isinstance(other.output, str) and other.output.startswith("cautious (2 tools): "), other.output
    assert "'tag': 'a1'" in other.output or '"tag": "a1"' in other.output, other.output
    assert kinds(fold((await load_run(client, other.run_id)).records)) == [
        *recorded[:2],
        ("model", "function:counter-cautious"),
    ]
    assert [line for line in witness.read_text().splitlines() if line.startswith("charge")] == charged
