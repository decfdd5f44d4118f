"""The CLI's entry points, cached between calls (runledger.cli.registry): the same answer as
``importlib.metadata``, read again whenever the environment may have changed, and never trusted
when the cache file is not this environment's or not whole."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import runledger.cli.registry as registry
from runledger.cli.registry import GROUPS, Registered, registered


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[int]]:
    """A cache of its own for the test; counts the reads of the distributions' metadata."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    count: list[int] = []
    real = registry._from_metadata

    def counted() -> dict[str, list[Registered]]:
        count.append(1)
        return real()

    monkeypatch.setattr(registry, "_from_metadata", counted)
    yield count


def _cache_file() -> Path:
    [path] = registry.cache_dir().glob("entry-points-*.json")
    return path


def test_the_answer_is_importlib_metadata_s_sorted_by_name(reads: list[int]) -> None:
    for group in GROUPS:
        expected = sorted((ep.name, ep.value) for ep in entry_points(group=group))
        assert [(r.name, r.value) for r in registered(group)] == expected
    commands = {r.name: r for r in registered("runledger.commands")}
    assert commands["ledger"].load() is __import__("runledger.cli", fromlist=["register"]).register
    assert Registered("x", "runledger.cli.registry:Registered.load").load() is Registered.load


def test_metadata_is_read_once_then_the_cache_answers(reads: list[int]) -> None:
    first = registered("runledger.commands")
    assert registered("runledger.commands") == first and registered("runledger.export")
    assert len(reads) == 1, "the second and third calls read the metadata again instead of the cache"


def test_an_installed_or_removed_distribution_is_seen_at_the_next_call(
    reads: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    registered("runledger.commands")
    registered("runledger.commands")
    assert len(reads) == 1
    # pip adds (or removes) a *.dist-info folder: the folder's modification time changes.
    (site / "plugin-1.0.dist-info").mkdir()
    os.utime(site, ns=(os.stat(site).st_atime_ns, os.stat(site).st_mtime_ns + 1_000_000))
    registered("runledger.commands")
    assert len(reads) == 2, "a changed sys.path folder must make the next call read the metadata again"


def test_a_cache_of_another_environment_or_broken_is_ignored(reads: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    truth = registered("runledger.commands")
    path = _cache_file()
    data = json.loads(path.read_text())
    data["groups"]["runledger.commands"] = [["ledger", "someone.else:register"]]
    data["key"][1] = "/another/python"
    path.write_text(json.dumps(data))
    assert registered("runledger.commands") == truth
    for broken in ("", "{", '{"key": 1}', json.dumps({"key": registry.environment_key(), "groups": {}})):
        path.write_text(broken)
        assert registered("runledger.commands") == truth
    assert len(reads) == 6


def test_an_unwritable_cache_only_costs_the_metadata_read(reads: list[int], monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:  # fmt: skip
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert registered("runledger.commands") == registered("runledger.commands")
    assert len(reads) == 2
