"""How the projection forgets an erased run's content: its rows are rewritten, structure kept.

A run's ``run.erased`` (``runledger.protect.erasure``: its own, or one cascaded from a run it
derives from) destroys the key its content was sealed under, so the ciphertext the projection
holds is already unreadable. The projection drops it anyway, and with it whatever was recorded
unsealed (``DataPolicy(encrypt=False)``), which a destroyed key cannot reach: from the batch
that folds ``run.erased`` on, every content value of the run in ``runs``, ``steps``,
``checkpoints``, ``events`` and ``effect_keys`` reads ``{"$erased": true}`` (error messages and
tracebacks ``«erased»``). Types, names, statuses, digests, token usage, timings and keys stay,
so the erased run is still counted, joined and diffed by structure.

Two halves, both pure:

- ``erase_checkpoint`` rewrites the run's checkpoint as the partition holds it
  (``runledger.projections.partition``), so the ``runs``, ``steps`` and ``checkpoints`` rows of
  that batch, and of every later one (the rewritten checkpoint is what is committed and
  reloaded), carry no content;
- ``erase_payload`` rewrites one ``events.payload`` (or an ``effect_keys`` value):
  ``ProjectionStore.commit`` applies it, in the batch's transaction, to every stored event of
  the runs the batch found erased, including those of their idempotency keys.

Rejected: leaving the sealed values in place (true, unreadable; but unsealed content would stay
queryable, and an analyst could not tell an erased value from one a reader may not open), and
filtering erased runs out at query time (every reader of the file, ``export`` included, would
have to remember it).

Limit, stated: DuckDB may keep the bytes of rewritten rows in free blocks of the file until they
are reused. Sealed content (the default) was only ever ciphertext there; for content recorded
unsealed, ``runledger project --rebuild`` writes a fresh file.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from runledger.protect.capture import CONTENT_FIELDS, ERROR_TEXT_FIELDS, ERROR_TYPES
from runledger.record.fold import Checkpoint

ERASED: dict[str, Any] = {"$erased": True}
ERASED_TEXT = "«erased»"
# Step kinds whose output is content (the others record structure: an approval's decision,
# a clock reading, a random draw).
_CONTENT_KINDS = frozenset({"model", "tool", "effect", "child"})


def _gone(value: Any) -> Any:
    return None if value is None else ERASED


def _gone_error(error: Any) -> Any:
    if not isinstance(error, dict):
        return error
    return {k: ERASED_TEXT if k in ERROR_TEXT_FIELDS and isinstance(v, str) else v for k, v in error.items()}


def _gone_output(kind: str, output: Any) -> Any:
    if kind not in _CONTENT_KINDS or output is None:
        return output
    if kind == "model" and isinstance(output, dict) and "usage" in output:
        return {**ERASED, "usage": output["usage"]}  # the fold merges usage (structure) into the reply
    return ERASED


def erase_checkpoint(cp: Checkpoint) -> None:
    """Replace the content of ``cp`` (input, output, error texts, step outputs and errors,
    pending approvals' arguments) in place. Idempotent: a value already erased is left as the
    same object, so a step is rewritten only in the batch that erases it."""
    if cp.input is not None and cp.input != ERASED:
        cp.input = ERASED
    if cp.output is not None and cp.output != ERASED:
        cp.output = ERASED
    error = _gone_error(cp.error)
    if error != cp.error:
        cp.error = error
    for step_no, rec in list(cp.steps.items()):
        output, error = _gone_output(rec.kind, rec.output), _gone_error(rec.error)
        if output != rec.output or error != rec.error:
            cp.steps[step_no] = dataclasses.replace(rec, output=output, error=error)
    for request_id, pending in list(cp.pending_approvals.items()):
        if pending.get("args") is not None and pending.get("args") != ERASED:
            cp.pending_approvals[request_id] = {**pending, "args": ERASED}


def erase_payload(type_: str, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` of an event of type ``type_`` with its content fields and error texts erased."""
    out = dict(payload)
    for name in CONTENT_FIELDS.get(type_, ()):
        if out.get(name) is not None:
            out[name] = ERASED
    if type_ in ERROR_TYPES:
        out["error"] = _gone_error(out.get("error"))
    return out


def erased_json(type_: str, text: str) -> str | None:
    """``events.payload`` text with its content erased, or None when there was nothing to erase."""
    payload = json.loads(text)
    if not isinstance(payload, dict):
        return None
    erased = erase_payload(type_, payload)
    return None if erased == payload else json.dumps(erased, ensure_ascii=False, separators=(",", ":"))


def erased_value_json(text: str | None) -> str | None:
    """An ``effect_keys.result`` text erased (SQL NULL and JSON null stay as they are)."""
    if text is None:
        return None
    value = json.loads(text)
    return text if value is None or value == ERASED else json.dumps(ERASED)


def erased_error_json(text: str | None) -> str | None:
    """An ``effect_keys.error`` text (an ErrorInfo) with its message and traceback erased."""
    if text is None:
        return None
    return json.dumps(_gone_error(json.loads(text)), ensure_ascii=False, separators=(",", ":"))
