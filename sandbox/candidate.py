"""The code a re-run runs, its candidate: code edited in place since the record, and whether it loads in
the sandbox image (asked by ``rerun --plan`` before anything is queued).

**Code edited in place** (``resolve_in_place``). What everyone does first with a failure is to edit the
agent and re-run the failure. The code ``--agent`` names is then not the code that recorded the run:
its ``agent_version`` (the code hash of its import closure, or a new declared version) differs from the
record. A re-drive or live re-run of it is the counterfactual of the agent element, and says so
(``agent code changed: code:ab12 -> code:cd34``, ``describe_change``): a new run (a branch) whose
``run.forked`` records the change, no ``--accept-version`` needed. ``resume``, which continues the same
run, keeps refusing other code (``runledger.sdk.lifecycle``): accepting a version is a decision about
that run, a branch is an experiment beside it. The candidate is the working tree's code, mounted as any
candidate is. Edited code that also changes the model, the prompt or the tool schemas, or a change on
top of it (``--set model=`` with edited code), would change two elements: refused (``Refusal.VERSION``),
saying which.

Rejected: refusing and pointing at ``--accept-version`` (the old behaviour): accepting is an operator's
decision to let that same run continue, and a failed run has nothing to continue (``nothing to do``); a
copy of the package under a new name, which worked, is a detour no user takes first.

**Whether it loads in the image.** A candidate is any importable code (``--agent`` or ``--set
agent=MODULE:ATTR``): a fix in a package of its own that imports the original, a shared utility module,
another layout. The sandbox receives its import closure (``runledger.sandbox.containers.code_mounts``:
each top-level package or module of the agent's project it imports, read-only) and nothing of the host's
site-packages, so a candidate that imports a package the image lacks, or a module loaded by a name the
closure cannot see (``importlib.import_module(text)``), loads on the host and fails in the sandbox. The
plan finds out the only certain way: it starts a hardened sandbox of the worker's image with exactly
those mounts, lets the guest load the agent (its import and factory, no step of a re-run) and reads what
the guest's hello reports (``preloaded``): the error, or the ``agent_version`` the guest computes over
the mounted code, which must be the host's.

Rejected: checking imports statically against the image's file list (misses the factory, optional
imports and anything a module does at import); loading the candidate on the host only (it sees the
host's site-packages, which the sandbox never gets).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runledger.record.fold import Checkpoint
from runledger.record.versions import differing, identity
from runledger.sandbox.containers import CodeMounts, SandboxPool, code_mounts
from runledger.sandbox.errors import Refusal, RerunRequestError
from runledger.sdk.agent import AgentSpec

if TYPE_CHECKING:
    from runledger.sandbox.rerun import RerunRequest

CHANGEABLE = ("model", "prompt", "agent", "tools")
# The version-tuple element each ``--set NAME=`` changes.
ELEMENTS = {"model": "model", "prompt": "prompt_hash", "agent": "agent_version", "tools": "tool_schema_hashes"}


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


def describe_change(changed: str | None, before: Any, after: Any) -> str:
    """One line for a branch's change: ``agent code changed: code:ab12 -> code:cd34``, ``model changed: a -> b``."""
    if changed is None:
        return ""
    if changed == "agent_version":
        return f"agent code changed: {before} -> {after}"
    if changed == "tool_schema_hashes" and isinstance(before, dict) and isinstance(after, dict):
        tools = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        return f"tool descriptions changed: {', '.join(tools)}"
    if changed == "prompt_hash":  # a sha256 each: their heads tell them apart
        return f"prompt changed: {str(before)[:12]}… -> {str(after)[:12]}…"
    return f"{changed} changed: {before} -> {after}"


def resolve_in_place(parent: Checkpoint, host: AgentSpec, request: RerunRequest) -> RerunRequest:
    """``request`` as the branch runs it, given the code ``host`` that ``request.agent`` names now.

    The code that recorded ``parent`` is the usual case: ``request`` as it is. Code edited in place since
    (its ``agent_version`` differs from the record and nothing else does) is a fix being tried: a
    re-drive or live re-run of it is the counterfactual of the agent element (``mode`` counterfactual,
    ``base_mode`` the one asked, ``change`` ``{"agent": request.agent}``), compared with the recorded
    version; a ``--set agent=`` candidate is compared with the record whatever ``--agent`` is now.
    ``resume`` of the same run still refuses other code: this is a new run, a branch.

    Raises RerunRequestError (``Refusal.VERSION``) when the edited code also changes the model, the
    prompt or the tool schemas, or when another element is changed on top of it: a branch changes one
    element."""
    if parent.version is None or (request.mode == "counterfactual" and set(request.change) == {"agent"}):
        return request
    now = host.version_like(parent.version).model_dump()  # by the rule the parent was recorded under
    differs = differing(parent.version, now)
    if not differs or request.mode == "replay":
        return request
    code = describe_change("agent_version", parent.version.get("agent_version"), now.get("agent_version"))
    run_id = request.parent_run_id
    if differs == ["agent_version"] and request.mode in ("redrive", "live"):
        return request.model_copy(update={"mode": "counterfactual", "base_mode": request.mode,
                                          "change": {"agent": request.agent}})  # fmt: skip
    if differs == ["agent_version"]:
        what = next(iter(request.change), "?")
        raise RerunRequestError(
            f"--agent {request.agent} is not the code that recorded run {run_id} ({code}, edited since?), and "
            f"--set {what}=... changes the {ELEMENTS.get(what, what)} as well: a branch changes one element of "
            f"the version tuple. Try the code alone (`runledger rerun {run_id} --agent {request.agent} --mode "
            f"redrive`), or the {what} with the recorded code",
            Refusal.VERSION,
        )
    recorded = identity(parent.version)
    lines = "; ".join(f"{k}: recorded {recorded.get(k)!r}, now {now.get(k)!r}" for k in differs)
    raise RerunRequestError(
        f"run {run_id} was recorded with another version tuple than --agent {request.agent} has now ({lines}). "
        "A re-run of edited code is a counterfactual of the agent's code alone: keep the recorded model, prompt "
        "and tool schemas in the code and try each of those with its own --set (model=, prompt=, tools=)",
        Refusal.VERSION,
    )
