"""Values as the page shows them: pretty JSON with redaction tokens and content stand-ins visible.

Recorded content reaches the page opened where the viewer's credentials can open it
(``runledger.protect.loading.load_run``); what stays sealed, was recorded hash-only, is stored by
reference or was erased is shown as such, never as its ciphertext. Redaction tokens
(``«redacted:kind:hmac»``) are shown as tokens. Everything is escaped before it is marked up.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from markupsafe import Markup, escape

from runledger.protect.blobs import is_blob_ref
from runledger.protect.capture import is_hashed, is_sealed, is_sealed_text

NONE = "\u2013"  # what an absent value shows: an en dash
_TOKEN = re.compile(r"«(redacted|sealed|erased|hash-only|stored by reference)([^»]*)»")


def stand_in(value: Any) -> Any:
    """``value`` with every content marker replaced by a readable «token»."""
    if is_sealed(value) or is_sealed_text(value):
        return "«sealed: your credentials cannot open it (an analyst's, until an operator grants content)»"
    if is_hashed(value):
        return f"«hash-only: sha256 {str(value.get('$hash'))[:16]}…, {value.get('size')} bytes»"
    if is_blob_ref(value):
        return f"«stored by reference: {value.get('size')} bytes, `runledger show RUN --step N --fetch`»"
    if isinstance(value, dict):
        if value.get("$erased") is True and len(value) == 1:
            return "«erased»"
        return {k: stand_in(v) for k, v in value.items()}
    if isinstance(value, list):
        return [stand_in(v) for v in value]
    if value == "«erased»":
        return value
    return value


def pretty(value: Any) -> Markup:
    """Indented JSON (strings as they are), escaped, with «tokens» marked up."""
    shown = stand_in(value)
    text = shown if isinstance(shown, str) else json.dumps(shown, indent=2, ensure_ascii=False, default=str)
    return mark_tokens(text)


def mark_tokens(text: str) -> Markup:
    escaped = str(escape(text))
    marked = _TOKEN.sub(lambda m: f'<span class="token token-{m.group(1).split()[0]}">{m.group(0)}</span>', escaped)
    return Markup(marked)


def short(value: Any, width: int = 80) -> str:
    shown = stand_in(value)
    text = shown if isinstance(shown, str) else json.dumps(shown, ensure_ascii=False, sort_keys=True, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def usd(value: float | None) -> str:
    if value is None:
        return NONE
    if value == 0:
        return "$0"
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return NONE
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def when(value: Any) -> str:
    """A timestamp as UTC ``YYYY-MM-DD HH:MM:SS``."""
    if value is None or value == "":
        return NONE
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            return str(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
        return str(value.strftime("%Y-%m-%d %H:%M:%S"))
    return str(value)


def conversation(request: Any, response: Any) -> list[dict[str, Any]] | None:
    """A model call as the turns of a conversation (role, content, tool calls), or None when the
    request holds no list of messages (sealed, hash-only, another adapter's shape)."""
    messages = request.get("messages") if isinstance(request, dict) else None
    if not isinstance(messages, list):
        return None
    turns = []
    for message in messages:
        if isinstance(message, dict):
            turns.append({"role": str(message.get("role", "?")), "content": message.get("content"),
                          "tool_calls": message.get("tool_calls")})  # fmt: skip
        else:
            turns.append({"role": "?", "content": message, "tool_calls": None})
    if isinstance(response, dict):
        turns.append({"role": "assistant (response)", "content": response.get("content"),
                      "tool_calls": response.get("tool_calls")})  # fmt: skip
    return turns


FILTERS = {"pretty": pretty, "short": short, "usd": usd, "duration": duration, "when": when, "tokens": mark_tokens}
