"""The page's defences against cross-site requests, probed with the session cookie in hand, as an attacker
who got a victim's browser to post would have it: only a form that carries the session's own CSRF token and
comes from the page's own origin acts. Each probe's refusal is checked against an accepted twin, so the
test cannot pass because every post fails. And the headers that keep the page out of caches and frames, and
its cookie out of scripts and cross-site requests."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from http.cookies import SimpleCookie
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.integration.test_ui import ui_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Answer(NamedTuple):
    status: int
    headers: dict[str, str]
    cookies: list[str]
    body: str


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a 303 after an accepted post is the answer to look at


def fetch(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> Answer:
    request = urllib.request.Request(url, data=data, headers=headers or {}, method="POST" if data else "GET")
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=10) as resp:
            status, head, body = int(resp.status), resp.headers, resp.read().decode()
    except urllib.error.HTTPError as exc:
        status, head, body = int(exc.code), exc.headers, exc.read().decode()
    return Answer(status, {k.lower(): v for k, v in head.items()}, head.get_all("Set-Cookie") or [], body)


def prices(base: str, cookie: str) -> str:
    return fetch(f"{base}prices", headers={"Cookie": cookie}).body


def test_only_a_same_origin_post_with_the_sessions_token_acts(nats_url: str, tmp_path: Path) -> None:
    with ui_server(nats_url, tmp_path) as base:
        page = fetch(f"{base}prices")
        assert page.status == 200
        (set_cookie,) = page.cookies
        morsel = next(iter(SimpleCookie(set_cookie).values()))
        cookie = f"{morsel.key}={morsel.value}"
        found = re.search(r'name="csrf" value="([^"]+)"', page.body)
        assert found, page.body
        token = found.group(1)
        origin = base.rstrip("/")
        host = origin.split("://", 1)[1]

        def post(model: str, csrf: str | None, from_origin: str | None) -> Answer:
            form = f"model={model}&input=1&output=2" + (f"&csrf={csrf}" if csrf is not None else "")
            headers = {"Cookie": cookie, "Host": host, "Content-Type": "application/x-www-form-urlencoded"}
            if from_origin is not None:
                headers["Origin"] = from_origin
            return fetch(f"{base}prices", form.encode(), headers)

        probes = {
            "wrong-token": post("m-wrong", "0" * len(token), origin),
            "no-token": post("m-none", None, origin),
            "foreign-origin": post("m-foreign", token, "https://evil.example"),
            "null-origin": post("m-null", token, "null"),
        }
        for name, answer in probes.items():
            assert answer.status == 403, (name, answer)
            assert "refused: the form is stale or came from another site" in answer.body, name
        listed = prices(base, cookie)
        assert not any(f"m-{name.split('-')[0]}" in listed for name in probes), listed

        accepted = post("m-good", token, origin)  # the twin of the probes: the page's own form
        assert accepted.status == 303, accepted
        assert "m-good" in prices(base, cookie)

        # The headers of every answer, refused ones included.
        for answer in (page, accepted, *probes.values()):
            assert answer.headers["cache-control"] == "no-store", answer.headers
            assert answer.headers["x-frame-options"] == "DENY", answer.headers
        attributes = {part.strip().split("=")[0].lower(): part.strip() for part in set_cookie.split(";")[1:]}
        assert "httponly" in attributes, set_cookie
        assert attributes["samesite"].lower() == "samesite=strict", set_cookie
