"""``runledger.Run`` is one interface: the recorded run, the sandbox guest's run and the host side
of a re-run all implement it with the same method signatures (mypy checks the same statically,
in ledger/sdk/run.py and sandbox/guest.py), and the sync facade wraps any of them.

Signatures say little of behaviour: tests/run_contract.py drives one scripted agent through every
implementation and compares what it observed and what was written (tests/unit/test_run_contract.py
on the in-memory ledger, tests/integration/test_run_contract.py on nats-server); the last test here
checks that the contract leaves none out."""

from __future__ import annotations

import inspect

import pytest

from runledger import Run, SyncRun
from runledger.sandbox.branch import BranchRun
from runledger.sandbox.guest import RemoteRun
from runledger.sdk.run import RecordedRun

METHODS = ["model", "tool", "effect", "approval", "child", "now", "random", "commit"]
PROPERTIES = ["run_id", "agent", "input", "prompt"]


def _parameters(cls: type, name: str) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(getattr(cls, name)).parameters.values()]


@pytest.mark.parametrize("cls", [RecordedRun, BranchRun, RemoteRun])
def test_every_implementation_takes_the_protocol_arguments(cls: type) -> None:
    for name in METHODS:
        assert inspect.iscoroutinefunction(getattr(cls, name)), (cls, name)
        wanted = _parameters(Run, name)
        mine = dict(_parameters(cls, name))
        takes_any_keyword = inspect.Parameter.VAR_KEYWORD in mine.values()
        for param, kind in wanted:
            assert param in mine or (takes_any_keyword and kind == inspect.Parameter.KEYWORD_ONLY), (cls, name, param)


def test_a_remote_run_is_a_run_at_run_time() -> None:
    remote = RemoteRun(None, None, {"run_id": "r", "agent_name": "a", "input": 1, "prompt": "p"})  # type: ignore[arg-type]
    assert isinstance(remote, Run)
    assert (remote.run_id, remote.agent, remote.input, remote.prompt) == ("r", "a", 1, "p")


def test_the_sync_facade_mirrors_every_method() -> None:
    for name in METHODS:
        assert callable(getattr(SyncRun, name)) and not inspect.iscoroutinefunction(getattr(SyncRun, name))
        assert [p for p, _ in _parameters(SyncRun, name)][1:] == [p for p, _ in _parameters(Run, name)][1:], name


def test_the_behavioural_contract_drives_every_implementation() -> None:
    from tests.unit import test_run_contract

    cases = [c for name, c in vars(test_run_contract).items() if name.startswith("Test") and isinstance(c, type)]
    covered = {c.implementation for c in cases}
    assert covered == {cls.__name__ for cls in (RecordedRun, BranchRun, RemoteRun, SyncRun)}
