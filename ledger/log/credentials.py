"""A role's login: the credentials file ``runledger up --secure`` writes and ``connect`` reads.

The roles and their permissions are data protection's (``runledger.protect.roles``); what a
connection needs to log in belongs to the log, which must not import data protection.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from runledger.errors import ConfigurationError
from runledger.log.private import private_dir, write_private


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
        """Write the file, mode 0600 (whatever the umask, and also over an existing file), in a 0700 directory."""
        if not path.parent.exists():
            private_dir(path.parent)
        return write_private(path, json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def read(cls, path: str | Path) -> RoleCredentials:
        try:
            data = json.loads(Path(path).read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigurationError(f"{path} is not a runledger credentials file: {exc}") from exc
