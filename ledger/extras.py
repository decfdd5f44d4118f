"""The optional parts of runledger and what each needs: checked before a feature is used.

The core (``pip install runledger``) is what an agent needs to publish and resume. Analysts add
``[projections]`` (DuckDB, pyarrow), operators and workers ``[sandbox]`` (the Docker SDK). A
command or import that needs a missing extra raises ``MissingExtraError`` naming the one line
that installs it, instead of a ``ModuleNotFoundError`` from deep inside.
"""

from __future__ import annotations

import functools
import importlib.util

from runledger.errors import MissingExtraError

MODULES_OF_EXTRA: dict[str, tuple[str, ...]] = {
    "projections": ("duckdb", "msgspec", "pyarrow", "pytz"),
    "sandbox": ("docker", "duckdb", "msgspec", "pyarrow", "pytz"),
    "ui": ("starlette", "uvicorn", "jinja2", "docker", "duckdb", "msgspec", "pyarrow", "pytz"),
    # Namespace packages: the dotted module each distribution installs.
    "langgraph": ("langgraph", "langgraph.checkpoint", "langchain_core"),
    "otel": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http", "opentelemetry.proto"),
    "openai": ("openai",),
    "pydantic-ai": ("pydantic_ai",),
    "mcp": ("mcp",),
    "agent-framework": ("agent_framework",),
    "openai-agents": ("agents",),
}

# The sub-commands of a package that cannot even be imported without its extra, so that calling
# one names the extra (tests/unit/test_extras.py checks this against what the packages register).
COMMANDS_OF_EXTRA: dict[str, tuple[str, ...]] = {
    "projections": ("export", "failures", "project", "quarantine", "sql"),
    "ui": ("ui",),
}


@functools.cache
def _missing(extra: str) -> str | None:
    for module in MODULES_OF_EXTRA[extra]:
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except ModuleNotFoundError:  # a dotted name whose parent package is not installed either
            return module
    return None


def require_extra(extra: str, feature: str) -> None:
    """Raise ``MissingExtraError`` unless every module of ``extra`` can be imported."""
    missing = _missing(extra)
    if missing is not None:
        raise MissingExtraError(extra, feature, missing)
