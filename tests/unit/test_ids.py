"""Ids: the ULID layout (48-bit milliseconds, 80 random bits, Crockford base32, 26 characters)."""

from __future__ import annotations

import os

import pytest

from runledger.record import ids


def _reference(ms: int, rnd: bytes) -> str:
    value = ms << 80 | int.from_bytes(rnd, "big")
    chars = []
    for _ in range(26):
        chars.append(ids._ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


@pytest.mark.parametrize(
    ("ms", "rnd"),
    [(0, bytes(10)), (1, b"\xff" * 10), (2**48 - 1, b"\x80" + bytes(9)), (1_795_000_000_123, bytes(range(10)))],
)
def test_new_id_is_the_ulid_of_the_time_and_the_random_bits(
    monkeypatch: pytest.MonkeyPatch, ms: int, rnd: bytes
) -> None:
    monkeypatch.setattr(ids.time, "time_ns", lambda: ms * 1_000_000 + 999_999)
    monkeypatch.setattr(ids.os, "urandom", lambda n: rnd * (n // 10))  # random bits are drawn 10 bytes an id
    ids._forget_pool()
    assert ids.new_id() == _reference(ms, rnd)
    assert ids.new_id() == _reference(ms, rnd)  # the next id of the same draw
    ids._forget_pool()


def test_a_forked_child_draws_its_own_random_bits() -> None:
    ids.new_id()  # the parent holds a pool of drawn bits
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then out without pytest's teardown
        os.write(write, ids.new_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    assert len(child) == 26 and child[10:] != ids.new_id()[10:]


def test_new_ids_sort_by_time_and_are_unique() -> None:
    made = [ids.new_id() for _ in range(1000)]
    assert all(len(i) == 26 and set(i) <= set(ids._ALPHABET) for i in made)
    assert len(set(made)) == len(made)
    assert [i[:10] for i in made] == sorted(i[:10] for i in made)
