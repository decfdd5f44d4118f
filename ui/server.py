"""Serving the page: bind the socket first (port 0 picks a free one), then hand it to uvicorn.

Binding here, not in uvicorn, lets ``runledger ui`` print the real address before serving, and
makes the loopback default explicit: the page listens on 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import webbrowser
from collections.abc import Callable

import uvicorn

from runledger.ui.app import UIConfig, create_app


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def page_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def serve(config: UIConfig, port: int, *, open_browser: bool = False, announce: Callable[[str], None] = print) -> None:
    """Serve until interrupted. ``announce`` is told the page's URL once it is bound."""
    sock = bind(config.host, port)
    url = page_url(sock)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config), log_level="warning", access_log=False, timeout_graceful_shutdown=2, lifespan="on"
        )
    )

    async def run() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            announce(url)
            if open_browser:
                with contextlib.suppress(webbrowser.Error):
                    webbrowser.open(url)
        await task

    try:
        asyncio.run(run())
    finally:
        sock.close()
