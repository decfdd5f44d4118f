"""The SQL a page shows works with the extras the page installs: every part of README.md and
docs/*.md that shows SQL (a ``sql`` block, ``runledger sql``, ``project`` or ``export``, all of the
``[projections]`` extra) installs ``[projections]`` in its ``pip install`` line, directly or
through an extra that depends on it (pyproject.toml). A part runs from one fenced ``pip install
'runledger[...]'`` line to the next, so a page on several integrations is judged section by
section. Nothing runs: the text and pyproject.toml only.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
INSTALL = re.compile(r"^pip install '?runledger\[([a-z0-9,-]+)\]'?")
SQL = re.compile(r"^```sql|`?runledger (sql|project|export)\b")


def _extras() -> dict[str, set[str]]:
    """Each extra and the extras it brings (itself included), from pyproject.toml."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    direct = {
        name: {x for dep in deps for m in re.finditer(r"runledger\[([a-z0-9,-]+)\]", dep) for x in m[1].split(",")}
        for name, deps in declared.items()
    }

    def closure(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        found = {name}
        for other in direct.get(name, set()) - seen:
            found |= closure(other, seen | {name})
        return found

    return {name: closure(name) for name in declared}


def _parts(path: Path) -> list[tuple[int, set[str], bool]]:
    """``(line, extras installed, shows SQL)`` for each part of ``path`` that opens with an install line."""
    parts: list[tuple[int, set[str], bool]] = []
    fenced, last_install = False, -1
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```") and not line.lstrip().startswith("```sql"):
            fenced = not fenced
            continue
        found = INSTALL.match(line.strip()) if fenced else None
        if found and number == last_install + 1:  # a run of install lines (README's list) is one part
            parts[-1][1].update(found[1].split(","))
        elif found:
            parts.append((number, set(found[1].split(",")), False))
        last_install = number if found else last_install
        if parts and SQL.search(line.strip()):
            parts[-1] = (parts[-1][0], parts[-1][1], True)
    return parts


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_a_part_that_shows_sql_installs_the_projections_extra(path: Path) -> None:
    extras = _extras()
    for line, installed, shows_sql in _parts(path):
        brought = set().union(*(extras.get(name, {name}) for name in installed))
        assert not shows_sql or "projections" in brought, (
            f"{path.name}:{line} installs runledger[{','.join(sorted(installed))}], but the part it opens shows "
            "SQL (`runledger sql`, `project`, `export`, a sql block), which needs [projections]: add it to the line"
        )
