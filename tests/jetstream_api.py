"""Every JetStream API subject a role could send, and what docs/data-protection.md says each role may.

One model for two tests: tests/unit/test_jetstream_api_doc.py holds the doc's table ("The JetStream
API, role by role") to the permissions ``runledger.protect.roles`` gives each role, and
tests/integration/test_jetstream_api.py holds a real server started with ``--secure`` to the same
permissions, sending every call here with each role's own credentials.

A *call* is one API subject: a template of the doc's table (``CONSUMER.CREATE.<stream>.<name>.<filter>``)
with its placeholders filled, for each stream and, where a permission can tell them apart, each
*scope*: ``own`` (the agent's own runs, keys and run keys, where ``other`` is another agent's),
``queue`` (the work queue's consumer, ``rerun-workers``, where another name is not),
``metadata`` (a blob's metadata, where ``chunk`` is its body). A cell of the table lists the
streams a role may send a row's calls for, each with the scope it is limited to in brackets, or
``(granted)`` for what only an analyst granted content may; ``yes`` for a row without a stream,
``all`` for every call, ``—`` for none.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runledger.log.memory import subject_matches
from runledger.log.subjects import BLOB_BUCKET, CMD_STREAM, KEY_BUCKET, KEY_STREAM, LEDGER_STREAM, RERUN_CONSUMER
from runledger.protect.roles import permissions

DOC = Path(__file__).resolve().parents[1] / "docs" / "data-protection.md"
TABLE_BEGIN, TABLE_END = "<!-- jetstream-api: read by tests/jetstream_api.py -->", "<!-- /jetstream-api -->"
BLOB_STREAM = f"OBJ_{BLOB_BUCKET}"
STREAMS = (LEDGER_STREAM, BLOB_STREAM, KEY_STREAM, CMD_STREAM)
ROLES = ("agent-NAME", "analyst", "operator", "worker", "admin")
AGENT = "alpha"  # the agent whose login sends the calls; "other" is another agent
# Where a push consumer a probe tries to create would deliver: another user's inbox (outside every
# stream's subjects, so the server's own check, a delivery into the consumer's stream, does not refuse it).
DELIVER_TO = "_INBOX_operator.stolen"
_SCOPED = {"own", "queue", "metadata"}


@dataclass(frozen=True)
class Call:
    """One API subject (``subject``) of a row (``template``), for ``stream`` and ``scope``."""

    template: str
    stream: str | None
    scope: str
    subject: str
    payload: bytes


def _filters(stream: str) -> list[tuple[str, str]]:
    """(scope, subject filter) of a stream's probes: a consumer's filter, a direct get's subject."""
    if stream == LEDGER_STREAM:
        return [("own", f"ledger.run.{AGENT}.r1.a"), ("own", f"ledger.effect.{AGENT}.k1.a"),
                ("other", "ledger.run.other.r1.a"), ("other", "ledger.effect.other.k1.a")]  # fmt: skip
    if stream == KEY_STREAM:
        return [("own", f"$KV.{KEY_BUCKET}.{AGENT}.r1"), ("other", f"$KV.{KEY_BUCKET}.other.r1")]
    if stream == BLOB_STREAM:
        return [("metadata", f"$O.{BLOB_BUCKET}.M.probe"), ("chunk", f"$O.{BLOB_BUCKET}.C.probe")]
    return [("", "ledger.cmd.rerun")]


def _names(stream: str) -> list[tuple[str, str]]:
    """(scope, consumer name) of a stream's probes."""
    return [("queue", RERUN_CONSUMER), ("", "probe")] if stream == CMD_STREAM else [("", "probe")]


def _push(stream: str, name: str | None = None, subject_filter: str | None = None) -> bytes:
    """A consumer's create request that makes it a push consumer delivering to ``DELIVER_TO``."""
    config: dict[str, Any] = {
        "deliver_subject": DELIVER_TO,
        "ack_policy": "explicit",
        "inactive_threshold": 5_000_000_000,
    }
    if name:
        config["name"] = name
    if subject_filter:
        config["filter_subject"] = subject_filter
    return json.dumps({"stream_name": stream, "config": config}).encode()


# The harmless request each template sends (the server must not change anything a test relies on).
_PAYLOADS: dict[str, Any] = {
    "STREAM.PURGE.<stream>": {"filter": f"$O.{BLOB_BUCKET}.C.nothing-stored-here"},
    "STREAM.MSG.GET.<stream>": {"seq": 1},
    "STREAM.MSG.DELETE.<stream>": {"seq": 999_999_999},
    "DIRECT.GET.<stream>": {"seq": 1, "batch": 2},
    "CONSUMER.MSG.NEXT.<stream>.<name>": {"batch": 1, "no_wait": True},
    "CONSUMER.RESET.<stream>.<name>": {"seq": 1},
}


def _expand(template: str) -> list[Call]:
    """The calls of one template (``$JS.API.`` implied, but for the ``$JS.ACK``/``$JS.FC`` rows)."""
    full = template if template.startswith("$JS.") else f"$JS.API.{template}"
    if "<stream>" not in full:
        return [Call(template, None, "", full.replace("<account>", "$G"), b"")]
    calls: list[Call] = []
    for stream in STREAMS:
        base = full.replace("<stream>", stream)
        if "<filter>" in base or "<subject>" in base:
            for scope, subject in _filters(stream):
                if "<filter>" in base:
                    for name_scope, name in _names(stream):
                        joined = "queue" if name_scope == "queue" and stream == CMD_STREAM else scope
                        subj = base.replace("<name>", name).replace("<filter>", subject)
                        calls.append(Call(template, stream, joined, subj, _push(stream, name, subject)))
                else:
                    calls.append(Call(template, stream, scope, base.replace("<subject>", subject), b""))
        elif "<name>" in base:
            for scope, name in _names(stream):
                subj = base.replace("<name>", name).replace("…", "1.1.1.1.1")
                payload = (
                    _push(stream, name) if ".CREATE." in base else json.dumps(_PAYLOADS.get(template, {})).encode()
                )
                calls.append(Call(template, stream, scope, subj, payload))
        else:
            payload = (
                _push(stream) if template.startswith("CONSUMER.CREATE") else json.dumps(_PAYLOADS.get(template, {}))
            )
            calls.append(Call(template, stream, "", base, payload if isinstance(payload, bytes) else payload.encode()))
    return calls


def doc_table() -> dict[str, dict[str, str]]:
    """The doc's table: each row's first cell (its templates) to its cells by role."""
    text = DOC.read_text()
    assert TABLE_BEGIN in text and TABLE_END in text, f"{DOC.name} lost its markers of the JetStream API table"
    rows: dict[str, dict[str, str]] = {}
    header: list[str] = []
    for line in text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.strip().startswith("|") or set(line) <= set("|-: "):
            continue
        if not header:
            header = [c.strip("`") for c in cells[1:]]
            assert header == list(ROLES), f"the table's columns are {header}, not {list(ROLES)}"
            continue
        rows[cells[0]] = dict(zip(ROLES, cells[1:], strict=True))
    return rows


def templates(first_cell: str) -> list[str]:
    """The templates of a row's first cell (``STREAM.CREATE.<stream>``, ``...``: code spans)."""
    return re.findall(r"`([^`]+)`", first_cell)


def calls() -> list[Call]:
    """Every call of every row of the doc's table."""
    return [call for row in doc_table() for template in templates(row) for call in _expand(template)]


def doc_allows(cell: str, call: Call, *, granted: bool = False) -> bool:
    """Whether a cell of the table lets its role send ``call`` (``granted``: an analyst granted content)."""
    if cell == "all":
        return True
    if cell in ("—", "-", ""):
        return False
    if cell == "yes":
        return call.stream is None
    for entry in (e.strip() for e in cell.split(",")):
        match = re.fullmatch(r"`([A-Z_]+)`(?: \((.+)\))?", entry)
        assert match, f"a cell entry must be `STREAM` or `STREAM` (scope), not {entry!r}"
        stream, qualifier = match.group(1), (match.group(2) or "").strip("`")
        assert stream in STREAMS, f"no stream {stream!r} in the cell {cell!r}"
        if stream != call.stream:
            continue
        if not qualifier:
            return True
        if qualifier == "granted":
            return granted
        assert qualifier in _SCOPED | {RERUN_CONSUMER}, f"unknown scope {qualifier!r} in {cell!r}"
        return call.scope == ("queue" if qualifier == RERUN_CONSUMER else qualifier)
    return False


def permitted(role: str, subject: str, *, granted: bool = False) -> bool:
    """Whether ``runledger.protect.roles.permissions`` lets ``role`` publish to ``subject``."""
    perms = permissions(role, AGENT if role == "agent" else None, content=granted)["publish"]
    allowed = any(subject_matches(p, subject) for p in perms["allow"])
    return allowed and not any(subject_matches(p, subject) for p in perms.get("deny", []))
