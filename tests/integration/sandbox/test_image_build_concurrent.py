"""Two `runledger sandbox build` at once on one engine (two checkouts of one user, a test and a bench):
both succeed with the same image; the later one waits for the earlier and reuses what it built, and the
wheel cache they share is filled once, never half. Real builds, into a scratch repository
($RUNLEDGER_SANDBOX_REPO) removed afterwards, so the machine's runledger/sandbox tags stay as they were."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.docker]


@pytest.fixture
def scratch_repo(docker: Any) -> Iterator[str]:
    repo = f"runledger-test/concurrent-{uuid.uuid4().hex[:8]}"
    try:
        yield repo
    finally:
        for image in docker.images.list(name=repo):
            for tag in image.tags:
                if tag.startswith(f"{repo}:"):
                    docker.images.remove(tag)  # the tag only, where the image is the machine's own build too


@pytest.mark.timeout(600)
def test_two_concurrent_builds_both_succeed_and_the_later_reuses(
    docker: Any, sandbox_image: str, scratch_repo: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"  # one user's home, shared by both checkouts: a new, empty wheel cache
    env = {**os.environ, "RUNLEDGER_HOME": str(home), "RUNLEDGER_SANDBOX_REPO": scratch_repo}
    builds = []
    for checkout in ("a", "b"):
        (tmp_path / checkout).mkdir()
        builds.append(subprocess.Popen(
            [sys.executable, "-m", "runledger", "sandbox", "build", "--no-extras"], cwd=tmp_path / checkout,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    outputs = [build.communicate(timeout=540) for build in builds]
    for build, (out, err) in zip(builds, outputs, strict=True):
        assert build.returncode == 0, f"a concurrent build failed:\n{out}\n{err}"
    tags = {out.strip().splitlines()[-1] for out, _ in outputs}
    assert len(tags) == 1, outputs
    (tag,) = tags
    assert tag.startswith(f"{scratch_repo}:")
    assert docker.images.get(tag).id == docker.images.get(f"{scratch_repo}:latest").id
    # The same code as the tests' image: the same package inside (its source label).
    source = docker.images.get(sandbox_image).labels["runledger.source"]
    assert docker.images.get(tag).labels["runledger.source"] == source

    waited = [err for _, err in outputs if "another sandbox image build is running" in err]
    assert len(waited) == 1, [err for _, err in outputs]
    assert "is built for this code already: reused" in waited[0], waited[0]
    built = [err for _, err in outputs if err not in waited]
    assert f"built {tag} in " in built[0], built[0]

    caches = sorted(p.name for p in (home / "wheels").iterdir())
    assert len(caches) == 1 and (home / "wheels" / caches[0] / ".complete").exists(), caches  # no partial left
