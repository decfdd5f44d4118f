"""A role's login: the credentials file ``runledger up --secure`` writes and ``connect`` reads.

The roles and their permissions are data protection's (``runledger.protect.roles``); what a
connection needs to log in belongs to the log, which must not import data protection.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from runledger.errors import ConfigurationError


@dataclass(frozen=True)
class RoleCredentials:
    """One user's credentials file (JSON): what ``runledger.log.client.connect`` needs to log in."""

    role: str
    user: str
    password: str
    inbox_prefix: str
    url: str = ""
    agent: str | None = None

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self), f, indent=2, sort_keys=True)
            f.write("\n")
        return path

    @classmethod
    def read(cls, path: str | Path) -> RoleCredentials:
        try:
            data = json.loads(Path(path).read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigurationError(f"{path} is not a runledger credentials file: {exc}") from exc
