"""Classes of failure as the projection holds them: ``runledger failures``, ``--class ID``, the page.

The projector writes each failed run's class (``runs.failure_class`` and the parts it is made of) with
``runledger.record.failures.failure_signature``; the ``failure_classes`` view groups the recorded runs
(branches are re-runs of them, not failures of their own) by class and agent. Everything here reads that
view, so the CLI, a sweep's ``--class`` and the page see one set of classes and never compute another.

A class's message is shown masked (``mask_message``: numbers, ids, digests and quoted values replaced)
when the projection can read it: never, under the default data policy, unless the caller opens content
(``runledger failures --content``, runledger.projections.content); else it says the message is sealed.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from runledger.errors import ConfigurationError
from runledger.protect.capture import is_placeholder
from runledger.record.failures import CLASS_ID_LENGTH, mask_message

_CLASS_ID = re.compile(rf"^[0-9a-f]{{{CLASS_ID_LENGTH}}}$")

_SELECT = """
SELECT class_id, agent, error_type, step_kind, step_name, runs, first_seen, last_seen, example_runs, last_message
FROM failure_classes {where}
ORDER BY runs DESC, last_seen DESC, class_id
"""


@dataclass(frozen=True)
class FailureClass:
    """One class of failure of one agent's recorded runs (a row of the ``failure_classes`` view).

    ``message``: the last failure's message, masked, or None when it is sealed (not opened)."""

    class_id: str
    agent: str
    error_type: str
    step_kind: str
    step_name: str
    runs: int
    first_seen: dt.datetime | None
    last_seen: dt.datetime | None
    example_runs: list[str]
    message: str | None

    @property
    def where(self) -> str:
        """The failing step as people read it: ``tool 'quote'``, or ``the run``."""
        return f"{self.step_kind} {self.step_name!r}" if self.step_kind else "the run"

    def to_dict(self) -> dict[str, Any]:
        return {
            "class_id": self.class_id, "agent": self.agent, "error_type": self.error_type,
            "step_kind": self.step_kind or None, "step_name": self.step_name or None, "runs": self.runs,
            "first_seen": _iso(self.first_seen), "last_seen": _iso(self.last_seen),
            "example_runs": list(self.example_runs), "message": self.message,
        }  # fmt: skip


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def check_class_id(class_id: str) -> str:
    """``class_id`` when it is one (12 lowercase hex digits), else ConfigurationError saying where ids come from."""
    if not _CLASS_ID.match(class_id or ""):
        raise ConfigurationError(
            f"--class {class_id!r} is not a class of failure: give the {CLASS_ID_LENGTH} hex digits "
            "`runledger failures` prints (or the page's Failures list shows)"
        )
    return class_id


def class_condition(class_id: str) -> str:
    """The condition over ``runs`` that selects the failed runs of class ``class_id`` (checked first)."""
    return f"status = 'failed' AND failure_class = '{check_class_id(class_id)}'"


def classes_query(*, agent: str | None = None, class_id: str | None = None) -> tuple[str, list[Any]]:
    """The statement (and its parameters) reading the classes of failure of recorded runs, the most frequent
    first (one agent's, one class, when given): for a connection of one's own or the page's follower."""
    clauses, params = list[str](), list[Any]()
    if agent:
        clauses, params = [*clauses, "agent = ?"], [*params, agent]
    if class_id:
        clauses, params = [*clauses, "class_id = ?"], [*params, check_class_id(class_id)]
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    return _SELECT.format(where=where), params


def failure_classes(con: Any, *, agent: str | None = None, class_id: str | None = None) -> list[FailureClass]:
    """The classes of failure of recorded runs on a DuckDB connection (``classes_query``)."""
    sql, params = classes_query(agent=agent, class_id=class_id)
    return classes_of(con.execute(sql, params).fetchall())


def classes_of(rows: list[tuple[Any, ...]]) -> list[FailureClass]:
    """The rows of ``classes_query`` as classes."""
    return [_row(tuple(row)) for row in rows]


def _row(row: tuple[Any, ...]) -> FailureClass:
    cid, agent, error_type, kind, name, runs, first, last, examples, message = row
    readable = isinstance(message, str) and not is_placeholder(message)
    return FailureClass(
        str(cid), str(agent or ""), str(error_type or ""), str(kind or ""), str(name or ""), int(runs), first, last,
        [str(r) for r in examples or []], mask_message(message) if readable else None,
    )  # fmt: skip


def render_classes(classes: list[FailureClass]) -> str:
    """The classes as ``runledger failures`` prints them."""
    if not classes:
        return "no failed recorded runs: no classes of failure"
    total = sum(c.runs for c in classes)
    lines = [f"{len(classes)} classes of failure in {total} failed runs (recorded runs; branches are not counted)"]
    for c in classes:
        lines += [
            "",
            f"class {c.class_id}  {c.runs} runs of {c.agent}, first {_iso(c.first_seen)}, last {_iso(c.last_seen)}",
            f"  {c.error_type} at {c.where}: "
            + (c.message if c.message is not None else "(message sealed: --content opens it)"),
            f"  e.g. {', '.join(c.example_runs)}",
        ]
    lines += [
        "",
        "re-drive a class: runledger rerun --class CLASS --agent MODULE:ATTR --mode counterfactual --set ... "
        "(the gate and the matrix take --class too)",
    ]
    return "\n".join(lines)
