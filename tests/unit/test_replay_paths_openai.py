"""What agent code calling the OpenAI SDK receives live it receives on every path back, for any value.

The differential property test of tests/unit/test_replay_paths.py for runledger.integrations.openai
(the probe agent and its fake server: tests/openai_paths.py): Hypothesis draws what the server
answers (a chat completion's text and tool call arguments, fields a compatible server adds with
whole-number floats, unsorted objects and names beyond U+FFFF, the Responses API's response, embeddings),
and the SDK objects the agent received live (from ``create``, a stream it accumulated,
``chat.completions.stream()``'s final completion, a response stream's last event), typed at every
node, are compared with those of a resume after a kill at a random call and of the in-process
replayer, for the async client and the blocking one. On the in-memory ledger.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests import openai_paths as probe
from tests.replay_paths import differences
from tests.unit.test_replay_paths import JSON, NAMES, NUMBERS, on_memory
from tests.unit.test_replay_paths import PROPERTY as PROBE_PROPERTY

OBJECTS = st.dictionaries(NAMES, JSON, max_size=4)  # in the order drawn: not sorted
ARGUMENTS = OBJECTS.map(lambda a: json.dumps(a, ensure_ascii=False))  # a tool call's arguments: JSON text
TEXT = st.text(max_size=12)
USAGE = st.fixed_dictionaries(
    {
        "prompt_tokens": st.integers(0, 10**6),
        "completion_tokens": st.integers(0, 10**6),
        "total_tokens": st.integers(0, 10**6),
    },
    optional={"cost": NUMBERS, "prompt_tokens_details": OBJECTS},  # OpenRouter's cost, whole-number floats included
)


def _chat(text: str | None, args: str, usage: dict[str, Any], reasoning: str | None, extra: Any) -> dict[str, Any]:
    """A completion as a compatible server (OpenRouter) gives it: a ``reasoning`` text beside the content,
    a ``provider`` of any JSON value, a ``cost`` in the usage."""
    call = {"id": "call-1", "type": "function", "function": {"name": "probe", "arguments": args}}
    message = {"role": "assistant", "content": text, "reasoning": reasoning, "tool_calls": [call]}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "gpt-probe",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}], "usage": usage,
            "provider": extra}  # fmt: skip


def _response(text: str, args: str, usage: dict[str, Any], temperature: Any, extra: Any) -> dict[str, Any]:
    output = [
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": text, "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call-1", "name": "probe", "arguments": args,
         "status": "completed"},
    ]  # fmt: skip
    return {"id": "resp_1", "object": "response", "created_at": 1700000000, "model": "gpt-probe",
            "status": "completed", "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "temperature": temperature, "provider": extra,
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                      "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}  # fmt: skip


def _embeddings(vector: list[float], extra: Any) -> dict[str, Any]:
    return {"object": "list", "model": "emb-probe", "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "usage": {"prompt_tokens": 3, "total_tokens": 3}, "provider": extra}  # fmt: skip


FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(10**6), 10**6).map(float)
VALUES = st.fixed_dictionaries(
    {
        "chat": st.builds(_chat, st.none() | TEXT, ARGUMENTS, USAGE, st.none() | TEXT, JSON),
        "responses": st.builds(
            _response, TEXT, ARGUMENTS, USAGE, st.sampled_from([1.0, 0.7, 0.0, None]) | FLOATS, JSON
        ),
        "embeddings": st.builds(_embeddings, st.lists(FLOATS, max_size=6), JSON),
    }
)
HOSTILE = {
    "chat": _chat("hi \U0001f600", '{"tag": "a1", "n": 1, "usd": 210.0}',
                  {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "cost": 0.0}, "thought",
                  {"z": 1, "\U0001f600": 2**60, "\uffff": -0.0, "b": [2.0]}),
    "responses": _response("hey", '{"b": 2, "a": 1}', {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                           1.0, {"usd": 210.0, "a": {}}),
    "embeddings": _embeddings([0.5, 1.0, -0.0, 3.0], {"b": 2.0, "a": 1}),
}  # fmt: skip
SPECS = {"async": probe.spec, "blocking": probe.sync_spec}
PROPERTY = settings(PROBE_PROPERTY, max_examples=30)  # each example drives seven SDK calls live and again
_ids = itertools.count()


@PROPERTY
@example(values=HOSTILE, stop_after=1, client="async")
@example(values=HOSTILE, stop_after=2, client="blocking")
@given(values=VALUES, stop_after=st.integers(min_value=1, max_value=6), client=st.sampled_from(sorted(SPECS)))
def test_a_resume_after_a_kill_observes_what_live_observed(
    values: dict[str, Any], stop_after: int, client: str
) -> None:
    probe.reset(values)
    make, n = SPECS[client], next(_ids)

    async def drive(ledger: Any) -> tuple[str, str]:
        live = await probe.live(ledger, f"oa-live-{n}", make)
        return live, await probe.resumed(ledger, f"oa-kill-{n}", stop_after, make)

    live, resumed = on_memory(drive)
    assert resumed == live, differences(live, resumed)


@PROPERTY
@example(values=HOSTILE, client="async")
@example(values=HOSTILE, client="blocking")
@given(values=VALUES, client=st.sampled_from(sorted(SPECS)))
def test_the_replayer_replays_unchanged_code_clean_and_observes_what_live_observed(
    values: dict[str, Any], client: str
) -> None:
    probe.reset(values)
    make, n = SPECS[client], next(_ids)

    async def drive(ledger: Any) -> tuple[str, Any, str]:
        live = await probe.live(ledger, f"oa-live-{n}", make)
        result, observed = await probe.replayed(ledger, f"oa-live-{n}", make)
        return live, result, observed

    live, result, observed = on_memory(drive)
    assert result.ok, str(result)
    assert observed == live, differences(live, observed)
