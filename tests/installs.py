"""Install this repository as a user does: build its wheel, pip-install it into a fresh venv, and
run the venv's own ``runledger`` and ``python`` from a directory outside the checkout, with an
environment that cannot reach the checkout (no PYTHONPATH, no dev venv on PATH).

Used by tests/integration/test_install.py and tests/integration/sandbox/test_image_install.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Left out of the copy the wheel is built from: VCS, environments, caches and earlier builds
# (setuptools' build/lib keeps files deleted since, and would put them in the wheel).
_NOT_SOURCE = {".git", ".venv", "build", ".build", "dist", ".runledger"}


def _ignore(directory: str, names: list[str]) -> set[str]:
    ignored = {n for n in names if n == "__pycache__" or n.endswith((".pyc", ".egg-info")) or n.endswith("_cache")}
    if Path(directory) == REPO:
        ignored |= _NOT_SOURCE & set(names)
    return ignored


def build_wheel(workdir: Path) -> Path:
    """The wheel of the repository as it is on disk (work in progress included), built from a copy
    so that the build leaves nothing in the checkout. The copy stays in ``workdir/source``."""
    source = workdir / "source"
    shutil.copytree(REPO, source, ignore=_ignore)
    dist = workdir / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (wheel,) = dist.glob("runledger-*.whl")
    return wheel


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that points into the checkout or at a server."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONSAFEPATH", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("RUNLEDGER_")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and not Path(p).resolve().is_relative_to(REPO)
    )
    return {**env, **extra}


@dataclass(frozen=True)
class Venv:
    """A virtual environment with runledger installed from its wheel."""

    root: Path
    workdir: Path  # where its programs run: outside the checkout

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name

    def env(self, **extra: str) -> dict[str, str]:
        env = clean_env(**extra)
        env["PATH"] = os.pathsep.join([str(self.root / "bin"), env["PATH"]])
        env["VIRTUAL_ENV"] = str(self.root)
        return env

    def run(
        self, program: str, *args: str, timeout: float = 120, cwd: Path | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """Run ``program`` of the venv (``runledger``, ``python``) to completion."""
        return subprocess.run(
            [str(self.bin(program)), *args],
            cwd=cwd or self.workdir, env=self.env(**env), capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def python(self, code: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return self.run("python", "-c", code, timeout=timeout, **env)

    def popen(self, program: str, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.bin(program)), *args],
            cwd=self.workdir, env=self.env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def site_packages(self) -> Path:
        done = self.python("import sysconfig; print(sysconfig.get_paths()['purelib'])")
        assert done.returncode == 0, done.stderr
        return Path(done.stdout.strip())


def make_venv(root: Path, requirement: str, workdir: Path, *more: str) -> Venv:
    """A fresh venv (from the interpreter running the tests) with ``requirement`` (and ``more``)
    pip-installed in one resolution; dependencies come from the package index as configured on this machine."""
    created = subprocess.run([sys.executable, "-m", "venv", str(root)], capture_output=True, text=True, timeout=300)
    assert created.returncode == 0, f"python -m venv failed: {created.stderr}"
    made = Venv(root, workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    done = made.run("python", "-m", "pip", "install", "-q", requirement, *more, timeout=900)
    assert done.returncode == 0, (
        f"pip install {' '.join([requirement, *more])} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return made


def servers_of(home: Path) -> list[int]:
    """Pids of live nats-servers started for ``home``: their command line names its config file."""
    config = str(home / "nats-server.conf")
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            if config.encode() in cmdline and state != "Z":
                found.append(int(proc.name))
    return found


def kill_servers_of(home: Path) -> list[int]:
    """SIGKILL what ``servers_of(home)`` finds (our own servers only); returns their pids."""
    pids = servers_of(home)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids
