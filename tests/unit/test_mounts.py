"""Where the sandbox mounts an agent's top-level package from (runledger.sandbox.containers)."""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

import pytest

from runledger.sandbox import containers
from runledger.sandbox.errors import RerunRequestError


def _namespace(*places: Path) -> importlib.machinery.ModuleSpec:
    spec = importlib.machinery.ModuleSpec("deploy", None, is_package=True)
    spec.submodule_search_locations = [str(p) for p in places]
    return spec


def test_a_namespace_package_found_twice_in_one_folder_mounts_that_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`deploy.compose.smoke_agent` run from the checkout: '' and the working directory both find deploy/
    (a folder without __init__.py), listed twice, once relative. It is one folder, mounted once."""
    (tmp_path / "deploy").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(containers, "find_module", lambda unit: _namespace(tmp_path / "deploy", Path("deploy")))
    assert containers._host_location("deploy") == str((tmp_path / "deploy").resolve())


def test_a_package_in_two_folders_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containers, "find_module", lambda unit: _namespace(tmp_path / "a", tmp_path / "b"))
    with pytest.raises(RerunRequestError, match="spreads over 2 folders"):
        containers._host_location("deploy")
