"""A small local payments service: idempotent when the caller sends an ``Idempotency-Key``.

POST /refunds issues a refund and appends it to a JSON-lines log, which is what the crash tests
count. With an ``Idempotency-Key`` header, a repeated key returns the first refund's answer
(``Idempotent-Replayed: true``) without refunding again, the way payment APIs do; the same key
with another body is refused (422). Without the header every call refunds again: the service is
deliberately not idempotent on its own. The keys are remembered in the log, so a restarted
service still honors them. GET /refunds?order=ID lists the refunds of an order (what a reconcile
function asks); GET /stats counts refunds, replayed calls and calls refused for a stale token.

Fencing tokens (``fencing=FencingTokens(...)``, ``--fencing-tokens FILE``): a call that sends a
``Fencing-Token`` with its ``Idempotency-Key`` (``EffectContext.fencing_headers()``) is refunded
only if no higher token was admitted for that key; an older one is refused (409) and nothing is
refunded (runledger.sdk.fencing). ``honour_keys=False`` ignores idempotency keys, to show what the
tokens alone do (tests/integration/test_fencing_helper.py).

Run it alone: ``python -m runledger.examples.refund_agent.payments --port 8099 --log payments.log``.
"""

from __future__ import annotations

import argparse
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from runledger import FencingTokens, StaleFencingTokenError
from runledger.errors import ConfigurationError
from runledger.sdk.fencing import read_fencing_headers


class PaymentsService:
    def __init__(
        self,
        log: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        fencing: FencingTokens | None = None,
        honour_keys: bool = True,
    ) -> None:
        self.log = log
        self.fencing = fencing
        self.honour_keys = honour_keys
        self.stale_refused = 0  # calls refused for a fencing token older than one admitted for their key
        self.lock = threading.Lock()
        # Idempotency key -> the refund it made, rebuilt from the log: a restart forgets no key.
        self.by_key: dict[str, dict[str, Any]] = {
            c["idempotency_key"]: c for c in self.calls() if c.get("idempotency_key") is not None
        }
        self.replayed = 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any, replayed: bool = False) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                if replayed:
                    self.send_header("Idempotent-Replayed", "true")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                try:
                    req = json.loads(self.rfile.read(length))
                    order, amount = str(req["order"]), float(req["amount"])
                except (ValueError, KeyError, TypeError):
                    self._send(400, {"error": "body must be {order, amount}"})
                    return
                try:
                    fenced = read_fencing_headers(dict(self.headers.items())) if service.fencing else None
                except ConfigurationError as exc:
                    self._send(400, {"error": str(exc)})
                    return
                code, answer, replayed = service.fenced_refund(
                    order, amount, self.headers.get("Idempotency-Key"), fenced
                )
                self._send(code, answer, replayed)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path == "/stats":
                    with service.lock:
                        stats = {"refunds": len(service.calls()), "replayed": service.replayed}
                        self._send(200, {**stats, "stale_refused": service.stale_refused})
                    return
                order = parse_qs(url.query).get("order", [""])[0]
                self._send(200, [c for c in service.calls() if c.get("order") == order])

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"

    def fenced_refund(
        self, order: str, amount: float, key: str | None, fenced: tuple[str, int] | None
    ) -> tuple[int, dict[str, Any], bool]:
        """``refund``, admitted by the fencing tokens first when the call sent one (409, nothing done,
        for a token older than one admitted for its key)."""
        if self.fencing is None or fenced is None:
            return self.refund(order, amount, key)
        try:
            with self.fencing.admit(*fenced):  # the key held while its refund is applied
                return self.refund(order, amount, key)
        except StaleFencingTokenError as exc:
            with self.lock:
                self.stale_refused += 1
            return 409, {"error": str(exc), "key": exc.key, "token": exc.token, "highest": exc.highest}, False

    def refund(self, order: str, amount: float, key: str | None) -> tuple[int, dict[str, Any], bool]:
        """Refund ``amount`` on ``order`` once per idempotency ``key`` (unless ``honour_keys`` is off):
        (status, answer, replayed)."""
        key = key if self.honour_keys else None
        with self.lock:  # check and refund as one step: two calls with one key race for nothing
            first = self.by_key.get(key) if key else None
            if first is not None:
                if (first["order"], first["amount"]) != (order, amount):
                    return 422, {"error": f"idempotency key {key!r} was used for another refund"}, False
                self.replayed += 1
                return 200, {k: first[k] for k in ("refund_id", "order", "amount")}, True
            refund = {"refund_id": uuid.uuid4().hex[:10], "order": order, "amount": amount}
            record = {"call": "refund", **refund, **({"idempotency_key": key} if key else {})}
            self._write(record)
            if key:
                self.by_key[key] = record
            return 200, refund, False

    def append(self, record: dict[str, Any]) -> None:
        with self.lock:
            self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        with open(self.log, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def start(self) -> PaymentsService:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", required=True)
    parser.add_argument("--fencing-tokens", metavar="FILE", help="keep the highest fencing token per key in FILE")
    args = parser.parse_args()
    fencing = FencingTokens(args.fencing_tokens) if args.fencing_tokens else None
    service = PaymentsService(Path(args.log), port=args.port, fencing=fencing)
    # This is the program's main, and its URL is its output: whoever starts it reads the first
    # line of stdout to find the port it got (tests/integration/test_ledger_crash.py does).
    print(service.url, flush=True)
    service.server.serve_forever()


if __name__ == "__main__":
    main()
