"""Which image ``runledger sandbox build`` makes ``runledger/sandbox:latest``: a build without
``--extra`` after one with it keeps the extras (rebuilt on the new core image), ``--no-extras``
drops them, and a build that fails leaves ``latest`` where it was. The Docker engine and the
builds are stand-ins here; tests/integration/sandbox/test_image_install.py builds real images."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import docker.errors
import pytest

from runledger.sandbox import image_extras
from runledger.sandbox.errors import ImageError
from runledger.sandbox.image_extras import EXTRAS_LABEL, LATEST, build_sandbox_image, latest_extras


class _Image:
    def __init__(self, engine: _Engine, labels: dict[str, str]) -> None:
        self.engine = engine
        self.labels = labels

    def tag(self, repo: str, tag: str) -> None:
        self.engine.tags[f"{repo}:{tag}"] = self


class _Engine:
    """The image part of a Docker client: tags naming images."""

    def __init__(self) -> None:
        self.tags: dict[str, _Image] = {}
        self.images = self

    def get(self, tag: str) -> _Image:
        if tag not in self.tags:
            raise docker.errors.ImageNotFound(tag)
        return self.tags[tag]


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> _Engine:
    engine = _Engine()
    core = {"n": 0}

    def build_image(base: str | None = None, log: Any = None, *, latest: bool = True) -> str:
        assert latest is False  # build_sandbox_image tags latest itself, once everything is built
        core["n"] += 1
        tag = f"runledger/sandbox:core{core['n']}"
        engine.tags[tag] = _Image(engine, {})
        return tag

    def build_extras_image(base_tag: str, extras: Sequence[str], log: Any = None) -> str:
        if "broken" in extras:
            raise ImageError("downloading the extras' wheels failed")
        tag = f"{base_tag}-{'-'.join(sorted(extras))}"
        engine.tags[tag] = _Image(engine, {EXTRAS_LABEL: ",".join(sorted(extras))})
        return tag

    monkeypatch.setattr(image_extras, "docker_client", lambda: engine)
    monkeypatch.setattr(image_extras, "build_image", build_image)
    monkeypatch.setattr(image_extras, "build_extras_image", build_extras_image)
    return engine


def _latest(engine: _Engine) -> _Image:
    return engine.get(LATEST)


def test_a_first_build_makes_the_core_image_latest(engine: _Engine) -> None:
    assert latest_extras(engine) == []
    tag, kept = build_sandbox_image()
    assert (tag, kept) == ("runledger/sandbox:core1", [])
    assert _latest(engine) is engine.get(tag)


def test_a_plain_build_after_an_extras_build_keeps_the_extras(engine: _Engine) -> None:
    first, _ = build_sandbox_image(extras=["langgraph"])
    assert latest_extras(engine) == ["langgraph"]
    tag, kept = build_sandbox_image()
    assert kept == ["langgraph"]
    assert tag == "runledger/sandbox:core2-langgraph"  # the extras rebuilt on the new core image
    assert _latest(engine) is engine.get(tag) and tag != first
    assert latest_extras(engine) == ["langgraph"]


def test_no_extras_builds_the_core_image_alone(engine: _Engine) -> None:
    build_sandbox_image(extras=["langgraph"])
    tag, kept = build_sandbox_image(keep_extras=False)
    assert (tag, kept) == ("runledger/sandbox:core2", [])
    assert _latest(engine) is engine.get(tag)
    assert latest_extras(engine) == []


def test_named_extras_replace_those_of_latest(engine: _Engine) -> None:
    build_sandbox_image(extras=["langgraph"])
    tag, kept = build_sandbox_image(extras=["otel"])
    assert kept == []
    assert latest_extras(engine) == ["otel"] and _latest(engine) is engine.get(tag)


def test_a_failed_build_leaves_latest_where_it_was(engine: _Engine) -> None:
    before, _ = build_sandbox_image(extras=["langgraph"])
    with pytest.raises(ImageError):
        build_sandbox_image(extras=["broken"])
    assert _latest(engine) is engine.get(before)


def test_kept_extras_this_runledger_cannot_build_say_how_to_build_without_them(engine: _Engine) -> None:
    # Another checkout (or version) built latest with an extra this one cannot build: the plain build
    # says which extras it kept and the two ways out, and leaves latest as it was.
    engine.tags[LATEST] = before = _Image(engine, {EXTRAS_LABEL: "broken"})
    with pytest.raises(ImageError) as refused:
        build_sandbox_image()
    message = str(refused.value)
    assert "holds the extras broken" in message and "--no-extras" in message and "--extra NAME" in message
    assert _latest(engine) is before
