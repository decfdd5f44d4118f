"""The fast reader's protocol parsing, fed byte streams cut at every possible place."""

from __future__ import annotations

import pytest

from runledger.errors import LedgerReadError
from runledger.log.fastread import direct_fields, header_value
from runledger.projections.errors import StreamReadError
from runledger.projections.reader import ProtocolParser, parse_ack_subject


def _hmsg(subject: str, reply: str, headers: bytes, body: bytes) -> bytes:
    return f"HMSG {subject} 1 {reply} {len(headers)} {len(headers) + len(body)}\r\n".encode() + headers + body + b"\r\n"


HEADERS = b"NATS/1.0\r\nNats-Msg-Id: r1:0\r\n\r\n"
TIMEOUT = b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 7\r\n\r\n"
# A direct get's answer: the stored message's own headers, then the stream's, appended by the server.
DIRECT = (
    b"NATS/1.0\r\nNats-Msg-Id: r1:1\r\nNats-Subject: ledger.run.forged.o\r\nNats-Stream: LEDGER\r\n"
    b"Nats-Subject: ledger.run.a.r1\r\nNats-Sequence: 44\r\nNats-Num-Pending: 0\r\nNats-Last-Sequence: 41\r\n\r\n"
)
WIRE = (
    b'INFO {"server_id": "x"}\r\n'
    + _hmsg("ledger.run.a.r1", "$JS.ACK.LEDGER.c1.1.41.41.1700000000000000000.3", HEADERS, b'{"a":1}')
    + b"PING\r\n"
    + b"MSG ledger.run.a.r1 1 $JS.ACK.LEDGER.c1.1.42.42.1700000000000000000.2 5\r\nhello\r\n"
    + _hmsg("ledger.effect.k", "$JS.ACK.dom.acc.LEDGER.c1.1.43.43.1700000000000000000.1.tok", HEADERS, b"\r\n\r\n")
    + f"HMSG _INBOX.x.1 1 {len(TIMEOUT)} {len(TIMEOUT)}\r\n".encode()
    + TIMEOUT
    + b"\r\n"
    + f"HMSG _INBOX.x.2 1 {len(DIRECT)} {len(DIRECT) + 7}\r\n".encode()
    + DIRECT
    + b'{"b":2}\r\n'
    + b"+OK\r\n-ERR 'Permissions Violation'\r\n"
)
EXPECTED = [
    ("msg", b"ledger.run.a.r1", b"$JS.ACK.LEDGER.c1.1.41.41.1700000000000000000.3", b'{"a":1}'),
    ("ping",),
    ("msg", b"ledger.run.a.r1", b"$JS.ACK.LEDGER.c1.1.42.42.1700000000000000000.2", b"hello"),
    ("msg", b"ledger.effect.k", b"$JS.ACK.dom.acc.LEDGER.c1.1.43.43.1700000000000000000.1.tok", b"\r\n\r\n"),
    (
        "status",
        b"_INBOX.x.1",
        408,
        "Request Timeout",
        b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 7\r\n\r\n",
    ),
    ("direct", b"_INBOX.x.2", DIRECT, b'{"b":2}'),
    ("err", "'Permissions Violation'"),
]


def test_parses_messages_statuses_and_control_lines() -> None:
    assert ProtocolParser().feed(WIRE) == EXPECTED


def test_any_cut_of_the_byte_stream_gives_the_same_items() -> None:
    for cut in range(1, len(WIRE)):
        parser = ProtocolParser()
        assert parser.feed(WIRE[:cut]) + parser.feed(WIRE[cut:]) == EXPECTED, cut


def test_byte_by_byte() -> None:
    parser = ProtocolParser()
    items = []
    for i in range(len(WIRE)):
        items += parser.feed(WIRE[i : i + 1])
    assert items == EXPECTED


def test_a_direct_answer_is_read_by_the_headers_the_server_appended() -> None:
    """A stored message may carry a header named as the stream's own: the server's come last."""
    assert direct_fields(DIRECT) == (44, b"ledger.run.a.r1", 0, 41)
    assert header_value(DIRECT, b"Nats-Msg-Id") == b"r1:1"
    with pytest.raises(LedgerReadError):
        direct_fields(HEADERS)


def test_ack_subjects_of_both_forms() -> None:
    assert parse_ack_subject(b"$JS.ACK.LEDGER.c1.1.41.41.1700000000000000000.3") == (41, 3)
    assert parse_ack_subject(b"$JS.ACK.dom.acc.LEDGER.c1.1.43.43.1700000000000000000.1.tok") == (43, 1)
    with pytest.raises(StreamReadError):
        parse_ack_subject(b"_INBOX.x")
