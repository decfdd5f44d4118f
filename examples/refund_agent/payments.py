"""A small local payments service that is deliberately NOT idempotent.

Every POST /refunds issues a new refund (two calls, two refunds) and every call is
appended to a JSON-lines log, which is what the crash tests count. GET
/refunds?order=ID lists the refunds of an order (what a reconcile function asks).

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
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
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
                refund = {"refund_id": uuid.uuid4().hex[:10], "order": order, "amount": amount}
                service.append({"call": "refund", **refund})
                self._send(200, refund)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                order = parse_qs(url.query).get("order", [""])[0]
                self._send(200, [c for c in service.calls() if c.get("order") == order])

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"

    def append(self, record: dict[str, Any]) -> None:
        with self.lock, open(self.log, "a") as f:
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
