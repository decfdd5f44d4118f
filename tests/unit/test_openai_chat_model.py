"""``OpenAIChatModel`` without a server: the core imports and builds it without loading ``openai``,
and without the ``openai`` extra it says what to install (the calls themselves:
tests/integration/test_openai_endpoint.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import runledger.extras
from runledger import MissingExtraError, OpenAIChatModel


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    """``_missing`` is functools.cache'd: ask find_spec afresh and leave no answer behind."""
    runledger.extras._missing.cache_clear()
    yield
    runledger.extras._missing.cache_clear()


async def test_without_the_extra_it_is_built_and_its_first_call_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Built without the extra: a re-run's sandbox image holds the core only, and its guest loads the
    # agent's spec (this adapter in it) though the host makes the model calls. The call names the extra.
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> object:
        return None if name == "openai" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    model = OpenAIChatModel("gpt-test", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(MissingExtraError) as info:
        await model.complete([{"role": "user", "content": "hi"}])
    assert info.value.extra == "openai" and info.value.feature == "OpenAIChatModel"
    assert "pip install 'runledger[openai]'" in str(info.value)


def test_a_spec_with_the_adapter_loads_where_openai_is_not_installed(tmp_path: Path) -> None:
    """What a sandbox guest does with a recorded agent's spec, in a Python that cannot import openai."""
    (tmp_path / "openai.py").write_text("raise ImportError('openai is not installed here')\n")
    (tmp_path / "openai_less_agent.py").write_text(
        "from runledger import AgentSpec, OpenAIChatModel\n"
        "async def agent(run):\n    return None\n"
        "spec = AgentSpec('a', agent, OpenAIChatModel('gpt-test'))\n"
    )
    code = (
        "import importlib.util, sys\n"
        "importlib.util.find_spec = (lambda real: lambda n, p=None: None if n == 'openai' else real(n, p))"
        "(importlib.util.find_spec)\n"
        "from runledger.sdk.agent import load_agent\n"
        "print(load_agent('openai_less_agent:spec').model.name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["gpt-test"]


def test_importing_and_building_the_adapter_leaves_openai_unloaded() -> None:
    """The SDK (and httpx under it) loads at the first call, not with the core."""
    code = (
        "import sys\n"
        "from runledger import OpenAIChatModel\n"
        "model = OpenAIChatModel('gpt-test', base_url='http://127.0.0.1:9/v1')\n"
        "print(' '.join(sorted(m for m in ('openai', 'httpx') if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == []


def test_the_adapter_keeps_its_public_shape() -> None:
    model = OpenAIChatModel("gpt-test", base_url="http://localhost:8000/v1/", api_key_env="MY_KEY", timeout_s=5)
    assert (model.name, model.base_url, model.api_key_env, model.timeout_s) == (
        "gpt-test", "http://localhost:8000/v1", "MY_KEY", 5
    )  # fmt: skip
    assert model.retry is not None and model.retry.attempts == 4
    assert model.request_body([{"role": "user", "content": "x"}], top_k=3) == {
        "model": "gpt-test", "messages": [{"role": "user", "content": "x"}], "top_k": 3
    }  # fmt: skip
    reply = OpenAIChatModel.parse(
        {"choices": [{"message": {"content": None, "tool_calls": [{"id": "c"}]}, "finish_reason": "tool_calls"}]}
    )
    assert (reply.content, reply.tool_calls, reply.finish_reason) == ("", [{"id": "c"}], "tool_calls")


def test_a_reply_with_tool_calls_and_no_finish_reason_is_a_tool_call_turn() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    asked = OpenAIChatModel.parse({"choices": [{"message": {"content": None, "tool_calls": [call]}}]})
    assert (asked.finish_reason, asked.tool_calls) == ("tool_calls", [call])
    said = OpenAIChatModel.parse({"choices": [{"message": {"content": "hi"}, "finish_reason": None}]})
    assert said.finish_reason == "stop"
    given = OpenAIChatModel.parse({"choices": [{"message": {"tool_calls": [call]}, "finish_reason": "length"}]})
    assert given.finish_reason == "length"
