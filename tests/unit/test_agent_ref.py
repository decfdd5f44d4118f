"""``load_agent(MODULE:ATTR)``: the spec itself, or a factory of that module; nothing else is called."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from runledger.errors import ConfigurationError
from runledger.sdk.agent import AgentSpec, load_agent


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
