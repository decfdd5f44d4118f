"""An agent for the counterfactual tests whose model keeps the witness's log on the host.

``ask`` sends its prompt and its tools' descriptions (``tools=``, OpenAI's chat layout) with every
model call, so each of the four version-tuple elements shapes every request: step 0 model, 1 lookup,
2 model, 3 lookup, 4 model, 5 lookup. ``WitnessModel`` runs on the host (the broker calls it) and
logs every request it receives in ``REQUESTS``: the external witness of what the model was sent,
and of which steps reached it at all (a step served from the record never does). It never answers
twice alike, so a served answer cannot pass for a live one.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from runledger import AgentSpec, ModelResponse, Run, tool

PROMPT = "Answer briefly."
REQUESTS: list[dict[str, Any]] = []
QUESTIONS = ("a", "b", "c")
# Set by a test: every model call waits for it after logging its request (a branch stopped mid-way).
HOLD: list[asyncio.Event] = []


def reset() -> None:
    REQUESTS.clear()
    HOLD.clear()


class WitnessModel:
    """A model that logs what it is sent and answers with its name and the number of its call."""

    retry = None

    def __init__(self, name: str = "witness-1") -> None:
        self.name = name

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        REQUESTS.append({"model": self.name, "messages": messages, "params": params})
        for hold in HOLD:
            await hold.wait()
        return ModelResponse(content=f"{self.name} answer {len(REQUESTS)}", input_tokens=3, output_tokens=3)


@tool("lookup")
def lookup(q: str) -> dict[str, Any]:
    """Look a question up."""
    return {"q": q, "found": q.upper()}


TOOLS = [lookup]


def tool_schemas() -> list[dict[str, Any]]:
    return [{"type": "function", "function": t.json_schema()} for t in TOOLS]


async def ask(run: Run, code: str = "v1") -> dict[str, Any]:
    answers = []
    for i, q in enumerate(QUESTIONS):
        user = f"question {i}" + ("" if code == "v1" else f" ({code})")
        reply = await run.model([{"role": "system", "content": run.prompt}, {"role": "user", "content": user}],
                                tools=tool_schemas())  # fmt: skip
        found = await run.tool("lookup", {"q": q})
        answers.append([reply.content, found])
    return {"code": code, "answers": answers}


def spec() -> AgentSpec:
    return AgentSpec("cf", ask, WitnessModel(), tools=TOOLS, prompt=PROMPT)


def other_model() -> WitnessModel:
    """A counterfactual model: another name, the same witness."""
    return WitnessModel("witness-2")


# -- candidate tools ---------------------------------------------------------------------------------

NEW_DESCRIPTION = "Find the answer to a question by its letter."
NEW_PARAMETERS = {
    "type": "object",
    "properties": {"q": {"type": "string", "description": "the question's letter"}},
    "required": ["q"],
}
# What the model sees changes (description and parameter schema); the implementation is the same.
CLEARER_TOOLS = [dataclasses.replace(lookup, description=NEW_DESCRIPTION, schema=NEW_PARAMETERS)]
# Only the description changes (Tool.schema_hash leaves it out; what the model sees does not).
REWORDED_TOOLS = [dataclasses.replace(lookup, description=NEW_DESCRIPTION)]


@tool("lookup")
def lookup_elsewhere(q: str) -> dict[str, Any]:
    """Look a question up."""
    return {"q": q, "found": q.lower()}


# Another implementation under the same name: a code change, which --set tools= refuses.
REIMPLEMENTED_TOOLS = [lookup_elsewhere]


async def _unpackaged(run: Run) -> dict[str, Any]:
    return await ask(run)


# An agent function as a script run with `python agent.py` defines it (in __main__): nothing a sandbox can
# import it from.
_unpackaged.__module__ = "__main__"


def unpackaged_spec() -> AgentSpec:
    return AgentSpec("cf", _unpackaged, WitnessModel(), tools=TOOLS, prompt=PROMPT)
