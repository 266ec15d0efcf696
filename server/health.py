"""The standard gRPC health checking protocol (``grpc.health.v1.Health``).

Served on a port of its own; a node is SERVING while its data directory is writable, a catalog while its
database answers; both turn NOT_SERVING when shutting down.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthEndpoint:
    """A gRPC server with only the health service, re-checking ``probe`` periodically."""

    def __init__(self, host: str, port: int, service: str, probe: Callable[[], bool], interval: float = 1.0):
        self.service = service
        self._probe = probe
        self._servicer = health.HealthServicer()
        self._server = grpc.server(ThreadPoolExecutor(max_workers=2, thread_name_prefix="flightpart-health"))
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, self._server)
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        self.address = f"{host}:{self.port}"
        self._stop = threading.Event()
        self._update()
        self._server.start()
        threading.Thread(target=self._loop, args=(interval,), name="flightpart-health", daemon=True).start()

    def _update(self) -> None:
        try:
            ok = bool(self._probe())
        except Exception:
            ok = False
        status = SERVING if ok and not self._stop.is_set() else NOT_SERVING
        for name in ("", self.service):
            self._servicer.set(name, status)

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._update()

    def shutdown(self) -> None:
        """Report NOT_SERVING first, so probes see the daemon going away, then stop."""
        self._stop.set()
        self._update()
        self._server.stop(grace=0.5)


def probe(address: str, service: str = "", timeout: float = 5.0) -> str:
    """``SERVING``, ``NOT_SERVING`` (or another status name) of a daemon's health port."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
