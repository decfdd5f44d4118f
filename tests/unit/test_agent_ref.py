"""``load_agent(MODULE:ATTR)``: the spec itself, or a factory of that module; nothing else is called.
A name that comes in a request (a re-run's agent, its ``--set model=``/``agent=``) is also held to the
operator's allow-list (``CodeAllowList``): outside it, nothing is imported or called, in the plan, the
re-run and the queue alike."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from runledger.errors import CodeNotAllowedError, ConfigurationError
from runledger.record.fold import Checkpoint
from runledger.sandbox.plan import plan_branch
from runledger.sandbox.rerun import RerunRequest, branch_spec
from runledger.sdk.agent import ALLOW_CODE_ENV, AgentSpec, CodeAllowList, load_agent, load_model

AGENT = "runledger.examples.refund_agent.agent:spec"


@pytest.fixture
def agent_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "refagents.py").write_text(
        textwrap.dedent(
            """
            import os
            from runledger.sdk.agent import AgentSpec
            from runledger.sdk.models import ScriptedModel

            async def main(run):
                return None

            spec = AgentSpec(name="refagent", fn=main, model=ScriptedModel([]))
            called = []

            def make_spec(prefix="refagent"):
                called.append(prefix)
                return AgentSpec(name=prefix + "-made", fn=main, model=ScriptedModel([]))

            def needs_args(name):
                called.append(name)
                return spec

            class Spec:
                def __init__(self):
                    called.append("class")

            abort = os.abort
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "refagents"
    sys.modules.pop("refagents", None)


def test_a_spec_and_a_factory_of_the_module_load(agent_module: str) -> None:
    assert load_agent(f"{agent_module}:spec").name == "refagent"
    made = load_agent(f"{agent_module}:make_spec")
    assert isinstance(made, AgentSpec) and made.name == "refagent-made"


@pytest.mark.parametrize("attr", ["abort", "Spec", "needs_args"])
def test_nothing_but_a_factory_is_called(agent_module: str, attr: str) -> None:
    with pytest.raises(ConfigurationError):
        load_agent(f"{agent_module}:{attr}")
    assert sys.modules[agent_module].called == []  # refused before it was called (os.abort would end the test)


def test_a_function_of_another_module_is_not_called(agent_module: str) -> None:
    with pytest.raises(ConfigurationError, match="not an AgentSpec nor a function of os"):
        load_agent("os:getpid")


@pytest.fixture
def aborts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``os.abort`` replaced by a recorder: a guard that fails shows up as a call, not a dead test run."""
    calls: list[str] = []
    monkeypatch.setattr(os, "abort", lambda: calls.append("os.abort"))
    return calls


def counterfactual(what: str, value: str) -> RerunRequest:
    return RerunRequest(parent_run_id="p", agent=AGENT, mode="counterfactual", fork_step=0, change={what: value})


def test_set_model_os_abort_is_refused_by_the_plan_before_any_call(aborts: list[str]) -> None:
    # Before: branch_spec imported os and called os.abort() (`--set model=os:abort --plan` aborted the CLI).
    plan = plan_branch(Checkpoint(run_id="p", agent="refund"), counterfactual("model", "os:abort"))
    assert aborts == []
    assert not plan.ok
    refusal = next(p for p in plan.problems if "allow-list" in p)
    assert "model 'os:abort' is not on this host's allow-list of code, so it is neither imported nor called" in refusal
    assert f"${ALLOW_CODE_ENV}=PACKAGE" in refusal and "runledger.examples and its modules" in refusal


@pytest.mark.parametrize(
    ("what", "value"),
    [("model", "os:abort"), ("model", "http.server:test"), ("agent", "pdb:set_trace"), ("agent", "os:abort")],
)
def test_a_counterfactual_names_only_allowed_code(aborts: list[str], what: str, value: str) -> None:
    host = load_agent(AGENT)
    with pytest.raises(CodeNotAllowedError) as refused:
        branch_spec(host, counterfactual(what, value))
    assert aborts == []
    assert (refused.value.ref, refused.value.what) == (value, what)


def test_a_name_outside_the_allow_list_is_not_even_imported(agent_module: str, tmp_path: Path) -> None:
    (tmp_path / "sideeffect.py").write_text("import pathlib\npathlib.Path(__file__).with_suffix('.ran').touch()\n")
    allowed = CodeAllowList.from_env()  # the default: the working directory's packages and runledger.examples
    for ref in ("sideeffect:spec", f"{agent_module}:make_spec"):
        with pytest.raises(CodeNotAllowedError):
            load_agent(ref, allowed=allowed)
    assert not (tmp_path / "sideeffect.ran").exists() and "sideeffect" not in sys.modules
    assert agent_module not in sys.modules
    # Allowed by the operator: the factory rule still decides what is called.
    mine = CodeAllowList((agent_module,))
    assert load_agent(f"{agent_module}:make_spec", allowed=mine).name == "refagent-made"
    with pytest.raises(ConfigurationError, match="not an AgentSpec nor a function of"):
        load_agent(f"{agent_module}:abort", allowed=mine)


def test_the_allow_list_is_the_operators(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ALLOW_CODE_ENV, raising=False)
    assert CodeAllowList.from_env().entries == (".", "runledger.examples")
    assert CodeAllowList.from_env().allows("runledger.examples.refund_agent.agent")
    assert CodeAllowList.from_env().allows("tests.sandbox_agents.liars.agents")  # the working directory's
    for module in ("os", "http.server", "runledger.cli", "runledger_examples", "runledger.examplesx", "a..b"):
        assert not CodeAllowList.from_env().allows(module), module
    monkeypatch.setenv(ALLOW_CODE_ENV, "mycorp.agents, mycorp.models")
    allowed = CodeAllowList.from_env()
    assert allowed.allows("mycorp.models.openai") and not allowed.allows("tests.agents")
    assert not allowed.allows("runledger.examples.refund_agent.agent")
    assert "mycorp.agents and its modules; mycorp.models and its modules" in allowed.describe()


def test_a_working_directory_name_shadowed_by_an_installed_module_is_not_the_working_directorys(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text("")
    (tmp_path / "mine.py").write_text("")
    monkeypatch.chdir(tmp_path)
    allowed = CodeAllowList((".",))
    assert allowed.allows("mine") and not allowed.allows("json")  # the import would load the standard library's


def test_load_model_takes_an_adapter_or_a_factory_of_its_module() -> None:
    allowed = CodeAllowList()
    model = load_model("runledger.examples.refund_agent.agent:strict_model", allowed=allowed)
    assert hasattr(model, "complete") and model.name
    with pytest.raises(ConfigurationError, match="not a model adapter nor a function of"):
        load_model("runledger.examples.refund_agent.agent:ScriptedModel", allowed=allowed)
