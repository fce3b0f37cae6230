"""A recording proxy between the exporter and a live engine's /metrics.

The exporter scrapes the proxy; the proxy fetches the engine's page, records it and passes it on
unchanged. `freeze()` keeps answering the last page it passed on, so after two exporter cycles the
exporter's /metrics is exactly what that page normalizes to: the tier then compares the exporter's
output with the native values of that one page, with no race against a moving engine.
"""

from __future__ import annotations

import http.server
import threading
import urllib.request

MAX_PAGE_BYTES = 16 << 20  # a live page of the tiny models is about 60 KB


class RecordingProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/") + "/metrics"
        self.pages: list[bytes] = []  # every page passed on, oldest first (bounded below)
        self.frozen: bytes | None = None
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                status, body = proxy._page()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the exporter gave up on a slow answer: it counts a timeout
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _page(self) -> tuple[int, bytes]:
        with self._lock:
            if self.frozen is not None:
                return 200, self.frozen
        try:
            with urllib.request.urlopen(self.upstream, timeout=5) as answer:
                body = answer.read(MAX_PAGE_BYTES + 1)[:MAX_PAGE_BYTES]
        except OSError as error:  # the engine is down: the exporter must see it down too
            return 502, f"upstream: {error}\n".encode()
        with self._lock:
            self.pages = [*self.pages[-9:], body]
        return 200, body

    def freeze(self) -> bytes:
        """From now on, answer the last page passed on (fetching one first if there is none)."""
        if not self.pages:
            self._page()
        with self._lock:
            self.frozen = self.pages[-1]
            return self.frozen

    def thaw(self) -> None:
        with self._lock:
            self.frozen = None

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
