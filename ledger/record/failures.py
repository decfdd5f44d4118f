"""Classes of failure: the signature that groups failed runs, and the decision a failure came from.

A failed run's **signature** is four things, each recorded as structure:

1. the error type of its ``run.failed`` (``ValueError``, ``ToolFailedError``...);
2. the kind and 3. the name of its failing step (``run.failed``'s ``step``: the call that raised, or the
   last recorded step when the agent's own code raised after it): ``tool 'quote'``, ``model 'gpt-4o'``;
4. the **shape** of its error message: the message with its numbers, ids, hex digests, quoted values and
   redaction tokens masked (``mask_message``: ``unknown currency 'franc' for trip TR-007 at 321.0`` is
   ``unknown currency <str> for trip TR-<n> at <n>``), digested (``message_shape``).

Its **class id** is the first 12 hex digits of the sha256 of the four (``failure_signature``): runs with one
class id failed the same way, whatever values their messages carried.

The message is content (sealed under the run's key by default), so the shape is computed where the
message is plain: by the run itself as it fails (``run.failed``'s ``message_shape``, a digest like an
``args_digest``), and, for a run recorded before that field existed, from the recorded message when it
is readable (not sealed). A run whose shape is neither recorded nor readable has the empty shape: its
class is its error type and failing step alone. Every reader takes the class from ``failure_signature``:
the projection's ``runs.failure_class`` (runledger.projections), ``runledger failures``, the page, and
``--class ID`` through the projection.

The **decision** of a run (``decision_step``) is the last model call at or before its failing step (for
a run that did not fail, its last model call): where a change to the model or the prompt can first
change what the run did. The in-process replayer goes live from it (runledger.testing.replayer).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runledger.record.fold import Checkpoint

CLASS_ID_LENGTH = 12
_MAX_MASKED = 400

# In order: each rule sees what the ones before left. Placeholders are <...>, which no later rule matches.
_MASKS: list[tuple[re.Pattern[str], str]] = [
    # redaction tokens and content stand-ins: «redacted:kind:hmac», «sealed:...», «erased»
    (re.compile(r"«[^»]{0,400}»"), "<secret>"),
    # a quoted value: a quote not inside a word ("can't" is no quote) up to the same quote, not followed
    # by a word character
    (re.compile(r"(?<![\w'\"])(['\"])(?:(?!\1)[^\n]){0,300}\1(?!\w)"), "<str>"),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<id>"),
    # a hex digest (8 or more hex digits, at least one of them a digit)
    (re.compile(r"\b(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{8,}\b"), "<hex>"),
    # an id: 8 or more word characters or dashes with both letters and digits (a ULID, order-8891, run_42abc)
    (re.compile(r"(?<![\w<-])(?=[\w-]*[0-9])(?=[\w-]*[A-Za-z])[A-Za-z0-9][\w-]{7,}(?![\w-])"), "<id>"),
    # a number: integers, decimals, dotted (1.2.3, 127.0.0.1), exponents, a sign
    (re.compile(r"(?:(?<![\w.])[-+])?\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
]


def mask_message(message: str) -> str:
    """``message`` with its numbers, ids, hex digests, quoted values and redaction tokens replaced by
    ``<n>``, ``<id>``, ``<hex>``, ``<str>``, ``<secret>``; white space collapsed, at most 400 characters."""
    text = message
    for pattern, placeholder in _MASKS:
        text = pattern.sub(placeholder, text)
    return text.strip()[:_MAX_MASKED]


def message_shape(message: str) -> str:
    """The shape of an error message: sha256 hex of ``mask_message(message)``."""
    return hashlib.sha256(mask_message(message).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class FailureSignature:
    """What a failed run's class is made of (see the module docstring), and its ``class_id``.

    ``shape`` is the message's shape (``""`` when neither recorded nor readable); ``message`` the masked
    message when the caller gave a readable one (for display; never part of the id)."""

    class_id: str
    error_type: str
    step: int | None
    step_kind: str
    step_name: str
    shape: str
    message: str | None = None

    @property
    def where(self) -> str:
        """The failing step as people read it: ``tool 'quote'``, or ``the run`` when it has none."""
        return f"{self.step_kind} {self.step_name!r}" if self.step_kind else "the run"


def class_id(error_type: str, step_kind: str, step_name: str, shape: str) -> str:
    """The class id of a signature: 12 hex digits of the sha256 of its four parts."""
    joined = "\x1f".join((error_type, step_kind, step_name, shape))
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()[:CLASS_ID_LENGTH]


def failure_signature(cp: Checkpoint, message: str | None = None) -> FailureSignature | None:
    """The signature of a failed run from its checkpoint (None when the run did not fail).

    ``message``: the run's error message when the caller can read it (a plain recorded message, or one
    opened with the run's key), else None; used for the shape only when the run recorded none."""
    if cp.status != "failed":
        return None
    error = cp.error or {}
    error_type = str(error.get("type") or "")
    step = cp.failed_step if isinstance(cp.failed_step, int) else None
    rec = cp.steps.get(step) if step is not None else None
    kind, name = (rec.kind, rec.name) if rec is not None else ("", "")
    shape = cp.failure_shape or (message_shape(message) if isinstance(message, str) else "")
    masked = mask_message(message) if isinstance(message, str) else None
    return FailureSignature(class_id(error_type, kind, name, shape), error_type, step, kind, name, shape, masked)


def decision_step(cp: Checkpoint) -> int | None:
    """The decision of a run: its last model call at or before its failing step (``run.failed``'s step; for
    a run that did not fail, or failed with no step, its last step), or None when there is none."""
    until = cp.failed_step if cp.status == "failed" and isinstance(cp.failed_step, int) else cp.last_step
    models = [s for s, rec in cp.steps.items() if rec.kind == "model" and s <= until]
    return max(models) if models else None
