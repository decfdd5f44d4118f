"""Roles as NATS users with subject permissions, and their credentials files.

Five users (``runledger up --secure`` writes them; ``deploy/nats/`` has a commented example):

================  ==========================================================================
role              may
================  ==========================================================================
agent-<NAME>      write (as ``a``) and read only its own runs (``ledger.run.<NAME>.>``), claim and read
                  its own effect keys (``ledger.effect.<NAME>.>``: another agent's are out of reach), store
                  blobs, create and read its own runs' keys (``$KV.LEDGER_KEYS.<NAME>.>``)
analyst           read everything but run keys (streams, blobs) by direct gets; publish nothing to
                  the ledger; no consumer (nobody but workers may take a re-run request). Run
                  keys (``LEDGER_KEYS``) too once an operator grants it content
                  (``runledger up --secure --grant-content analyst``)
operator          what an analyst may, plus publish re-run commands (``ledger.cmd.>``), and the
                  decisions only an operator may make, on the operator subjects (``o``): approvals,
                  budget grants, accepted versions, erasure notices, effect resolutions; and erase
                  (delete a run's key, purge its blobs)
worker            consume re-run commands (the only role that pulls from ``LEDGER_CMD``, through
                  its one consumer ``rerun-workers``), read parents, write branch runs and their
                  effects (as ``w``: never an agent's run or a key that is claimed or committed,
                  never a decision), create branch runs' keys (``=w.<agent>.<run_id>``: never an
                  agent's run's key)
admin             everything (creates and updates the streams: ``runledger up``)
================  ==========================================================================

What the server decides and what the fold decides: a permission sees the subject, so it fixes the
writer token each role may use (``a`` only on its own agent's subjects, ``w``, ``o``); it cannot see
whether ``ledger.run.alpha.R.w`` is a branch or an agent's run, or whether a ``.w`` message on a key
answers a branch's claim, because branches and agents share run and key subjects. The fold checks
the rest (runledger.record.fold.refusal, runledger.sdk.effects.key_refusal): a worker's message in
a run that did not start on ``w``, or on a key that is claimed or committed (but for the outcome of
its own claim), is quarantined by every reader and
changes nothing (docs/data-protection.md, "Who may write what").

Nobody but admin may create, update, delete or purge a stream (``$JS.API.STREAM.CREATE|UPDATE|
DELETE|PURGE``): JetStream permission violations surface in nats-py as timeouts, so a
forbidden action fails slowly but surely; the reason reaches ``error_cb``.

How reads are scoped (checked by tests/integration/test_jetstream_api.py, which sends every API
call with each role's credentials; docs/data-protection.md has the table): readers read by direct
gets (``$JS.API.DIRECT.GET.<stream>``, a batch from a sequence on a subject filter), which read and
create nothing, and no role but the admin creates, updates or deletes a consumer. A role that may
create a consumer may make it a push consumer delivering to any subject it names (the server never
checks a deliver subject against the creator's permissions: a reader pushed blob chunks onto
another agent's operator subject, where a stream stored them), and a role that may delete its own
consumers may delete anyone's. Two exceptions a permission can hold to a subject: an agent creates
consumers filtered to its own runs and keys (``$JS.API.CONSUMER.CREATE.LEDGER.<name>.<filter>``: a
direct get by sequence or filter cannot be scoped, the filter is in the request body), and a
worker updates the work queue's one consumer, ``rerun-workers``, which the admin creates as a pull
consumer with the streams (the server never updates a pull consumer into a push one). Direct gets
of a subject's last message (fencing checks, KV reads) are scoped by the subject in the API
subject. Each user gets its own inbox prefix (``_INBOX_<user>``) and may subscribe only there, so
nobody can listen to the replies and deliveries of another, nor make an agent's push consumer
deliver (a push consumer delivers only where a subscription listens).

What an agent can still see of other agents: ``$JS.API.STREAM.INFO.LEDGER`` (which
``read_raw`` uses to count messages) answers with subject names and counts for any filter,
so run ids and event counts of other agents are visible; their content is not.

**Content is granted.** Opening content takes a run's keys from ``LEDGER_KEYS`` and the master key
to unwrap them (runledger.protect.keystore). Agents (their own runs), operators, workers and admin
read run keys; an analyst reads structure, and the bucket only when an operator grants it:
``generate(..., grant_content=["analyst"])`` (``runledger up --secure --grant-content analyst``)
records the grant in ``grants.json`` next to the credentials, so a restart keeps it, and
``revoke_content`` takes it back. Without the grant the analyst's reads of the bucket are denied by
the server (``content_denials``), so its ``show`` and ``sql --content`` find no key, whatever
master key its process holds: content stays sealed, and ``sql --content`` says who may grant it.

Credentials are plain users and passwords (random, 32 bytes) in a server config include
file and one JSON credentials file per user, all mode 0600 under ``<home>/secure``. Plain
passwords keep this dependency-free; nkeys (the ``nkeys`` package: the server holds only
public keys) or decentralized JWT auth are the upgrade for a multi-machine deployment.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from runledger.errors import ConfigurationError
from runledger.log.credentials import RoleCredentials
from runledger.log.private import private_dir, write_private
from runledger.log.subjects import (
    BLOB_BUCKET,
    CMD_STREAM,
    KEY_BUCKET,
    KEY_STREAM,
    LEDGER_STREAM,
    RERUN_CONSUMER,
    RERUN_SUBJECT,
)
from runledger.protect.keystore import WORKER_KID_PREFIX
from runledger.record.ids import is_subject_token

API = "$JS.API"
BLOB_STREAM = f"OBJ_{BLOB_BUCKET}"
ROLES = ("agent", "analyst", "operator", "worker", "admin")
# The roles an operator may grant content to: the others read run keys by what they do.
GRANTABLE = ("analyst",)
GRANTS_FILE = "grants.json"
DATA_STREAMS = (LEDGER_STREAM, BLOB_STREAM, KEY_STREAM)
# The work queue's one consumer, as its API subjects name it.
_WORK_QUEUE = f"{CMD_STREAM}.{RERUN_CONSUMER}"


def _reads() -> list[str]:
    """API subjects every reader needs, whatever it may read."""
    return [
        f"{API}.STREAM.INFO.{LEDGER_STREAM}",  # read_raw counts messages per subject
        f"{API}.STREAM.INFO.{BLOB_STREAM}",  # object_store()
        f"{API}.STREAM.INFO.{KEY_STREAM}",  # key_value()
        f"{API}.DIRECT.GET.{BLOB_STREAM}",  # blob chunks (sealed per run), batches by sequence and subject
        f"{API}.DIRECT.GET.{BLOB_STREAM}.$O.{BLOB_BUCKET}.M.>",  # object metadata
        f"{API}.STREAM.MSG.GET.{BLOB_STREAM}",  # object metadata (nats-py's get_info uses this form)
        f"{API}.STREAM.NAMES",  # nats-py looks up the stream of a subject by name
    ]


def content_denials() -> list[str]:
    """The API subjects through which run keys are read (direct gets and message gets on the
    bucket's stream; no role but the admin creates consumers): denied to a role without the content
    grant."""
    return [
        f"{API}.DIRECT.GET.{KEY_STREAM}",
        f"{API}.DIRECT.GET.{KEY_STREAM}.>",
        f"{API}.STREAM.MSG.GET.{KEY_STREAM}",
    ]


def permissions(role: str, agent: str | None = None, *, content: bool = False) -> dict[str, Any]:
    """The NATS ``permissions`` block of a role (``agent`` names the agent of an agent user;
    ``content``: an analyst granted content, which may then read run keys)."""
    if role == "admin":
        return {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    if role == "agent":
        if not agent or not is_subject_token(agent):
            raise ConfigurationError(f"an agent user needs a valid agent name, got {agent!r}")
        own = f"ledger.run.{agent}"
        allow = [
            f"{own}.*.a",  # its runs' events, as their writer (runledger.log.subjects)
            f"ledger.effect.{agent}.*.a",
            f"$O.{BLOB_BUCKET}.>",
            f"$KV.{KEY_BUCKET}.{agent}.>",
            *_reads(),
            # Its own runs and keys through consumers whose filter is in the API subject (a direct get
            # by sequence or filter cannot be scoped); flow control of nats-py's ordered consumer.
            f"{API}.CONSUMER.CREATE.{LEDGER_STREAM}.*.{own}.>",
            f"{API}.CONSUMER.CREATE.{LEDGER_STREAM}.*.ledger.effect.{agent}.>",
            f"$JS.FC.{LEDGER_STREAM}.>",
            f"{API}.DIRECT.GET.{LEDGER_STREAM}.{own}.>",
            f"{API}.DIRECT.GET.{LEDGER_STREAM}.ledger.effect.{agent}.>",
            f"{API}.DIRECT.GET.{KEY_STREAM}.$KV.{KEY_BUCKET}.{agent}.>",
        ]
        return {"publish": {"allow": allow}, "subscribe": {"allow": [f"{inbox_prefix('agent', agent)}.>"]}}
    # Readers read by direct gets and create no consumer: a role that may create one may make it a
    # push consumer delivering to any subject it names (the server never checks a deliver subject
    # against the creator's permissions), and may delete another reader's. The work queue's one
    # consumer is the workers' alone: nobody else may pull (and so take) a re-run request.
    read_all = [
        *_reads(),
        f"{API}.STREAM.LIST",
        f"{API}.STREAM.INFO.*",
        f"{API}.CONSUMER.INFO.{_WORK_QUEUE}",
        f"{API}.CONSUMER.NAMES.{CMD_STREAM}",
        f"{API}.CONSUMER.LIST.{CMD_STREAM}",
        f"{API}.DIRECT.GET.>",
        f"{API}.STREAM.MSG.GET.*",
    ]
    if role == "analyst":
        allow = read_all
        deny = ["ledger.>", "$KV.>", "$O.>", *([] if content else content_denials())]
    elif role == "operator":
        allow = [
            *read_all,
            "ledger.cmd.>",
            "ledger.run.*.*.o",  # decisions (approvals, budget grants, accepted versions, erasure notices)
            "ledger.effect.*.*.o",  # resolutions of in-doubt effects
            f"$KV.{KEY_BUCKET}.>",  # the purge marker of an erased run's key
            f"{API}.STREAM.MSG.DELETE.{KEY_STREAM}",  # erase: secure deletion of a run's key
            f"$O.{BLOB_BUCKET}.>",  # erase: delete markers of a run's blobs
            f"{API}.STREAM.PURGE.{BLOB_STREAM}",  # erase: purge a run's blob chunks
        ]
        deny = []
    elif role == "worker":
        allow = [
            *read_all,
            # Branch runs and their keys, as their writer. The subject cannot say a branch from an agent's
            # run or key: the fold refuses a "w" message in an agent's run or on a key held or committed.
            "ledger.run.*.*.w",
            "ledger.effect.*.*.w",
            f"$O.{BLOB_BUCKET}.>",
            f"$KV.{KEY_BUCKET}.{WORKER_KID_PREFIX}.>",  # its branches' keys only: never purge an agent's run's key
            # The work queue's consumer: its settings (the admin made it a pull consumer with the streams,
            # and the server never turns a pull consumer into a push one), its requests and their acks.
            f"{API}.CONSUMER.CREATE.{_WORK_QUEUE}.{RERUN_SUBJECT}",
            f"{API}.CONSUMER.MSG.NEXT.{_WORK_QUEUE}",
            f"$JS.ACK.{_WORK_QUEUE}.>",
        ]
        deny = ["ledger.cmd.>"]
    else:
        raise ConfigurationError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    user = role
    publish: dict[str, Any] = {"allow": allow}
    if deny:
        publish["deny"] = deny
    return {"publish": publish, "subscribe": {"allow": [f"{inbox_prefix(user)}.>"]}}


def inbox_prefix(role: str, agent: str | None = None) -> str:
    return f"_INBOX_{role}" + (f"_{agent}" if agent else "")


def user_name(role: str, agent: str | None = None) -> str:
    return f"agent-{agent}" if role == "agent" else role


def _conf_value(value: Any) -> str:
    # NATS config accepts JSON for values; subjects with $ need quoting, which JSON does.
    return json.dumps(value)


def render_authorization(users: list[RoleCredentials], content: frozenset[str] = frozenset()) -> str:
    """The ``authorization { users = [...] }`` block of a nats-server config (``content``: the roles
    granted content)."""
    lines = ["# runledger roles: generated by `runledger up --secure`; see ledger/roles.py"]
    lines += ["authorization {", "  users = ["]
    for u in users:
        lines.append(
            "    {"
            + f"user: {_conf_value(u.user)}, password: {_conf_value(u.password)}, "
            + f"permissions: {_conf_value(permissions(u.role, u.agent, content=u.role in content))}"
            + "}"
        )
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def content_grants(directory: Path) -> frozenset[str]:
    """The roles granted content in ``directory`` (``grants.json``; none when it is missing)."""
    path = directory / GRANTS_FILE
    if not path.exists():
        return frozenset()
    try:
        return frozenset(json.loads(path.read_text())["content"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"{path} is not a runledger grants file: {exc}") from exc


def _granted(directory: Path, grant: tuple[str, ...], revoke: tuple[str, ...]) -> frozenset[str]:
    for role in (*grant, *revoke):
        if role not in GRANTABLE:
            raise ConfigurationError(
                f"content is granted to {', '.join(GRANTABLE)} only, not {role!r}: agents read their own runs' "
                "content, operators, workers and admin read it by their role"
            )
    if set(grant) & set(revoke):
        raise ConfigurationError(
            f"grant or revoke content, not both, for {', '.join(sorted(set(grant) & set(revoke)))}"
        )
    granted = (content_grants(directory) | set(grant)) - set(revoke)
    if grant or revoke:
        write_private(directory / GRANTS_FILE, json.dumps({"content": sorted(granted)}, indent=2) + "\n")
    return frozenset(granted)


def generate(
    directory: Path,
    agents: list[str],
    url: str = "",
    *,
    grant_content: tuple[str, ...] = (),
    revoke_content: tuple[str, ...] = (),
) -> dict[str, Path]:
    """Write ``auth.conf`` and one credentials file per user into ``directory`` (mode 0600).

    Existing credentials are kept (a restart must not lock running agents out); users for
    new agents are added. Content grants (``grants.json``) are kept too; ``grant_content`` and
    ``revoke_content`` change them (roles of ``GRANTABLE``). Returns the credentials file of each
    user, by user name.
    """
    private_dir(directory)
    content = _granted(directory, grant_content, revoke_content)
    wanted: list[tuple[str, str | None]] = [(r, None) for r in ("admin", "analyst", "operator", "worker")]
    for agent_name in agents:
        if not is_subject_token(agent_name):
            raise ConfigurationError(f"agent name {agent_name!r} cannot be used in a subject")
        wanted.append(("agent", agent_name))
    users: list[RoleCredentials] = []
    files: dict[str, Path] = {}
    for role, agent in wanted:
        name = user_name(role, agent)
        path = directory / f"{name}.json"
        if path.exists():
            creds = RoleCredentials.read(path)
            if url and creds.url != url:
                creds = RoleCredentials(**{**asdict(creds), "url": url})
                creds.write(path)
        else:
            creds = RoleCredentials(
                role=role,
                user=name,
                password=secrets.token_urlsafe(32),
                inbox_prefix=inbox_prefix(role, agent),
                url=url,
                agent=agent,
            )
            creds.write(path)
        users.append(creds)
        files[name] = path
    # Agents added earlier stay.
    for path in sorted(directory.glob("agent-*.json")):
        if path.stem not in files:
            creds = RoleCredentials.read(path)
            users.append(creds)
            files[path.stem] = path
    conf = directory / "auth.conf"
    write_private(conf, render_authorization(users, content))
    return files


def secure(
    agents: list[str], *, grant_content: tuple[str, ...] = (), revoke_content: tuple[str, ...] = ()
) -> Callable[[Path, str], dict[str, Path]]:
    """The ``auth`` writer of ``EmbeddedServer.start`` for the roles, with a user for each agent
    (and content granted or revoked: ``generate``)."""

    def write(directory: Path, url: str) -> dict[str, Path]:
        return generate(directory, agents, url=url, grant_content=grant_content, revoke_content=revoke_content)

    return write
