"""What a ``runledger`` command imports: each command runs through ``runledger.cli.main`` in a fresh
interpreter, which lists the third-party top-level modules the command loaded (not a time: the
modules a command imports are its start-up cost, and a number of milliseconds would depend on the
machine). Used by tests/unit/test_cli_imports.py and tests/integration/test_cli_imports.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# The analytics stack, Docker and the page: only the commands that use them may import them.
HEAVY = frozenset({"duckdb", "pyarrow", "numpy", "pandas", "docker", "starlette", "uvicorn", "jinja2"})
# The core's dependencies (pyproject.toml's [project].dependencies: nats-py, pydantic, msgspec,
# cryptography) and theirs, as top-level modules: all a command that reads or writes the log needs.
CORE = frozenset(
    {"nats", "pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection",
     "msgspec", "cryptography", "cffi"}
)  # fmt: skip

# Runs in the fresh interpreter: argv lists in turn, each through main(); after each, the top-level
# modules it loaded that are neither the standard library's, runledger's nor private ("_cffi_backend",
# "_sysconfigdata_*"). Modules loaded before a command (start-up, this script) are not its.
_SCRIPT = """
import contextlib, io, json, sys
report, commands = sys.argv[1], json.loads(sys.argv[2])
def tops():
    return {m.split(".")[0] for m in sys.modules}
loaded = tops()
from runledger.cli.app import main
results = []
for argv in commands:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    now = tops()
    new = sorted(m for m in now - loaded if m not in sys.stdlib_module_names and not m.startswith("_")
                 and m not in ("runledger", "tests"))
    loaded = now
    results.append({"argv": argv, "code": code, "third_party": new, "out": out.getvalue(), "err": err.getvalue()})
with open(report, "w") as f:
    json.dump(results, f)
"""


@dataclass(frozen=True)
class Imported:
    """One command as it ran: its exit code, output, and the third-party modules it loaded."""

    argv: list[str]
    code: int | None
    third_party: frozenset[str]
    out: str
    err: str


def imported_by(commands: list[list[str]], report: Path, env: dict[str, str] | None = None) -> list[Imported]:
    """Run ``commands`` one after the other in one fresh interpreter (in the repository, so that
    ``tests.agents`` imports): a module is counted for the first command that loaded it. Give each
    command its own call for what it alone imports."""
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(report), json.dumps(commands)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"the interpreter running {commands} failed:\n{done.stderr}"
    rows: list[dict[str, Any]] = json.loads(report.read_text())
    return [Imported(r["argv"], r["code"], frozenset(r["third_party"]), r["out"], r["err"]) for r in rows]
