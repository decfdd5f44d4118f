"""An agent whose input, tool output, model reply and child run carry planted plaintext, for the
erasure-lineage tests (importable in the sandbox as tests.integration.sandbox.lineage_agent:NAME)."""

from __future__ import annotations

from typing import Any

from runledger import AgentSpec, DataPolicy, ModelResponse, Run, ScriptedModel

# Each planted value is a phrase no redaction detector takes for a secret, so it is recorded
# (sealed) as is and the tests can tell "erased" from "never recorded".
DOCUMENT = "Marigold Quillfeather lives at Larkspur Mews and asks about her claim"
HOLDER = "Marigold Quillfeather"
FIELD = "claim reference Thistledown Orchard"
REPLY = "The claimant Quillfeather should be answered about Thistledown Orchard"
NOTE = "child note about Vexbrook Meadow"
PLANTED = ["Quillfeather", "Larkspur Mews", "Thistledown Orchard", "Vexbrook Meadow"]


def _extract(args: dict[str, Any]) -> dict[str, Any]:
    return {"holder": HOLDER, "field": FIELD}


def _annotate(args: dict[str, Any]) -> dict[str, Any]:
    return {"note": NOTE}


async def reader(run: Run) -> dict[str, Any]:
    """The child run: annotates the document it is given."""
    note = await run.tool("annotate", {"doc": run.input["doc"]}, fn=_annotate)
    return {"note": note["note"], "about": run.input["doc"][:21]}


def reader_spec() -> AgentSpec:
    return AgentSpec("lineage_reader", reader, ScriptedModel([]))


def _reply(messages: list[dict[str, Any]]) -> ModelResponse:
    return ModelResponse(content=REPLY, input_tokens=11, output_tokens=7)


async def root(run: Run) -> dict[str, Any]:
    """Extracts a field from the document, asks the model about it, and hands it to a child run."""
    doc = run.input["doc"]
    fields = await run.tool("extract", {"doc": doc}, fn=_extract)
    reply = await run.model([{"role": "user", "content": f"Summarise for {fields['holder']}: {doc}"}])
    child_spec = plain_reader_spec() if run.agent == PLAIN_ROOT else reader_spec()
    child = await run.child(child_spec, {"doc": doc})
    return {"summary": reply.content, "fields": fields, "child": child}


def root_spec() -> AgentSpec:
    return AgentSpec("lineage_root", root, ScriptedModel(_reply))


# The same lineage recorded unsealed (encrypt=False), every content value by reference (a blob in
# the clear): what erasure can still remove is the blobs; the token keys of redaction go too.
PLAIN = DataPolicy(encrypt=False, blob_threshold=0)
PLAIN_ROOT = "lineage_plain_root"


def plain_reader_spec() -> AgentSpec:
    return AgentSpec("lineage_plain_reader", reader, ScriptedModel([]), data_policy=PLAIN)


def plain_root_spec() -> AgentSpec:
    return AgentSpec(PLAIN_ROOT, root, ScriptedModel(_reply), data_policy=PLAIN)
