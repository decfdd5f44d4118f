"""Whether a re-run's candidate loads in the sandbox image: asked by ``rerun --plan`` before anything is queued.

A candidate is any importable code (``--agent`` or ``--set agent=MODULE:ATTR``): a fix in a package
of its own that imports the original, a shared utility module, another layout. The sandbox receives
its import closure (``runledger.sandbox.containers.code_mounts``: each top-level package or module of
the agent's project it imports, read-only) and nothing of the host's site-packages, so a candidate that
imports a package the image lacks, or a module loaded by a name the closure cannot see
(``importlib.import_module(text)``), loads on the host and fails in the sandbox. The plan finds out the
only certain way: it starts a hardened sandbox of the worker's image with exactly those mounts, lets
the guest load the agent (its import and factory, no step of a re-run) and reads what the guest's
hello reports (``preloaded``): the error, or the ``agent_version`` the guest computes over the
mounted code, which must be the host's.

Rejected: checking imports statically against the image's file list (misses the factory, optional
imports and anything a module does at import); loading the candidate on the host only (it sees the
host's site-packages, which the sandbox never gets).
"""

from __future__ import annotations

from typing import Any

from runledger.sandbox.containers import CodeMounts, SandboxPool, code_mounts
from runledger.sandbox.errors import RerunRequestError
from runledger.sdk.agent import AgentSpec


async def check_in_image(pool: SandboxPool, spec: AgentSpec, ref: str) -> str | None:
    """None when the agent ``ref`` (``spec`` is what it loads to on the host) loads in a sandbox of
    ``pool``'s image and has the same ``agent_version`` there; else why a re-run of it would fail.
    Raises SandboxError when no sandbox can be started."""
    try:
        code = code_mounts(spec.fn, ref)
    except RerunRequestError as exc:
        return str(exc)
    return judge_load(await pool.probe(code, ref), spec, ref, code, pool.policy.image)


def judge_load(report: dict[str, Any], spec: AgentSpec, ref: str, code: CodeMounts, image: str) -> str | None:
    """What a guest's report of loading ``ref`` (its hello's ``preloaded``) says against the host's
    ``spec``: None when it loaded as the same ``agent_version``, else why a re-run of it fails. The
    re-run judges its own sandbox's report the same way (``Rerunner.rerun``: ``Refusal.IMAGE``)."""
    mounted = ", ".join(guest for _, guest in code)
    if "error" in report:
        return (
            f"{ref} does not load in the sandbox image {image}: {report['error']}. The sandbox gets "
            f"the candidate's import closure ({mounted}) and the image's packages, never the host's: an installed "
            "package it needs belongs in the image (`runledger sandbox build --extra NAME`), a module it loads by "
            "a computed name must be imported by name"
        )
    expected = spec.version().agent_version
    if report.get("agent_version") != expected:
        return (
            f"{ref} loads in the sandbox image but is another version there ({report.get('agent_version')!r}; on "
            f"this host {expected!r}): a module it imports was not mounted ({mounted}) or differs in the image"
        )
    return None
