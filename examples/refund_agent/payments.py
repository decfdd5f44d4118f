"""A small local payments service: idempotent when the caller sends an ``Idempotency-Key``.

POST /refunds issues a refund and appends it to a JSON-lines log, which is what the crash tests
count. With an ``Idempotency-Key`` header, a repeated key returns the first refund's answer
(``Idempotent-Replayed: true``) without refunding again, the way payment APIs do; the same key
with another body is refused (422). Without the header every call refunds again: the service is
deliberately not idempotent on its own. The keys are remembered in the log, so a restarted
service still honors them. GET /refunds?order=ID lists the refunds of an order (what a reconcile
function asks); GET /stats counts refunds and replayed calls.

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


class PaymentsService:
    def __init__(self, log: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.log = log
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
                code, answer, replayed = service.refund(order, amount, self.headers.get("Idempotency-Key"))
                self._send(code, answer, replayed)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path == "/stats":
                    with service.lock:
                        self._send(200, {"refunds": len(service.calls()), "replayed": service.replayed})
                    return
                order = parse_qs(url.query).get("order", [""])[0]
                self._send(200, [c for c in service.calls() if c.get("order") == order])

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"

    def refund(self, order: str, amount: float, key: str | None) -> tuple[int, dict[str, Any], bool]:
        """Refund ``amount`` on ``order`` once per idempotency ``key``: (status, answer, replayed)."""
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
    args = parser.parse_args()
    service = PaymentsService(Path(args.log), port=args.port)
    # This is the program's main, and its URL is its output: whoever starts it reads the first
    # line of stdout to find the port it got (tests/integration/test_ledger_crash.py does).
    print(service.url, flush=True)
    service.server.serve_forever()


if __name__ == "__main__":
    main()
