"""Digests keep nothing after erasure: low-entropy values planted in a run cannot be recovered by trying
every candidate against everything the erasure leaves.

A run plants a card number (in a tool's arguments and a model request), an amount (an effect's arguments,
on the run and on its key), a yes (an approval, requested and resolved), a PIN (a child run's input);
a second run records the same with ``capture="hash-only"``. Both are erased (the child with its parent).
Then everything left is gathered: every message NATS holds in every stream and every byte of the
server's store, the DuckDB projection (every table, and its file), a Parquet export (every row, and its
files), and the page's HTML (run list, each run, each step, its events). The attacker knows each value's
place and the canonical JSON around it and tries, with sha256 (what a plain digest is), every
candidate: the 10^6 six-digit tails of the card number in each of its two places, the 10^6 amounts and
PINs up to 999,999, yes and no. A candidate is found when its digest, or the 12 hex digits the page shows
of one, is anywhere in what is left. Budget: 4,000,002 sha256s (about 3 s here).

Witnesses: before the erasure, the keyed digest of each planted value (HMAC under the run's digest key,
read from the key store) is in the stream, so the search looks where the digests are; after it, the key
is gone from the key store. On the former code (plain digests) the same search finds the card number,
the amount, the yes and the PIN.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from runledger import AgentSpec, ModelResponse, Run, ScriptedModel
from runledger.cli import main
from runledger.log.client import LedgerClient
from runledger.log.server import ServerState
from runledger.ops.decisions import approve
from runledger.ops.verify import verify_runs
from runledger.protect.capture import DataPolicy
from runledger.protect.erasure import erase_run
from runledger.protect.keystore import KVKeyStore, run_kid
from runledger.protect.loading import load_run
from runledger.record.canonical import canonical_json
from runledger.record.digests import Digester
from runledger.record.fold import fold
from runledger.sdk.lifecycle import resume_run, start_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CARD_KNOWN = "4539148803"  # the attacker knows the card's first ten digits (a BIN and more)
CARD = CARD_KNOWN + "436467"  # Luhn-valid; the last six digits are what the attacker is after
ORDER = "order-5521"
AMOUNT = 4217
PIN = 48213
SPACE = 1_000_000
MARK = "987654321"  # where a candidate goes in a template's canonical JSON (a number or digits in a string)


def _templates() -> dict[str, tuple[Callable[[str], Any], Iterable[str], str]]:
    """What the attacker tries: name -> (the value digested, given a candidate's JSON text; the
    candidates, as their canonical JSON text; the planted one)."""
    six = [f"{n:06d}" for n in range(SPACE)]
    numbers = [str(n) for n in range(SPACE)]
    return {
        "card in a tool's arguments": (lambda c: {"card": CARD_KNOWN + c, "order": ORDER}, six, CARD[-6:]),
        "card in a model request": (
            lambda c: {"messages": [{"role": "user", "content": f"charge card {CARD_KNOWN}{c}"}], "params": {}},
            six,
            CARD[-6:],
        ),
        "amount in an effect's arguments": (lambda n: {"order": ORDER, "amount": int(n)}, numbers, str(AMOUNT)),
        "PIN as a child's input": (lambda n: {"pin": int(n)}, numbers, str(PIN)),
        "yes or no in an approval": (
            lambda v: {"action": "send_refund", "args": {"confirm": v[1:-1]}},
            ['"yes"', '"no"'],
            '"yes"',
        ),
    }


def _kid_spec(policy: DataPolicy) -> AgentSpec:
    async def kid(run: Run) -> Any:
        return await run.tool("check_pin", {"ok": True}, fn=lambda a: {"checked": True})

    return AgentSpec("digest_kid", kid, ScriptedModel([]), agent_version="v1", data_policy=policy)


def _spec(capture: str = "redacted") -> AgentSpec:
    policy = DataPolicy(capture=capture)  # type: ignore[arg-type]

    async def agent(run: Run) -> Any:
        await run.tool("verify_card", {"card": CARD, "order": ORDER}, fn=lambda a: {"valid": True})
        await run.model([{"role": "user", "content": f"charge card {CARD}"}])
        await run.effect("refund", {"order": ORDER, "amount": AMOUNT}, key=f"refund:{run.run_id}",
                         fn=lambda a: {"refunded": True})  # fmt: skip
        await run.child(_kid_spec(policy), {"pin": PIN})
        await run.approval("send_refund", {"confirm": "yes"})
        return {"done": True}

    model = ScriptedModel(lambda m: ModelResponse(content="charging", input_tokens=5, output_tokens=1))
    return AgentSpec("digest_agent", agent, model, agent_version="v1", data_policy=policy)


class Leftovers:
    """Every 64-hex-digit run, and the first 12 digits of every run of 12 or more, in what was gathered."""

    def __init__(self) -> None:
        self.full: set[str] = set()
        self.short: set[str] = set()
        self.sources: dict[str, int] = {}

    def add(self, where: str, data: bytes | str) -> None:
        text = data.decode("latin-1") if isinstance(data, bytes) else data
        runs = re.findall(r"[0-9a-f]{12,}", text)
        self.full.update(r for r in runs if len(r) == 64)
        self.short.update(r[:12] for r in runs)
        self.sources[where] = self.sources.get(where, 0) + len(runs)

    def holds(self, digest: str) -> bool:
        return digest in self.full or digest[:12] in self.short


def brute_force(leftovers: Leftovers) -> dict[str, list[str]]:
    """Each template's candidates whose plain digest (sha256 of the JCS bytes) is in ``leftovers``."""
    found: dict[str, list[str]] = {}
    for name, (make, candidates, planted) in _templates().items():
        mark = f'"{MARK}"' if planted.startswith('"') else MARK
        before, after = canonical_json(make(mark), 2).split(MARK.encode() if mark == MARK else mark.encode())
        # The bytes put together are the canonical JSON itself (checked on the planted value).
        assert before + planted.encode() + after == canonical_json(make(planted), 2), name
        hits = []
        for candidate in candidates:
            if leftovers.holds(hashlib.sha256(before + candidate.encode() + after).hexdigest()):
                hits.append(candidate)
        found[name] = hits
    return found


async def _every_message(client: LedgerClient) -> list[bytes]:
    out = []
    for info in await client.js.streams_info():
        assert info.config.name is not None
        for seq in range(max(1, info.state.first_seq), info.state.last_seq + 1):
            try:
                msg = await client.js.get_msg(info.config.name, seq)
            except NotFoundError:
                continue
            out.append(json.dumps(msg.headers or {}).encode() + (msg.data or b""))
    return out


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    assert code == 0, f"runledger {' '.join(argv)} exited {code}: {captured.out}{captured.err}"
    return captured.out


def _pages(url: str, db: Path, runs: list[str], steps: dict[str, list[int]]) -> dict[str, str]:
    """The page's HTML (and the events view) of every run and step, from the app a user starts."""
    from starlette.testclient import TestClient

    from runledger.ui.app import UIConfig, create_app

    paths = ["/", "/inbox"]
    for run_id in runs:
        paths += [f"/runs/{run_id}", f"/runs/{run_id}/live"]
        paths += [f"/runs/{run_id}/steps/{n}" for n in steps[run_id]]
    pages = {}
    with TestClient(create_app(UIConfig(nats_url=url, db=db)), base_url="http://127.0.0.1:8642") as browser:
        for path in paths:
            response = browser.get(path)
            assert response.status_code == 200, (path, response.status_code, response.text[:500])
            pages[path] = response.text
    return pages


async def test_no_planted_value_is_recovered_from_anything_an_erasure_leaves(
    client: LedgerClient, nats_server: ServerState, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = await start_run(client, _spec(), None, run_id="dg-run")
    assert first.status == "suspended", first
    await approve(client, "dg-run", first.pending[0], by="op")
    assert (await resume_run(client, _spec(), "dg-run")).status == "completed"
    hashed = await start_run(client, _spec("hash-only"), None, run_id="dg-hashed")
    assert hashed.status == "suspended", hashed
    child = fold((await load_run(client, "dg-run", open_content=False)).records).steps[3].child_run_id
    assert child

    # Before the erasure: the planted values' keyed digests are in the stream (the search below looks
    # where they are), and the run keys that make them exist.
    stream = Leftovers()
    for data in await _every_message(client):
        stream.add("stream", data)
    keys = await KVKeyStore(client.js).get(run_kid("digest_agent", "dg-run"))
    assert keys is not None
    keyed = Digester(2, 2, keys.digest_key)
    for name, (make, _, planted) in _templates().items():
        assert stream.holds(keyed.digest(make(planted))), f"the {name} digest is not in the stream"

    for run_id in ("dg-run", "dg-hashed"):
        result = await erase_run(client, run_id, reason="request", by="dpo")
        assert result.keys_destroyed
    for run_id in ("dg-run", "dg-hashed", child):
        assert (
            await KVKeyStore(client.js).get(run_kid(fold((await load_run(client, run_id)).records).agent, run_id))
            is None
        )
        assert all(r.ok for r in await verify_runs(client, run_id))  # the chain still verifies

    # Everything left: NATS (every stream, every byte of its store), the projection, an export, the page.
    left = Leftovers()
    for data in await _every_message(client):
        left.add("stream", data)
    for path in Path(nats_server.data_dir).rglob("*"):
        if path.is_file():
            left.add("server store", path.read_bytes())
    db = tmp_path / "ledger.duckdb"
    nats = ("--nats", client.url, "--db", str(db))
    await _cli(capsys, "project", "--quiet", *nats)
    for table in ("events", "runs", "steps", "checkpoints", "effect_keys", "approvals", "quarantine"):
        left.add("DuckDB", await _cli(capsys, "sql", f"SELECT * FROM {table}", "--format", "json", *nats))
    left.add("DuckDB file", db.read_bytes())
    lake = tmp_path / "lake"
    await _cli(capsys, "export", "--parquet", str(lake), *nats)
    import pyarrow.parquet as pq

    for path in lake.rglob("*.parquet"):
        left.add("Parquet", path.read_bytes())
        left.add("Parquet", json.dumps(pq.read_table(path).to_pylist(), default=str))
    runs = ["dg-run", "dg-hashed", child]
    steps = {r: sorted(fold((await load_run(client, r)).records).steps) for r in runs}
    for path, html in (await asyncio.to_thread(_pages, client.url, db, runs, steps)).items():
        left.add(f"page {path}", html)
    assert all(left.sources.get(s) for s in ("stream", "DuckDB", "Parquet", "page /runs/dg-run")), left.sources

    found = brute_force(left)
    assert found == {name: [] for name in found}, f"recovered from what the erasure left: {found}"
