"""A receiver to try OSTE with: answers every request OSTE sends and prints one line about it.

Run it with `python3 docs/receiver.py 9000` (standard library only). What it answers:

- `/status/NNN` answers status NNN (`/status/503`: a failing receiver, `/status/404`: a refusal);
- `?fail_first=N` answers 503 to the first N attempts of an activity (OSTE-Attempt 1..N), then 200;
- `?delay=S` waits S seconds before answering (a slow receiver);
- anything else answers 200 with `{"ok": true}`.

The docs' how-tos use it in place of a real service; it checks no signatures (see docs/receivers.md).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class Handler(BaseHTTPRequestHandler):
    """Answers as the query and path say; prints method, path, attempt and the start of the body."""

    def answer(self) -> None:
        url = urlsplit(self.path)
        query = {name: values[-1] for name, values in parse_qs(url.query).items()}
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)  # a log-shipping batch
        attempt = int(self.headers.get("OSTE-Attempt") or 1)
        status = 200
        if url.path.startswith("/status/"):
            status = int(url.path.rsplit("/", 1)[1])
        elif attempt <= int(query.get("fail_first", 0)):
            status = 503
        time.sleep(float(query.get("delay", 0)))
        print(f"{self.command} {self.path} attempt={attempt} -> {status} {body[:120]!r}", flush=True)
        reply = json.dumps({"ok": status < 300}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = answer

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: `answer` prints its own line."""


def main() -> None:
    """Listen on 127.0.0.1 at the port given as the first argument (default 9000)."""
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"receiver listening on http://127.0.0.1:{port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C stops it quietly
        server.serve_forever()


if __name__ == "__main__":
    main()
