"""Running a daemon: health and metrics endpoints, the READY line, signals.

``flightpart serve`` and ``flightpart catalog`` parse their options into a
settings value (:mod:`.settings`) and hand it here. A daemon prints one line ``READY <role> <uri>`` on stdout once it
accepts calls, so a parent process (the demo, the tests, a supervisor) can
wait for it without guessing ports or sleeping; SIGINT and SIGTERM stop it
cleanly (the last server started is stopped first) within a grace period, and
SIGQUIT prints its threads' stacks.
"""

from __future__ import annotations

import errno
import faulthandler
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from flightpart.errors import CannotStart, ForeignCluster, NodeConflict, StateUnavailable
from flightpart.io.allocator import keep_freed_memory
from flightpart.io.layout import default_state_dir

from .catalog import CatalogServer
from .node import NodeServer
from .security import Security, is_loopback
from .settings import CatalogSettings, NodeSettings, Observability

log = logging.getLogger("flightpart.daemon")
T = TypeVar("T")


def log_started(role: str, uri: str, cluster: str | None, security: Security, host: str) -> None:
    """The one line each daemon logs once it serves: where, which cluster, how callers are checked, TLS.

    An open daemon reachable beyond loopback (``--insecure``) is also said as
    a warning, so that it is never open silently.
    """
    auth = security.auth_mode()
    log.info("flightpart %s serving at %s; cluster %s; auth %s; TLS %s", role, uri, cluster or "not yet", auth,
             security.tls_mode())
    if auth == "open" and not is_loopback(host):
        log.warning("flightpart %s at %s is OPEN (--insecure): anyone who reaches it may read, write and delete every "
                    "dataset; give it a secret with --secret-file to close it", role, uri)


def announce(role: str, uri: str) -> None:
    """The READY line a parent process waits for."""
    print(f"READY {role} {uri}", flush=True)


STOP_GRACE_SECONDS = 10.0


def wait_for_signal(servers: Sequence[Any], grace: float = STOP_GRACE_SECONDS) -> None:
    """Block until SIGINT/SIGTERM, then shut the servers down (last first), within ``grace`` seconds.

    A Flight server's shutdown waits for the calls in flight; a call that does
    not end (a client stopped mid-stream, a peer that no longer answers) would
    keep the daemon alive after its stop signal, which a supervisor, a script's
    ``kill`` or ``docker stop`` cannot tell from a hang. Past ``grace`` (Docker's
    own 10 s) the daemon logs what it waited for and exits; a second signal exits
    at once. What is stored stays whole either way: writes are atomic, so a
    partition a cut call was writing is never committed half-written.
    SIGQUIT prints every thread's stack to stderr and leaves the daemon running.
    """
    stop = threading.Event()
    signals = 0

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            os._exit(0)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    faulthandler.register(signal.SIGQUIT, all_threads=True)
    while not stop.wait(0.5):
        pass
    done = threading.Event()

    def shut_down() -> None:
        for server in reversed(servers):
            server.shutdown()
        done.set()

    threading.Thread(target=shut_down, name="flightpart-shutdown", daemon=True).start()
    if not done.wait(grace):
        log.warning("calls still in flight %.0f s after the stop signal; exiting without them", grace)
        faulthandler.dump_traceback(all_threads=True)
        os._exit(0)


def observe(server: Any, role: str, host: str, ports: Observability, catalog: Any = None) -> list:
    """Start the health (gRPC) and HTTP (metrics, ``/healthz``, a catalog's status page) endpoints of a daemon; returns
    what to shut down. ``catalog``: the catalog whose status page this endpoint also serves (the daemon's own when it is
    one, the embedded one of ``flightpart serve`` without ``--catalog``)."""
    started: list = []
    bind = "0.0.0.0" if host in ("0.0.0.0", "") else host
    if ports.health_port is not None:
        from .health import HealthEndpoint

        endpoint = HealthEndpoint(bind, ports.health_port, f"flightpart.{role}", server.healthy)
        started.append(endpoint)
        announce(f"{role}-health", endpoint.address)
    if ports.metrics_port is not None:
        from .http import HttpEndpoint

        catalog = catalog if catalog is not None else (server if role == "catalog" else None)
        http = HttpEndpoint(ports.metrics_host, ports.metrics_port, http_routes(server, role, catalog))
        started.append(http)
        announce(f"{role}-metrics", f"{http.url}/metrics")
        if catalog is not None:
            announce("catalog-status", f"{http.url}/")
    return started


def http_routes(server: Any, role: str, catalog: Any = None) -> dict:
    """``/metrics`` and ``/healthz`` of ``server``; with a ``catalog``, its status page and ``/status.json`` too."""
    from prometheus_client import CONTENT_TYPE_LATEST

    from .metrics import exposition, metrics_registry
    from .status_page import render, status_json

    registry = metrics_registry(role, server.stats, server.telemetry, server.problems)

    def healthz() -> tuple[int, str, bytes]:
        problems = server.problems()
        body = json.dumps({"status": "NOT_SERVING" if problems else "SERVING", "role": role, "problems": problems})
        return (503 if problems else 200), "application/json", body.encode()

    routes = {"/metrics": lambda: (200, CONTENT_TYPE_LATEST, exposition(registry)), "/healthz": healthz}
    if catalog is not None:
        routes["/"] = lambda: (200, "text/html; charset=utf-8", render(catalog.status()).encode())
        routes["/status.json"] = lambda: (200, "application/json", status_json(catalog.status()))
    return routes


def listening(start: Callable[[], T], host: str, port: int, what: str) -> T:
    """``start()`` (a server binding ``host:port``), with a failure to listen said in one line with what to do."""
    try:
        return start()
    except pa.ArrowException:  # pyarrow says only "Server did not start properly": find out why by trying the port
        reason = bind_problem(host, port)
        if reason is None:
            raise
        raise CannotStart(f"the {what} cannot listen on {host}:{port}: {reason}; "
                          + ("stop the daemon that holds the port or pick another with --port"
                             if reason == "address in use" else "check --host is an address of this machine")) from None


def bind_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now (``address in use``, ...), or None when it can."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        return "address in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc)).lower()
    return None


def start_catalog(settings: CatalogSettings, catalog_class: type[CatalogServer] = CatalogServer) -> CatalogServer:
    """A catalog whose SQLite state lives in ``settings.state_dir`` (default: the per-user data directory), readable by
    its owner only, or, with ``settings.lease`` (a PostgreSQL URL), in that database, shared with the cluster's other
    catalogs; ``catalog_class``: the catalog with whatever the caller adds to it (the CLI's speaks Flight SQL)."""
    state = Path(settings.state_dir) if settings.state_dir else default_state_dir()
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)
    security = settings.security

    def build() -> CatalogServer:
        try:
            return catalog_class(replace(settings, state_dir=str(state)), pool=security.pool(),
                                 **{**security.server_options(), "secret": security.catalog_secret()})
        except StateUnavailable as exc:
            raise CannotStart(f"--lease: {exc.message}; start PostgreSQL (or fix the address) and try again") from None
        except ImportError:
            raise CannotStart("--lease needs psycopg: pip install 'flightpart[ha]'") from None

    return listening(build, settings.host, settings.port, "catalog")


def run_catalog(settings: CatalogSettings, catalog_class: type[CatalogServer] = CatalogServer) -> None:
    """``flightpart catalog``: serve until a signal."""
    host, security = settings.host, settings.security
    security.check_exposure(host, "catalog")
    keep_freed_memory(declined="a catalog: it reads aggregates and windowed scans, under DuckDB's memory limit")
    server = start_catalog(settings, catalog_class)
    extras = observe(server, "catalog", host, settings.ports)
    log_started("catalog", server.uri, server.state.cluster(), security, host)
    announce("catalog", server.uri)
    wait_for_signal([server, *extras])


def run_node(settings: NodeSettings, catalog_class: type[CatalogServer] = CatalogServer) -> None:
    """``flightpart serve``: a node (and, without ``settings.catalog``, a catalog in the same process), until a
    signal."""
    host, port, catalog, advertise = settings.host, settings.port, settings.catalog, settings.advertise
    security = settings.credentials
    security.check_exposure(host, "node")
    servers: list = []
    if catalog is not None and port and any(one.split("://")[-1] in (f"{host}:{port}", f"{advertise}:{port}")
                                            for one in catalog.split(",")):
        raise CannotStart(f"--catalog {catalog} is this node's own address: start the catalog first "
                          "(`flightpart catalog`) and give the node another --port, or drop --catalog to run node and "
                          "catalog in one process")
    if catalog is None:
        embedded = start_catalog(settings.embedded_catalog(), catalog_class)
        servers.append(embedded)
        catalog, port = embedded.uri, settings.node_port
        log_started("catalog", embedded.uri, embedded.state.cluster(), security, host)
        announce("catalog", embedded.uri)
    elif security.secret() is not None:
        log.warning("this node holds the cluster secret, with which it could act as any writer, admin or node: give it "
                    "only its own --node-token-file and the --verify-key-file (see docs/operations/security.md)")
    joined = replace(settings, port=port, catalog=catalog)
    node = listening(lambda: NodeServer(joined, pool=security.pool(), token=security.node_token(),
                                        **security.server_options()), host, port, "node")
    servers.append(node)
    try:
        node.register()
    except (NodeConflict, ForeignCluster) as exc:  # this process must not serve: say why and stop
        log.error("%s", exc)
        for server in reversed(servers):
            server.shutdown()
        raise
    except Exception as exc:  # the heartbeat thread keeps trying
        log.warning("catalog %s not reachable yet: %s", catalog, exc)
    servers.extend(observe(node, "node", host, settings.ports, catalog=servers[0] if len(servers) > 1 else None))
    log_started("node", node.uri, node.store.cluster, security, host)
    announce("node", node.uri)
    wait_for_signal(servers)
