"""The sandbox image with the packages of runledger extras, for agents that import them.

The sandbox image holds the core's dependencies only (runledger.sandbox.image). An agent built on
a framework (a LangGraph graph: ``runledger.integrations.langgraph``) imports the framework in the
guest, so ``runledger sandbox build --extra langgraph`` adds a layer on top of that image: wheels
of the extra's requirements for the image's Python, downloaded on the host (pip, cached under
``$RUNLEDGER_HOME/wheels``) and unpacked where the core's are, built with ``--network=none``. The
extra's own packages are pinned to the versions installed on the host (the guest loads values the
host recorded), and every package the image already holds keeps its version.

``runledger/sandbox:latest`` (what ``rerun`` and ``worker`` use) keeps its extras: each extras image
carries the label ``runledger.extras`` (the extras it holds), and a later ``runledger sandbox build``
without ``--extra`` builds the same extras on the new core image and says so, so rebuilding the
core after an upgrade does not leave a LangGraph agent's re-runs without LangGraph
(``--no-extras`` builds the core image alone). ``--extra`` names the extras outright.

Rejected: a second ``site`` directory for the layer (the containers' ``PYTHONPATH`` names the
image's one directory) and installing the extras into the base image (one image per set of
extras would rebuild the core's layer each time).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from runledger.log.server import runledger_home
from runledger.sandbox.errors import ImageError
from runledger.sandbox.image import (
    EXTRAS_LABEL,
    IMAGE_REPO,
    LATEST,
    build_image,
    build_lock,
    build_offline,
    docker_client,
    download_wheels,
    guest_wheels,
    has_image,
    image_python,
)

DOCKERFILE = """\
ARG BASE
FROM ${BASE}
USER root
COPY wheels/ /tmp/extra-wheels/
RUN set -e; \\
    python3 -c 'import glob, pathlib, shutil, zipfile; S = pathlib.Path("/opt/runledger/site"); \\
S.mkdir(parents=True, exist_ok=True); \\
[zipfile.ZipFile(w).extractall(S) for w in sorted(glob.glob("/tmp/extra-wheels/*.whl"))]; \\
[shutil.copytree(p, S, dirs_exist_ok=True) for p in S.glob("*.data/*lib")]; \\
[shutil.rmtree(p) for p in S.glob("*.data")]'; \\
    rm -rf /tmp/extra-wheels; \\
    python3 -m compileall -q /opt/runledger/site; \\
    chmod -R a+rX,go-w /opt/runledger
USER sandbox
"""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extra_requirements(extra: str) -> list[str]:
    """The requirements of runledger's ``extra``, each of the extra's own packages pinned to the
    version installed here when it is installed. Raises ImageError for an extra runledger lacks."""
    wanted: list[str] = []
    pattern = re.compile(r"""extra\s*==\s*["']""" + re.escape(extra) + r"""["']""")
    for requirement in importlib.metadata.requires("runledger") or []:
        spec, _, marker = requirement.partition(";")
        if not pattern.search(marker):
            continue
        name = _NAME.match(spec.strip())
        if name is None or _normalized(name.group(0)) == "runledger":
            continue  # an extra made of other extras names no package of its own
        try:
            wanted.append(f"{name.group(0)}=={importlib.metadata.version(name.group(0))}")
        except importlib.metadata.PackageNotFoundError:
            wanted.append(spec.strip())
    if not wanted:
        raise ImageError(f"runledger has no extra {extra!r} with packages of its own (see pyproject.toml)")
    return wanted


def _pins(core: Path) -> list[str]:
    """``name==version`` of every wheel the core image holds (a wheel's file name starts with both)."""
    pins = []
    for wheel in sorted(core.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        pins.append(f"{_normalized(name)}=={version}")
    return pins


def _extra_wheels(python_version: str, requirements: Sequence[str], core: Path) -> list[Path]:
    """Wheels of ``requirements`` for ``python_version`` that the core image does not hold."""
    key = hashlib.sha256("\n".join([*requirements, *_pins(core)]).encode()).hexdigest()[:12]
    cache = download_wheels(
        runledger_home() / "wheels" / f"{python_version}-extras-{key}", python_version, requirements,
        "the extras' wheels", constraints=_pins(core),
    )  # fmt: skip
    held = {w.name for w in core.glob("*.whl")}
    return sorted(w for w in cache.glob("*.whl") if w.name not in held)


def build_extras_image(base_tag: str, extras: Sequence[str], log: Callable[[str], None] | None = None) -> str:
    """``base_tag`` (a sandbox image built by ``build_image``) with the packages of ``extras``; returns
    its tag (``runledger/sandbox:<digest>``, reused when it exists). Raises ImageError."""
    log = log or (lambda message: None)
    with build_lock(log):
        client = docker_client()
        python_version = image_python(client, base_tag)
        requirements = sorted({r for extra in extras for r in extra_requirements(extra)})
        wheels = _extra_wheels(python_version, requirements, guest_wheels(python_version))
        base_id = client.images.get(base_tag).id
        # The names were checked by extra_requirements: runledger's own extras, no quote among them.
        dockerfile = DOCKERFILE + f'LABEL {EXTRAS_LABEL}="{",".join(sorted(set(extras)))}"\n'
        content = "\n".join([base_id, dockerfile, *(w.name for w in wheels)])
        tag = f"{IMAGE_REPO}:{hashlib.sha256(content.encode()).hexdigest()[:16]}"
        if has_image(client, tag):
            log(f"{tag} ({base_tag} with {', '.join(extras)}) is built already: reused")
            return tag
        ctx = Path(tempfile.mkdtemp(prefix="runledger-image-extras-"))
        try:
            (ctx / "Dockerfile").write_text(dockerfile)
            (ctx / "wheels").mkdir()
            for wheel in wheels:
                shutil.copy(wheel, ctx / "wheels" / wheel.name)
            log(f"building {tag}: {base_tag} with {', '.join(extras)} ({len(wheels)} wheels)")
            started = time.monotonic()
            build_offline(client, ctx, tag, base_tag, "docker build of the extras' layer")
            log(f"built {tag} in {time.monotonic() - started:.0f}s")
            return tag
        finally:
            shutil.rmtree(ctx, ignore_errors=True)


def latest_extras(client: Any) -> list[str]:
    """The extras ``runledger/sandbox:latest`` holds (its ``runledger.extras`` label): none when it
    is the core image, or when there is no such image yet."""
    if not has_image(client, LATEST):
        return []
    label = (client.images.get(LATEST).labels or {}).get(EXTRAS_LABEL, "")
    return [name for name in label.split(",") if name]


def build_sandbox_image(
    base: str | None = None,
    extras: Sequence[str] = (),
    *,
    keep_extras: bool = True,
    log: Callable[[str], None] | None = None,
) -> tuple[str, list[str]]:
    """What ``runledger sandbox build`` does: build (or reuse) the core image, then the layer of
    ``extras``, or, when none are given and ``keep_extras``, of the extras ``runledger/sandbox:latest``
    held; tag the result ``latest`` once it is built (a failed build leaves ``latest`` as it was).
    Returns the tag and the extras kept from the previous ``latest`` (empty unless that decided them).
    Raises ImageError."""
    log = log or (lambda message: None)
    with build_lock(log):  # another build's `latest` must not land between this one's decision and its tag
        client = docker_client()
        kept = [] if extras or not keep_extras else latest_extras(client)
        tag = build_image(base, log=log, latest=False)
        if extras or kept:
            try:
                tag = build_extras_image(tag, list(extras) or kept, log=log)
            except ImageError as exc:
                if extras:
                    raise
                raise ImageError(
                    f"{IMAGE_REPO}:latest holds the extras {', '.join(kept)}, kept by a build without --extra: {exc}. "
                    "Build without them (`runledger sandbox build --no-extras`) or name the extras (`--extra NAME`)"
                ) from exc
        client.images.get(tag).tag(IMAGE_REPO, "latest")
        return tag, kept
