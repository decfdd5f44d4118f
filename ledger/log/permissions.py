"""Permission denials, seen as they happen.

NATS tells a client that it may not publish to a subject only asynchronously: the server answers a
forbidden publish with ``-ERR 'Permissions Violation for Publish to "SUBJECT"'``, which nats-py
hands to the connection's error callback, while the publish itself waits for an acknowledgement
that never comes (a JetStream publish then looks like a server timeout: an analyst's ``approve``
took 32 s and advised waiting for the server). ``connect`` feeds every such error to the
connection's ``PermissionWatch``; a publish that may be refused awaits its acknowledgement through
``refused_at_once``, which raises ``PermissionDeniedError`` the moment a denial for its subject
arrives, naming the role, the subject and who may write there.

Rejected: asking the server first (no API answers "may this user publish to X"; the permissions
live in the server config); reading the error text out of the timeout (the publish never learns
it); closing the connection on a denial (nats-py keeps it open, and other work on it is fine).
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import Awaitable
from typing import Any, TypeVar

from runledger.errors import PermissionDeniedError
from runledger.log.subjects import CMD_PREFIX, EFFECT_PREFIX, KEY_BUCKET, RUN_PREFIX

T = TypeVar("T")
# nats-py lower-cases the server's text (the subject too: a denial is matched case-insensitively).
_VIOLATION = re.compile(r"permissions violation for (publish|subscription) to \"?([^\"\s']+)", re.IGNORECASE)
_watches: weakref.WeakKeyDictionary[Any, PermissionWatch] = weakref.WeakKeyDictionary()


def denial(exc: BaseException) -> tuple[str, str] | None:
    """(``Publish`` or ``Subscription``, subject) of a permissions violation handed to ``error_cb``."""
    match = _VIOLATION.search(str(exc))
    return (match.group(1), match.group(2)) if match else None


class PermissionWatch:
    """The permission denials of one connection, with the tasks publishing to each subject.

    A denial cancels the tasks waiting on its subject, marked as denied, and each turns the
    cancellation into PermissionDeniedError (``guard``): no extra task or future a publish, which
    keeps the step's hot path as it was (one dict entry in and out)."""

    def __init__(self, role: str | None, agent: str | None = None, where: str | None = None) -> None:
        self.role = role
        self.agent = agent
        self.where = where  # the folder of this connection's credentials file: where the others are
        self._waiting: dict[str, list[asyncio.Task[Any]]] = {}
        self._denied: set[asyncio.Task[Any]] = set()

    def saw(self, exc: BaseException) -> bool:
        """Take an error from the connection's ``error_cb``; True when it was a permission denial."""
        found = denial(exc)
        if found is None:
            return False
        for task in self._waiting.get(found[1].lower(), ()):
            if task not in self._denied and not task.done():
                self._denied.add(task)
                task.cancel("permission denied")
        return True

    async def guard(self, subject: str, call: Awaitable[T]) -> T:
        """``await call`` (a publish to ``subject``), or raise PermissionDeniedError as soon as the
        server refuses a publish of this connection to ``subject`` (``call`` is then cancelled)."""
        task = asyncio.current_task()
        if task is None:
            return await call
        key = subject.lower()
        waiting = self._waiting.setdefault(key, [])
        waiting.append(task)
        try:
            return await call
        except asyncio.CancelledError:
            if task not in self._denied:
                raise
            self._denied.discard(task)
            task.uncancel()
            raise PermissionDeniedError(subject, self.who(), needed_for(subject, self.where)) from None
        finally:
            waiting.remove(task)
            if not waiting and self._waiting.get(key) is waiting:
                del self._waiting[key]

    def who(self) -> str:
        if self.role is None:
            return "these credentials"
        return f"the {self.role}{f' {self.agent!r}' if self.agent else ''} credentials"


def watch(nc: Any, role: str | None, agent: str | None = None, where: str | None = None) -> PermissionWatch:
    """The watch of connection ``nc`` (made on first use)."""
    found = _watches.get(nc)
    if found is None:
        found = _watches[nc] = PermissionWatch(role, agent, where)
    return found


def watch_of(nc_or_js: Any) -> PermissionWatch | None:
    """The watch of a connection, or of a JetStream context's connection; None when ``connect`` made none."""
    nc = getattr(nc_or_js, "_nc", nc_or_js)
    try:
        return _watches.get(nc)
    except TypeError:  # not weakly referenceable: no connection of ours
        return None


async def refused_at_once(nc_or_js: Any, subject: str, call: Awaitable[T]) -> T:
    """``await call`` (a publish to ``subject``), raising PermissionDeniedError at once on a denial
    when the connection is watched (every ``connect``-made one); plain ``await call`` otherwise."""
    found = watch_of(nc_or_js)
    if found is None:
        return await call
    return await found.guard(subject, call)


def needed_for(subject: str, where: str | None = None) -> str:
    """Who may publish to ``subject`` (docs/data-protection.md's role table), as advice; ``where``:
    the folder of the role credentials files (``runledger up --secure`` prints it)."""
    folder = where or "<credentials folder>"

    def login(user: str) -> str:
        return f"--creds {folder}/{user}.json (or RUNLEDGER_CREDS)"

    parts = subject.split(".")
    if subject.startswith(RUN_PREFIX + ".") and len(parts) == 5:
        agent, writer = parts[2], parts[4]
        if writer == "o":
            return (
                "approvals, budget grants, accepted versions and retries are an operator's decisions: "
                f"connect with the operator's credentials, {login('operator')}"
            )
        if writer == "w":
            return f"only a worker writes branch runs: connect with the worker's credentials, {login('worker')}"
        return f"only agent {agent!r} writes its runs: connect with its credentials, {login('agent-' + agent)}"
    if subject.startswith(EFFECT_PREFIX + ".") and len(parts) == 5:
        agent, writer = parts[2], parts[4]
        if writer == "o":
            return f"resolving an effect is an operator's decision: connect with {login('operator')}"
        return f"only agent {agent!r} claims and settles its keys: connect with {login('agent-' + agent)}"
    if subject.startswith(f"$KV.{KEY_BUCKET}."):
        owner = parts[2] if len(parts) > 2 else "?"
        if owner.startswith("="):
            return f"only a worker creates the keys of the branch runs it writes: {login('worker')}"
        return (
            f"only agent {owner!r} creates the keys of its runs: run agent {owner!r} with its own credentials, "
            f"{login('agent-' + owner)} (`runledger up --secure --agent {owner}` makes them)"
        )
    if subject.startswith(CMD_PREFIX + "."):
        return f"only an operator queues re-runs: connect with {login('operator')}"
    return "ask the server's operator for a role that may publish there (docs/data-protection.md has the table)"
