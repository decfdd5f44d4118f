"""runledger.sdk.fencing: the highest fencing token per key, kept at the service (in memory or in
SQLite), an older token refused, calls of one key in turn across threads; the headers an attempt sends
(``EffectContext.fencing_headers``) and the service reads (``read_fencing_headers``). The frozen-holder
test against the example's payments service is tests/integration/test_fencing_helper.py."""

from __future__ import annotations

import pickle
import threading
import time
from pathlib import Path

import pytest

from runledger import EffectContext, FencingTokens, StaleFencingTokenError
from runledger.errors import ConfigurationError
from runledger.sdk.fencing import read_fencing_headers


@pytest.fixture(params=["memory", "sqlite"])
def tokens(request: pytest.FixtureRequest, tmp_path: Path) -> FencingTokens:
    return FencingTokens() if request.param == "memory" else FencingTokens(tmp_path / "fencing.db")


def test_the_highest_token_is_kept_and_an_older_one_refused(tokens: FencingTokens) -> None:
    done: list[int] = []
    with tokens.admit("pay:o-1", 41):
        done.append(41)
    with tokens.admit("pay:o-1", 41):  # the same attempt calling again
        done.append(41)
    with pytest.raises(StaleFencingTokenError) as stale, tokens.admit("pay:o-1", 40):
        done.append(40)  # never runs
    assert (stale.value.key, stale.value.token, stale.value.highest) == ("pay:o-1", 40, 41)
    assert "stale fencing token 40 for key 'pay:o-1': a newer attempt holds 41" in str(stale.value)
    assert pickle.loads(pickle.dumps(stale.value)).highest == 41
    with tokens.admit("pay:o-1", 57):
        done.append(57)
    with tokens.admit("pay:o-2", 3):  # tokens compare within a key only
        done.append(3)
    assert done == [41, 41, 57, 3]
    assert (tokens.highest("pay:o-1"), tokens.highest("pay:o-2"), tokens.highest("never")) == (57, 3, None)
    with pytest.raises(ConfigurationError), tokens.admit("pay:o-1", -1):
        pass


def test_a_failing_block_still_leaves_its_token_admitted(tokens: FencingTokens) -> None:
    """The token is recorded when admitted: the attempt held the key, whatever its call did."""
    with pytest.raises(RuntimeError), tokens.admit("k", 9):
        raise RuntimeError("the refund failed")
    with pytest.raises(StaleFencingTokenError), tokens.admit("k", 8):
        pass


def test_tokens_kept_in_a_file_outlive_the_service_and_are_its_users_alone(tmp_path: Path) -> None:
    path = tmp_path / "fencing.db"
    first = FencingTokens(path)
    with first.admit("pay:o-1", 12):
        pass
    first.close()
    assert path.stat().st_mode & 0o077 == 0
    again = FencingTokens(path)  # a restart, or a second process sharing the file
    assert again.highest("pay:o-1") == 12
    with pytest.raises(StaleFencingTokenError), again.admit("pay:o-1", 11):
        pass


@pytest.mark.parametrize("services", [1, 2])
def test_calls_of_one_key_take_turns_and_never_admit_an_older_token_after_a_newer(
    tmp_path: Path, services: int
) -> None:
    """Attempts at one key arrive while older ones still apply their effect (each holds the key 5 ms,
    the next arrives 1 ms later), and two stale ones arrive late: in a service the calls of the key
    never overlap, the tokens admitted run in increasing order, the stale ones are refused. With two
    services on one file (two processes), each keeps that order and the file keeps the highest."""
    path = tmp_path / "fencing.db"
    shared = [FencingTokens(path) for _ in range(services)]
    inside = [0] * services
    ran: list[list[int]] = [[] for _ in range(services)]
    refused: list[int] = []
    overlapped: list[int] = []
    lock = threading.Lock()

    def call(token: int) -> None:
        which = token % services
        try:
            with shared[which].admit("pay:shared", token):
                with lock:
                    inside[which] += 1
                    overlapped.extend([token] if inside[which] > 1 else [])
                    ran[which].append(token)
                time.sleep(0.005)  # the effect, applied while the key is held
                with lock:
                    inside[which] -= 1
        except StaleFencingTokenError:
            with lock:
                refused.append(token)

    threads = []
    for token in [*range(3, 21), 1, 2]:  # 1 and 2 arrive after 20 was admitted
        threads.append(threading.Thread(target=call, args=(token,)))
        threads[-1].start()
        time.sleep(0.001)
    for t in threads:
        t.join()
    assert overlapped == [] and {1, 2} <= set(refused)
    assert all(tokens == sorted(set(tokens)) for tokens in ran), ran
    assert all(s.highest("pay:shared") == 20 for s in shared)
    assert sorted(refused + ran[0] + (ran[1] if services > 1 else [])) == list(range(1, 21))


def test_an_attempt_sends_its_key_and_token_and_the_service_reads_them() -> None:
    ctx = EffectContext(key="refund:order-8891", run_id="r1", step=2, attempt=2, fencing_token=42)
    headers = ctx.fencing_headers()
    assert headers == {"Idempotency-Key": "refund:order-8891", "Fencing-Token": "42"}
    assert read_fencing_headers(headers) == ("refund:order-8891", 42)
    assert read_fencing_headers({"fencing-token": "7", "idempotency-key": "k"}) == ("k", 7)  # any case
    assert read_fencing_headers({"Idempotency-Key": "k"}) is None  # no token: nothing to fence
    for bad in (
        {"Fencing-Token": "7"},
        {"Fencing-Token": "-1", "Idempotency-Key": "k"},
        {"Fencing-Token": "x", "Idempotency-Key": "k"},
    ):
        with pytest.raises(ConfigurationError, match=r"send both, as EffectContext\.fencing_headers"):
            read_fencing_headers(bad)
