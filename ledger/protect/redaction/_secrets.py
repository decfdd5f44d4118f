"""Credentials by reference: ``secret://NAME`` resolved where a tool runs, never recorded.

What a reference resolves to is registered with the run's redactor (``on_resolve``), so a tool that
echoes a credential back has it redacted from its output too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runledger.errors import SecretNotFoundError
from runledger.protect.redaction._tokens import SECRET_SCHEME

_SECRET_REF = re.compile(r"secret://([A-Za-z_][A-Za-z0-9_.-]{0,127})")


class SecretResolver:
    """Resolves ``secret://NAME`` references where a tool runs; values never reach the record.

    Looks NAME up, in order, in ``values`` (given in code), the environment
    (``RUNLEDGER_SECRET_<NAME>`` then ``<NAME>``) and a directory of files named after the
    secret (``RUNLEDGER_SECRETS_DIR``, Docker/Kubernetes style, trailing newline stripped).
    Every resolved value is handed to ``on_resolve`` (the run's redactor registers it, so
    a tool that echoes a credential back has it redacted from its output too).
    """

    def __init__(
        self,
        values: Mapping[str, str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        directory: str | Path | None = None,
    ) -> None:
        self._values = dict(values or {})
        self._env = env if env is not None else os.environ
        found_dir = directory or self._env.get("RUNLEDGER_SECRETS_DIR")
        self._dir = Path(found_dir) if found_dir else None
        self.on_resolve: Callable[[str, str], None] | None = None

    def lookup(self, name: str) -> str:
        value = self._values.get(name)
        if value is None:
            value = self._env.get(f"RUNLEDGER_SECRET_{name}") or self._env.get(name)
        if value is None and self._dir is not None:
            path = self._dir / name
            if path.is_file():
                value = path.read_text().rstrip("\n")
        if value is None:
            raise SecretNotFoundError(name, f" in {self._dir}" if self._dir else "")
        if self.on_resolve is not None:
            self.on_resolve(name, value)
        return value

    @staticmethod
    def references(value: Any) -> set[str]:
        """The NAMEs of every ``secret://NAME`` in ``value`` (strings, dict values, lists), resolving
        nothing: what a caller that allows only some names checks before ``resolve``."""
        if isinstance(value, str):
            return set(_SECRET_REF.findall(value)) if SECRET_SCHEME in value else set()
        found: set[str] = set()
        if isinstance(value, dict | list):
            for item in value.values() if isinstance(value, dict) else value:
                found |= SecretResolver.references(item)
        return found

    def resolve(self, value: Any) -> Any:
        """A copy of ``value`` with every ``secret://NAME`` (whole string or inside one) resolved."""
        if isinstance(value, str):
            if SECRET_SCHEME not in value:
                return value
            return _SECRET_REF.sub(lambda m: self.lookup(m.group(1)), value)
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        return value
