"""Who is looking at the page, and what they may do.

Against a server without logins (``runledger up``) every visitor is the local operator: the
page's own connection, every action. Against a secure server (``runledger up --secure``) a
visitor signs in with a role's credentials file (``runledger.protect.roles``); the page opens a
NATS connection with those credentials for that visitor, so every read and every write is the
server's decision as well as the page's: an analyst reads everything and acts on nothing, an
agent reads only its own runs, an operator or admin may also decide approvals, resolve effects
and queue re-runs. The page refuses a forbidden action itself (a permission violation surfaces
in nats-py only as a timeout), and the server would refuse it again.

Sessions are in memory (a restart signs everyone out) and named by a random cookie
(``HttpOnly``, ``SameSite=Strict``). Each session holds a CSRF token that every form posts back;
a POST without the session's token, or from another origin, is refused.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from runledger.errors import ConfigurationError, LedgerError
from runledger.log.client import LedgerClient, connect
from runledger.log.credentials import RoleCredentials

COOKIE = "runledger_session"
ACTING_ROLES = frozenset({"operator", "admin", "local"})
SESSION_IDLE_S = 12 * 3600.0


@dataclass
class Viewer:
    """A signed-in role (or the local operator) with the connection it reads and acts through."""

    user: str
    role: str  # agent | analyst | operator | worker | admin | local (a server without logins)
    client: LedgerClient
    agent: str | None = None  # an agent user's agent: it sees only that agent's runs
    owns_client: bool = False  # a signed-in viewer's own connection, closed on sign-out

    @property
    def can_act(self) -> bool:
        """May decide approvals, resolve effects, queue re-runs and set prices."""
        return self.role in ACTING_ROLES

    def may_read(self, agent: str | None) -> bool:
        return self.agent is None or agent == self.agent


@dataclass
class Session:
    id: str
    csrf: str
    viewer: Viewer | None = None
    flash: list[str] = field(default_factory=list)
    seen: float = field(default_factory=time.monotonic)


class SessionStore:
    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}

    def get(self, session_id: str | None) -> Session | None:
        session = self._sessions.get(session_id or "")
        if session is None:
            return None
        if time.monotonic() - session.seen > SESSION_IDLE_S:
            self._sessions.pop(session.id, None)
            return None
        session.seen = time.monotonic()
        return session

    def new(self) -> Session:
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32))
        self._sessions[session.id] = session
        return session

    async def sign_out(self, session: Session) -> None:
        viewer, session.viewer = session.viewer, None
        session.csrf = secrets.token_urlsafe(32)
        if viewer is not None and viewer.owns_client:
            await viewer.client.close()

    async def close(self) -> None:
        for session in list(self._sessions.values()):
            await self.sign_out(session)
        self._sessions.clear()


def csrf_ok(session: Session, token: str | None) -> bool:
    return bool(token) and hmac.compare_digest(session.csrf.encode(), str(token).encode())


def parse_credentials(text: str) -> RoleCredentials:
    """A role's credentials file as pasted or uploaded. Raises ConfigurationError."""
    try:
        data: Any = json.loads(text)
        return RoleCredentials(**data)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(
            "that is not a runledger credentials file (the JSON `runledger up --secure` writes, one per role)"
        ) from exc


async def sign_in(url: str, text: str) -> Viewer:
    """A viewer logged in to ``url`` with the credentials in ``text``. Raises LedgerError when the
    server refuses them (a wrong password, a file of another server)."""
    login = parse_credentials(text)
    try:
        client = await asyncio.wait_for(
            connect(url, ensure=False, user=login.user, password=login.password, inbox_prefix=login.inbox_prefix),
            timeout=15,
        )
    except (LedgerError, OSError, TimeoutError) as exc:
        raise LedgerError(f"the server refused the credentials of {login.user!r}: {exc}") from exc
    except Exception as exc:  # nats-py's authorization errors are not all under one base
        raise LedgerError(f"the server refused the credentials of {login.user!r}: {type(exc).__name__}") from exc
    return Viewer(login.user, login.role, client, agent=login.agent, owns_client=True)
