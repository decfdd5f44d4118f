"""`runledger sandbox build` and the image `runledger/sandbox:latest` names, with real builds: a build
without `--extra` after one with it keeps the extras (a LangGraph agent's re-runs still find
LangGraph), `--no-extras` drops them. The decisions one by one: tests/unit/test_image_extras.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from docker import errors as docker_errors

from runledger.sandbox.image_extras import EXTRAS_LABEL, LATEST, latest_extras

pytestmark = [pytest.mark.integration, pytest.mark.docker]


def _build(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "runledger", "sandbox", "build", *args], capture_output=True, text=True, timeout=1500
    )
    assert done.returncode == 0, f"runledger sandbox build {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _tag(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture
def latest_restored(docker: Any) -> Iterator[None]:
    """The machine's `latest` as it was before the test (the builds below move it)."""
    before = docker.images.get(LATEST).id if _exists(docker) else None
    try:
        yield
    finally:
        if before is not None:
            docker.images.get(before).tag("runledger/sandbox", "latest")


def _exists(docker: Any) -> bool:
    try:
        docker.images.get(LATEST)
    except docker_errors.ImageNotFound:
        return False
    return True


@pytest.mark.timeout(1800)
def test_a_plain_build_keeps_the_extras_of_latest(docker: Any, sandbox_image: str, latest_restored: None) -> None:
    with_extras = _tag(_build("--extra", "langgraph"))
    assert with_extras != sandbox_image
    assert docker.images.get(with_extras).labels[EXTRAS_LABEL] == "langgraph"
    assert docker.images.get(LATEST).id == docker.images.get(with_extras).id

    plain = _build()
    assert _tag(plain) == with_extras  # the same core image, so the same extras layer, reused
    assert "keeps the extras it held (langgraph)" in plain.stderr
    assert docker.images.get(LATEST).id == docker.images.get(with_extras).id
    assert latest_extras(docker) == ["langgraph"]

    bare = _build("--no-extras")
    assert _tag(bare) == sandbox_image
    assert "keeps the extras" not in bare.stderr
    assert docker.images.get(LATEST).id == docker.images.get(sandbox_image).id
    assert latest_extras(docker) == []
