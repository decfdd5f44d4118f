"""docs/architecture.md's module tables against the folders, as test_wire_doc checks the wire doc:
every library module has a row, and every row names a module (or package) that exists.

The tables live under "What each module owns", one per folder, each after a bold heading that names
its folder (``**Core (`ledger/`)**``); a row's first cell names paths relative to that folder. A
private module (``_scan.py``, or one inside a private package) needs no row of its own when a row
names its package folder (``protect/redaction/``): the package's row owns what its private modules
do. ``__init__.py`` and ``__main__.py`` are their package's.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
FOLDERS = ("ledger", "projections", "sandbox", "integrations", "ui", "examples")
SECTION = "## What each module owns"


def listed() -> dict[str, str]:
    """Path (from the repository root; a package ends in ``/``) -> the line that lists it."""
    text = DOC.read_text()
    assert SECTION in text, f"docs/architecture.md lost its section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    found: dict[str, str] = {}
    folder: str | None = None
    for line in section.splitlines():
        heading = re.match(r"^\*\*[^*]*\(`([\w/]+?)/?`\)\*\*", line)
        if heading:
            folder = heading.group(1)
            continue
        row = re.match(r"^\|\s*(`[^|]*?)\s*\|", line)
        if row and folder:
            for name in re.findall(r"`([\w/.]+)`", row.group(1)):
                found[f"{folder}/{name}"] = line
    return found


def _private(path: Path) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in path.with_suffix("").parts)


def library_modules() -> list[Path]:
    return sorted(
        p.relative_to(REPO)
        for folder in FOLDERS
        for p in (REPO / folder).rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
    )


def _covered(module: Path, rows: dict[str, str]) -> bool:
    if module.as_posix() in rows:
        return True
    if not _private(module):
        return False
    return any(f"{parent.as_posix()}/" in rows for parent in module.parents)


def test_every_library_module_has_a_row() -> None:
    rows = listed()
    missing = [m.as_posix() for m in library_modules() if not _covered(m, rows)]
    assert missing == [], (
        "modules docs/architecture.md does not list (add a row under its folder's table in "
        f"'{SECTION[3:]}'; a private module may be covered by its package's row `pkg/`):\n" + "\n".join(missing)
    )


def test_every_row_names_a_module_that_exists() -> None:
    stale = [
        f"{path}  ({line.strip()[:80]})"
        for path, line in listed().items()
        if not ((REPO / path).is_dir() if path.endswith("/") else (REPO / path).is_file())
    ]
    assert stale == [], "docs/architecture.md lists modules that do not exist:\n" + "\n".join(stale)


def test_every_folder_has_a_table() -> None:
    folders = {path.split("/", 1)[0] for path in listed()}
    assert folders >= set(FOLDERS), f"no module table for {sorted(set(FOLDERS) - folders)}"


def test_every_path_the_doc_names_exists() -> None:
    """Beyond the tables: a file named in the prose (`sdk/lifecycle.py::open_run`) exists, from the
    repository root or from one of the folders (the doc drops `ledger/` for the core's paths)."""
    named = set(re.findall(r"`([\w.-]+/[\w./-]+\.py)(?:::[\w.]+)?`", DOC.read_text()))
    gone = sorted(p for p in named if not any((REPO / base / p).is_file() for base in ("", *FOLDERS)))
    assert gone == [], "docs/architecture.md names files that do not exist:\n" + "\n".join(gone)
