"""Which sandboxes a process owns on the engine (other processes may share the engine)."""

from __future__ import annotations

from typing import Any

from runledger.sandbox.containers import LABEL


def containers_of(docker: Any, *pids: int) -> list[str]:
    """Ids of runledger sandboxes owned by any of ``pids`` on this engine.

    The low-level list: ``containers.list()`` inspects each container after listing and
    raises NotFound for one removed in between."""
    owners = {str(pid) for pid in pids}
    found = docker.api.containers(all=True, filters={"label": LABEL})
    return [c["Id"] for c in found if (c.get("Labels") or {}).get(f"{LABEL}.owner", "").rpartition(":")[2] in owners]
