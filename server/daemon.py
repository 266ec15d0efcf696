"""Running a daemon: security settings, health and metrics endpoints, the READY line, signals.

``flightpart serve`` and ``flightpart catalog`` parse their options and hand
them here. A daemon prints one line ``READY <role> <uri>`` on stdout once it
accepts calls, so a parent process (the demo, the tests, a supervisor) can
wait for it without guessing ports or sleeping; SIGINT and SIGTERM stop it
cleanly (the last server started is stopped first) within a grace period, and
SIGQUIT prints its threads' stacks.
"""

from __future__ import annotations

import errno
import faulthandler
import ipaddress
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from flightpart.errors import CannotStart, ForeignCluster, NodeConflict, StateUnavailable
from flightpart.io.access import SECRET_ENV, TOKEN_ENV, Access, EmptyCredentialFile, read_secret_file
from flightpart.io.allocator import keep_freed_memory
from flightpart.io.connections import ConnectionPool
from flightpart.io.layout import default_state_dir
from flightpart.tokens import Keys, VerifyKey, WeakSecret, check_secret

from .auth import tls_server_options
from .catalog import CatalogServer
from .catalog.lease import LEASE_SECONDS
from .node import NodeServer

log = logging.getLogger("flightpart.daemon")
T = TypeVar("T")


@dataclass(frozen=True)
class Security:
    """A daemon's credentials: the cluster secret's file (or a node's own token and the verify key), its own TLS
    certificate, and the CAs it trusts.

    The secret comes from ``--secret-file`` (a file only its owner may read)
    or ``$FLIGHTPART_SECRET``, never from the command line. The catalog
    needs it (it mints capabilities and signs manifests); a node needs only
    ``--node-token-file`` (its own node token, which names it) and
    ``--verify-key-file`` (to check callers' tokens without being able to
    mint one), so a node taken over cannot act as a writer, an admin or
    another node. Without any the cluster is open: every caller has every right.
    An open daemon binds loopback only unless ``insecure`` says the
    operator means it (:meth:`check_exposure`).
    """

    secret_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    tls_ca: str | None = None
    insecure: bool = False
    node_token_file: str | None = None
    verify_key_file: str | None = None

    def check_exposure(self, host: str, what: str) -> None:
        """Refuse to start a daemon that would be open to whoever reaches it without the operator saying so.

        Like Redis' protected mode: with no secret, only loopback; beyond it,
        ``--insecure``. ``$FLIGHTPART_TOKEN`` in a daemon's environment with
        no secret means someone believes this cluster checks tokens: it
        would not, so the daemon says so instead of running open silently.
        """
        if self.secret() is not None:
            return
        if os.environ.get(TOKEN_ENV):
            raise CannotStart(f"the {what} has no cluster secret but ${TOKEN_ENV} is set: a daemon does not check tokens "
                              f"without the secret they derive from. Next: give the secret with --secret-file or "
                              f"${SECRET_ENV} (then make tokens with `flightpart token`), or unset {TOKEN_ENV} to run "
                              "an open cluster")
        if not self.insecure and not is_loopback(host):
            raise CannotStart(f"the {what} has no cluster secret, so it would let anyone who reaches {host or '*'} read, "
                              f"write and delete every dataset. Next: give a secret with --secret-file or ${SECRET_ENV}, "
                              "bind loopback (--host 127.0.0.1), or say --insecure on a network you trust")

    def auth_mode(self) -> str:
        """How callers are checked, for the start-up line: ``secret`` or ``open``."""
        return "open" if self.secret() is None else "secret"

    def tls_mode(self) -> str:
        """``off``, ``on`` or ``mutual`` (client certificates required), for the start-up line."""
        if not self.tls_cert:
            return "off"
        return "mutual" if self.tls_client_ca else "on"

    def server_options(self) -> dict:
        """Keyword arguments of a flightpart server: what it verifies tokens with and its TLS settings."""
        return {**tls_server_options(self.tls_cert, self.tls_key, self.tls_client_ca), "secret": self.keys()}

    def keys(self) -> Keys | None:
        """The cluster secret when this daemon holds it, else the verify key (a node's), else None (an open cluster)."""
        secret = self.secret()
        if secret is not None or not self.verify_key_file:
            return secret
        try:
            return VerifyKey.parse(Path(self.verify_key_file).read_text())
        except (OSError, ValueError) as exc:
            raise CannotStart(f"--verify-key-file {self.verify_key_file}: {exc}") from None

    def node_token(self) -> str | None:
        """This node's own token (``--node-token-file``, mode 600), or None."""
        if not self.node_token_file:
            return None
        if not (self.verify_key_file or self.secret_file or os.environ.get(SECRET_ENV)):
            raise CannotStart("--node-token-file needs --verify-key-file (print it with `flightpart verify-key`) "
                              "to check the tokens of those who call this node")
        return read_secret_file(self.node_token_file).decode()

    def catalog_secret(self) -> bytes | None:
        """The secret a catalog works with; a catalog given only a verify key cannot mint capabilities nor sign."""
        if self.secret() is None and (self.verify_key_file or self.node_token_file):
            raise CannotStart("a catalog needs the cluster secret (--secret-file or $FLIGHTPART_SECRET): "
                              "--node-token-file and --verify-key-file are for nodes that run without a catalog inside")
        return self.secret()

    def secret(self) -> bytes | None:
        """The cluster secret (``--secret-file``, else ``$FLIGHTPART_SECRET``), or None; ``CANNOT_START`` for one that
        could be guessed (:func:`~flightpart.tokens.check_secret`), naming where it came from and how to make a good one."""
        if self.secret_file:
            source = f"--secret-file {self.secret_file}"
            try:
                value = read_secret_file(self.secret_file)
            except EmptyCredentialFile:
                value = b""  # refused below as blank, with how to make a good one
        else:
            text = os.environ.get(SECRET_ENV)  # never $FLIGHTPART_TOKEN: a client's credential, not the cluster's secret
            if not text:
                return None
            value, source = text.encode(), f"${SECRET_ENV}"
        try:
            check_secret(value)
        except WeakSecret as exc:
            raise CannotStart(f"{source}: {exc}", field="secret") from None
        return value

    def pool(self) -> ConnectionPool:
        """Connections to the other daemons, presenting this daemon's own certificate under mutual TLS."""
        ca = Path(self.tls_ca).read_bytes() if self.tls_ca else None
        own = (Path(self.tls_cert).read_bytes(), Path(self.tls_key).read_bytes()) if self.tls_cert and self.tls_key and ca else (None, None)
        return ConnectionPool(Access(None, ca, own[0], own[1]))


@dataclass(frozen=True)
class Observability:
    """Ports of the health (gRPC) and metrics (Prometheus HTTP) endpoints; None: not served."""

    health_port: int | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """True when ``host`` names this machine's loopback only (127.0.0.0/8, ::1, a name that resolves there only)."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(found) and all(ipaddress.ip_address(address.split("%")[0]).is_loopback for address in found)


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
                          + ("stop the daemon that holds the port or pick another with --port" if reason == "address in use"
                             else "check --host is an address of this machine")) from None


def bind_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now (``address in use``, ...), or None when it can."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        return "address in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc)).lower()
    return None


def start_catalog(host: str, port: int, state_dir: str | None, dead_after: float, security: Security,
                  pending_ttl: float = 3600.0, capability_ttl: float = 86400.0, retire_after: float = 86400.0, *,
                  cluster_id: str | None = None, rebuild_grace: float | None = None,
                  catalog_class: type[CatalogServer] = CatalogServer, lease: str | None = None,
                  lease_seconds: float = LEASE_SECONDS, advertise: str | None = None) -> CatalogServer:
    """A catalog whose SQLite state lives in ``state_dir`` (default: the per-user data directory), readable by its owner
    only, or, with ``lease`` (a PostgreSQL URL), in that database, shared with the cluster's other catalogs;
    ``catalog_class``: the catalog with whatever the caller adds to it (the CLI's speaks Flight SQL)."""
    state = Path(state_dir) if state_dir else default_state_dir()
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)

    def build() -> CatalogServer:
        try:
            return catalog_class(host, port, state_path=str(state / "catalog.sqlite"), dead_after=dead_after,
                                 pending_ttl=pending_ttl, capability_ttl=capability_ttl, retire_after=retire_after,
                                 pool=security.pool(), cluster_id=cluster_id, rebuild_grace=rebuild_grace, lease=lease,
                                 lease_seconds=lease_seconds, advertise=advertise,
                                 **{**security.server_options(), "secret": security.catalog_secret()})
        except StateUnavailable as exc:
            raise CannotStart(f"--lease: {exc.message}; start PostgreSQL (or fix the address) and try again") from None
        except ImportError:
            raise CannotStart("--lease needs psycopg: pip install 'flightpart[ha]'") from None

    return listening(build, host, port, "catalog")


def run_catalog(host: str, port: int, state_dir: str | None, dead_after: float, security: Security, ports: Observability,
                pending_ttl: float = 3600.0, capability_ttl: float = 86400.0, retire_after: float = 86400.0, *,
                cluster_id: str | None = None, rebuild_grace: float | None = None,
                catalog_class: type[CatalogServer] = CatalogServer, lease: str | None = None,
                lease_seconds: float = LEASE_SECONDS, advertise: str | None = None) -> None:
    """``flightpart catalog``: serve until a signal."""
    security.check_exposure(host, "catalog")
    keep_freed_memory(declined="a catalog: it reads aggregates and windowed scans, under DuckDB's memory limit")
    server = start_catalog(host, port, state_dir, dead_after, security, pending_ttl, capability_ttl, retire_after,
                           cluster_id=cluster_id, rebuild_grace=rebuild_grace, catalog_class=catalog_class, lease=lease,
                           lease_seconds=lease_seconds, advertise=advertise)
    extras = observe(server, "catalog", host, ports)
    log_started("catalog", server.uri, server.state.cluster(), security, host)
    announce("catalog", server.uri)
    wait_for_signal([server, *extras])


def run_node(host: str, port: int, *, data_dir: str | None, catalog: str | None, node_port: int, state_dir: str | None,
             heartbeat: float, dead_after: float, max_partition_bytes: int | None, max_streams: int, advertise: str | None,
             security: Security, ports: Observability, min_free_bytes: int = 0, group: str | None = None,
             pending_ttl: float = 3600.0, capability_ttl: float = 86400.0, stream_idle_timeout: float = 60.0,
             cluster_id: str | None = None, rebuild_grace: float | None = None,
             scrub: tuple[int, float] = (64 << 20, 3600.0), catalog_class: type[CatalogServer] = CatalogServer) -> None:
    """``flightpart serve``: a node (and, without ``catalog``, a catalog in the same process), until a signal."""
    security.check_exposure(host, "node")
    servers: list = []
    if catalog is not None and port and any(one.split("://")[-1] in (f"{host}:{port}", f"{advertise}:{port}")
                                            for one in catalog.split(",")):
        raise CannotStart(f"--catalog {catalog} is this node's own address: start the catalog first (`flightpart catalog`) "
                          "and give the node another --port, or drop --catalog to run node and catalog in one process")
    if catalog is None:
        embedded = start_catalog(host, port, state_dir, dead_after, security, pending_ttl, capability_ttl,
                                 cluster_id=cluster_id, rebuild_grace=rebuild_grace, catalog_class=catalog_class)
        servers.append(embedded)
        catalog, port = embedded.uri, node_port
        log_started("catalog", embedded.uri, embedded.state.cluster(), security, host)
        announce("catalog", embedded.uri)
    elif security.secret() is not None:
        log.warning("this node holds the cluster secret, with which it could act as any writer, admin or node: give it "
                    "only its own --node-token-file and the --verify-key-file (see docs/operations/security.md)")
    node = listening(lambda: NodeServer(host, port, data_dir=data_dir, catalog=catalog, heartbeat_interval=heartbeat,
                                        advertise=advertise, max_partition_bytes=max_partition_bytes, max_streams=max_streams,
                                        stream_idle_timeout=stream_idle_timeout, min_free_bytes=min_free_bytes, group=group,
                                        pool=security.pool(), scrub_rate=scrub[0], scrub_interval=scrub[1],
                                        token=security.node_token(), **security.server_options()), host, port, "node")
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
    servers.extend(observe(node, "node", host, ports, catalog=servers[0] if len(servers) > 1 else None))
    log_started("node", node.uri, node.store.cluster, security, host)
    announce("node", node.uri)
    wait_for_signal(servers)
