"""A daemon's small HTTP side: metrics, a health check a shell can probe, and the catalog's status page.

``/metrics`` for Prometheus; ``/healthz`` answers 200 or 503 with the reasons as JSON; the catalog adds ``/``
and ``/status.json``. Read-only, GET only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("flightpart.http")

Response = tuple[int, str, bytes]
"""(status, content type, body)."""


class HttpEndpoint:
    """A threaded HTTP server answering GET on a fixed set of paths."""

    def __init__(self, host: str, port: int, routes: dict[str, Callable[[], Response]]):
        self.routes = dict(routes)
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "flightpart"

            def do_GET(self) -> None:
                route = endpoint.routes.get(self.path.split("?", 1)[0])
                if route is None:
                    status, kind, body = (404, "text/plain; charset=utf-8",
                                          f"not found; try {sorted(endpoint.routes)}\n".encode())
                else:
                    try:
                        status, kind, body = route()
                    except Exception:
                        log.exception("GET %s failed", self.path)
                        status, kind, body = (500, "text/plain; charset=utf-8",
                                              b"failed; the daemon's log has the details\n")
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("%s %s", self.address_string(), format % args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        threading.Thread(target=self._server.serve_forever, name="flightpart-http", daemon=True).start()

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()
