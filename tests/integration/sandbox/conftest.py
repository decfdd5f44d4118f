"""Sandbox fixtures: the real Docker engine and the sandbox image. They fail, never skip,
when Docker is missing (`deploy/dev.sh test` installs and starts it).

The image is built before the tests (`deploy/dev.sh test`: minutes on a new machine, outside any test's
time limit); the fixtures only find the image of this very code, and fail naming the command that
builds it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient
from runledger.sandbox.containers import SandboxPolicy, SandboxPool
from runledger.sandbox.image import docker_client, find_image
from runledger.sandbox.rerun import Rerunner
from tests.integration.sandbox.owned import containers_of

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")


@pytest.fixture(scope="session")
def docker() -> Any:
    return docker_client()


@pytest.fixture(scope="session")
def sandbox_image(docker: Any) -> str:
    return find_image(docker)


@pytest.fixture
async def pool(docker: Any, sandbox_image: str) -> AsyncIterator[SandboxPool]:
    p = SandboxPool(docker, SandboxPolicy(image=sandbox_image, timeout_s=20), size=0)
    try:
        yield p
    finally:
        await p.close()
        leftovers = containers_of(docker, os.getpid())
        assert leftovers == [], "a sandbox container was left behind"


@pytest.fixture
def rerunner(client: LedgerClient, pool: SandboxPool) -> Rerunner:
    return Rerunner(client, pool)


@pytest.fixture
def payments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PaymentsService]:
    service = PaymentsService(tmp_path / "payments.log").start()
    monkeypatch.setenv("REFUND_PAYMENTS_URL", service.url)
    monkeypatch.setenv("REFUND_OUTBOX", str(tmp_path / "outbox"))
    monkeypatch.setenv("TEST_PAYMENTS_LOG", str(tmp_path / "pay.log"))
    try:
        yield service
    finally:
        service.stop()
