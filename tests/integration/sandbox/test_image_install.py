"""`runledger sandbox build` from an installed package, not only from the checkout.

The wheel is installed with its ``[sandbox]`` extra into a fresh venv and its ``runledger`` runs
outside the repository (tests/installs.py), so nothing can come from the checkout. The image tag is
a hash of the build's content: the installed package must put the same files in the image as the
checkout does, and so build the very same tag.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runledger.sandbox.image import build_image, ensure_base, image_python
from tests.installs import REPO, Venv, build_wheel, clean_env, make_venv

pytestmark = [pytest.mark.integration, pytest.mark.docker]


@dataclass(frozen=True)
class Installed:
    venv: Venv
    snapshot: Path  # the copy of the checkout the wheel was built from
    checkout_tag: str  # what the checkout's build_image() built from the same files


@pytest.fixture(scope="module")
def installed(docker: Any, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A fresh venv with ``pip install '<wheel>[sandbox]'``, and the checkout's image of the same moment
    (built right after the wheel, so that edits to the tree in the meantime are unlikely)."""
    wheel_dir = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(wheel_dir)
    checkout_tag = build_image(log=lambda m: None)
    root = tmp_path_factory.mktemp("sandbox-install")
    venv = make_venv(root / "venv", f"{wheel}[sandbox]", workdir=root / "work")
    return Installed(venv, wheel_dir / "source", checkout_tag)


@pytest.mark.timeout(1800)
def test_the_installed_package_builds_the_sandbox_image_the_checkout_builds(
    docker: Any, installed: Installed, tmp_path: Path
) -> None:
    venv, home = installed.venv, str(tmp_path / "home")
    where = venv.python("import runledger.sandbox.image as m; print(m.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(venv.root), where.stdout + where.stderr

    # Its own RUNLEDGER_HOME: the guest's wheels are downloaded by the installed package, not reused.
    # --no-extras: the core image, whatever extras the image runledger/sandbox:latest names holds.
    built = venv.run("runledger", "sandbox", "build", "--no-extras", timeout=1500, RUNLEDGER_HOME=home)
    assert built.returncode == 0, f"runledger sandbox build failed:\n{built.stdout}\n{built.stderr}"
    assert "Traceback" not in built.stderr
    tag = built.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"runledger/sandbox:[0-9a-f]{16}", tag), built.stdout
    assert docker.images.get(tag).id == docker.images.get("runledger/sandbox:latest").id

    from_checkout = installed.checkout_tag
    if tag != from_checkout:
        python_version = image_python(docker, ensure_base(docker, None, log=lambda m: None))
        pytest.fail(
            f"the installed package built {tag}, the checkout {from_checkout}: they put different files into "
            f"the image.\n{_difference(installed, home, python_version)}"
        )

    # What the guest needs is in the image, what it must not carry is not.
    probe = docker.containers.run(
        tag,
        ["python3", "-c",
         "import importlib.util as u, runledger, runledger.sdk.protocol, runledger.record.fold\n"
         "import runledger.sandbox.guest\n"
         "print(runledger.__file__, [m for m in ('runledger.cli', 'runledger.projections', 'duckdb', 'docker')"
         " if u.find_spec(m) is not None])"],
        network_mode="none", remove=True,
    )  # fmt: skip
    assert probe.decode().split() == ["/opt/runledger/runledger/__init__.py", "[]"], probe


# -- when the tags differ: which files, and why ----------------------------------------------------------

CONTEXT_FILES = """
import hashlib, json, shutil, sys
import runledger.sandbox.image as image
ctx = image._context(sys.argv[1])[0]
try:
    print(json.dumps({str(p.relative_to(ctx)): hashlib.sha256(p.read_bytes()).hexdigest()
                      for p in ctx.rglob("*") if p.is_file()}))
finally:
    shutil.rmtree(ctx)
"""


def _checkout_path(context_path: str) -> str | None:
    """The checkout's file behind a file of the build context (runtime/runledger/... is the package)."""
    parts = context_path.split("/")
    if parts[:2] != ["runtime", "runledger"]:
        return None
    inner = parts[2:]
    if inner[0] in ("sandbox", "integrations", "examples", "projections"):
        return "/".join(inner)
    return "/".join(["ledger", *inner])


def _difference(installed: Installed, home: str, python_version: str) -> str:
    mine = installed.venv.run("python", "-c", CONTEXT_FILES, python_version, RUNLEDGER_HOME=home)
    theirs = subprocess.run(
        [sys.executable, "-c", CONTEXT_FILES, python_version],
        env=clean_env(**{k: v for k, v in os.environ.items() if k == "RUNLEDGER_HOME"}),  # as build_image() had it
        cwd=installed.venv.workdir, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if mine.returncode or theirs.returncode:
        return f"(cannot list the build contexts: {mine.stderr[-1000:]}{theirs.stderr[-1000:]})"
    a, b = json.loads(mine.stdout), json.loads(theirs.stdout)
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    moved = []
    for path in differ:
        source = _checkout_path(path)
        if source is not None:
            then, now = installed.snapshot / source, REPO / source
            if (then.read_bytes() if then.exists() else None) != (now.read_bytes() if now.exists() else None):
                moved.append(source)
    lines = [f"  {k}: installed {'has it' if k in a else 'lacks it'}, checkout {'has it' if k in b else 'lacks it'}"
             + ("" if k not in a or k not in b else ", contents differ") for k in differ]  # fmt: skip
    note = (
        f"\nof these, {moved} changed in the checkout since the wheel was built (someone edited the tree "
        "while the test ran): run it again on a quiet tree"
        if moved
        else "\nthe checkout did not change since the wheel was built: the package and the checkout differ"
    )
    return "files of the build contexts that differ:\n" + "\n".join(lines) + note
