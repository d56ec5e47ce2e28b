"""A local HTTP endpoint in a thread that records the JSON bodies posted to it (webhooks, OpenLineage)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Recorder(ThreadingHTTPServer):
    """Records each POST as (path, body); answers HTTP 500 to the first `fail` requests."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.posts: list[tuple[str, Any]] = []
        self.requests = 0
        self.fail = 0
        self._lock = threading.Lock()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def bodies(self, path: str) -> list[Any]:
        with self._lock:
            return [b for p, b in self.posts if p == path]

    def wait(self, check: Callable[[], bool], seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while not check():
            assert time.monotonic() < deadline, f"not reached within {seconds} s: {self.posts}"
            time.sleep(0.02)


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server._lock:
            self.server.requests += 1
            failing = self.server.requests <= self.server.fail
            if not failing:
                self.server.posts.append((self.path, json.loads(body)))
        self.send_response(500 if failing else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class names it
        pass


@contextmanager
def recording() -> Iterator[Recorder]:
    """A running Recorder, shut down at the end."""
    server = Recorder()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
