"""run.forked schema versions: version 2 names the fork parent ``forked_from``; version 1 (which named
it ``parent_run_id``, the name run.started gives a child's parent) is still read, upcast, folded and
verified over its bytes as stored."""

from __future__ import annotations

import json

from runledger.ops.verify import verify_subject
from runledger.projections.rows import RunFold, TableBuffer, add_run, checkpoint_from_json
from runledger.record.events import GENESIS, RunForked, RunStarted, VersionTuple, decode, decode_fast, make_event
from runledger.record.fold import Checkpoint, fold
from runledger.record.records import RawRecord, Recorded

SUBJECT = "ledger.run.support.br-r1.w"

# A branch's first two events exactly as runledger wrote them before run.forked 2 (make_event of
# RunForked(parent_run_id="r1", ...) at schema version 1): these bytes are what the chain covers.
STARTED_V1 = (
    b'{"agent":"support","hash":"7ecd0552914cadec982388fc166966a7ef6b463e4bb74d86372c1fd96614cb35",'
    b'"id":"01M8W0D9N86W37CSYGJ7P5E6PY","payload":{"agent":"support","budgets":{"seconds":null,'
    b'"tokens":null,"turns":null},"capture":"full","input":null,"labels":{},"version":{"agent_version":"1",'
    b'"model":"m-1","prompt_hash":"p","tool_schema_hashes":{}}},"prev_hash":'
    b'"0000000000000000000000000000000000000000000000000000000000000000","run_id":"br-r1","schema_version":1,'
    b'"seq":0,"ts":"2026-01-02T03:04:05.000000Z","type":"run.started"}'
)
FORKED_V1 = (
    b'{"agent":"support","hash":"ab92b09cc3a871bb2b6ecd6ee08789ae7b0249cb1782f5a76ac22e1d0bea0e27",'
    b'"id":"01M8W0D9N852WXMN5SHPZJXGS1","payload":{"changed":"model","changed_from":"m-1","changed_to":"m-2",'
    b'"fork_step":2,"mode":"counterfactual","parent_run_id":"r1"},"prev_hash":'
    b'"7ecd0552914cadec982388fc166966a7ef6b463e4bb74d86372c1fd96614cb35","run_id":"br-r1","schema_version":1,'
    b'"seq":1,"ts":"2026-01-02T03:04:06.000000Z","type":"run.forked"}'
)
FORK = {"forked_from": "r1", "fork_step": 2, "mode": "counterfactual", "changed": "model",
        "changed_from": "m-1", "changed_to": "m-2"}  # fmt: skip


def _v2_chain() -> list[bytes]:
    started, raw0 = make_event(
        RunStarted(agent="support", version=VersionTuple(agent_version="1", model="m-1", prompt_hash="p")),
        run_id="br-r1", agent="support", seq=0, prev_hash=GENESIS, ts="2026-01-02T03:04:05.000000Z",
    )  # fmt: skip
    _, raw1 = make_event(RunForked(**FORK), run_id="br-r1", agent="support", seq=1, prev_hash=started.hash,
                         ts="2026-01-02T03:04:06.000000Z")  # fmt: skip
    return [raw0, raw1]


def test_a_version_1_run_forked_decodes_as_stored_and_upcasts_to_forked_from() -> None:
    for decoder in (decode, decode_fast):
        ev = decoder(FORKED_V1)
        assert ev.schema_version == 1
        assert ev.payload["parent_run_id"] == "r1" and "forked_from" not in ev.payload  # the stored payload
        assert ev.body == RunForked(**FORK)  # the typed body: upcast to version 2


def test_a_version_1_branch_verifies_and_folds_to_the_fork_parent() -> None:
    raws = [RawRecord(1, SUBJECT, STARTED_V1), RawRecord(2, SUBJECT, FORKED_V1)]
    result = verify_subject(SUBJECT, raws)
    assert result.ok and not result.problems and not result.quarantined, result.problems
    cp = fold([Recorded(decode(r.data), r.stream_seq, r.subject) for r in raws])
    assert cp.parent == FORK and cp.child_of_run_id is None
    # The same branch written today folds to the same state.
    v2 = fold([Recorded(decode(raw), i + 1, SUBJECT) for i, raw in enumerate(_v2_chain())])
    assert {**v2.to_dict(), "last_hash": None} == {**cp.to_dict(), "last_hash": None}
    runs = TableBuffer("runs")
    add_run(runs, "br-r1", RunFold(SUBJECT, cp, 2))
    (row,) = runs.to_arrow().to_pylist()
    assert (row["parent_run_id"], row["fork_step"], row["fork_mode"], row["child_of_run_id"]) == (
        "r1", 2, "counterfactual", None)  # fmt: skip


def test_a_new_run_forked_is_version_2_with_forked_from() -> None:
    raw = _v2_chain()[1]
    stored = json.loads(raw)
    assert stored["schema_version"] == RunForked.VERSION == 2
    assert stored["payload"]["forked_from"] == "r1" and "parent_run_id" not in stored["payload"]
    assert decode(raw).payload == decode(raw).body.model_dump(mode="json")


def test_a_checkpoint_stored_before_version_2_reads_its_fork_parent() -> None:
    old = {**FORK, "request": None}
    old["parent_run_id"] = old.pop("forked_from")
    cp = Checkpoint.from_dict({"run_id": "br-r1", "parent": old, "steps": []})
    assert cp.parent == {**FORK, "request": None}
    stored = json.dumps({**Checkpoint(run_id="br-r1").to_dict(), "parent": old})
    assert checkpoint_from_json(stored).parent == {**FORK, "request": None}
