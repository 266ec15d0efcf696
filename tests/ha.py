"""Several catalogs sharing a lease in a real PostgreSQL, with three nodes following them (process daemons), and the
faults a database meets: kill -9 of the server, and a link to it that is cut or whose answers are lost."""

from __future__ import annotations

import itertools
import os
import selectors
import signal
import socket
import threading
from pathlib import Path

import pyarrow as pa

import flightpart as fp
from flightpart.io.access import Access
from flightpart.io.connections import ConnectionPool
from flightpart.io.errors import translated
from flightpart.local.cluster import Daemon
from flightpart.local.postgres import LocalPostgres
from flightpart.tokens import role_token
from flightpart.wire import GetLeadership
from tests.helpers import free_port, wait_until


class HaCluster:
    """Catalogs on fixed addresses (so one can be started again where it was) and three nodes following them.

    ``urls`` gives a catalog its own address of the database (a :class:`PgProxy` in front of it); the others use
    ``url``. With ``secret``, every daemon is given it and :attr:`client` is a writer (not the owner)."""

    def __init__(self, url: str, tmp: Path, ips: list[str], catalogs: int = 2, lease_seconds: float = 3.0,
                 urls: dict[int, str] | None = None, secret: str | None = None):
        self.url, self.tmp, self.lease_seconds = url, tmp, lease_seconds
        self.addresses = [f"grpc://{ip}:{free_port()}" for ip in ips[:catalogs]]
        self.urls = {self.addresses[k]: u for k, u in (urls or {}).items()}
        self.guard: list[str] = []
        self.token: str | None = None
        if secret is not None:
            (tmp / "secret").write_text(secret + "\n")
            (tmp / "secret").chmod(0o600)
            self.guard = ["--secret-file", str(tmp / "secret")]
            self.token = role_token(secret.encode(), "writer", "ha-writer")
        self.catalogs: dict[str, Daemon | None] = {}
        for address in self.addresses:
            self.start_catalog(address)
        self.nodes = [Daemon(["serve", "--host", ip, "--port", "0", "--data-dir", str(tmp / f"n{k}"),
                              "--catalog", self.uri, "--heartbeat", "0.5", *self.guard])
                      for k, ip in enumerate(ips[catalogs:])]
        self.client = self.connect(timeout=10)
        wait_until(lambda: sum(n.alive for n in self.client.nodes()) == len(self.nodes), 30, "every node registered")

    @property
    def uri(self) -> str:
        return ",".join(self.addresses)

    def connect(self, **options) -> fp.Client:
        """A client of every catalog, with the writer's token where the cluster has a secret."""
        return fp.connect(self.uri, token=self.token, **options)

    def start_catalog(self, address: str) -> Daemon:
        host, port = address.removeprefix("grpc://").rsplit(":", 1)
        daemon = Daemon(["catalog", "--host", host, "--port", port, "--lease", self.urls.get(address, self.url),
                         "--lease-seconds", str(self.lease_seconds), "--state-dir", str(self.tmp / f"state-{host}"),
                         "--metrics-port", "0", *self.guard])
        self.catalogs[address] = daemon
        return daemon

    def at(self, address: str, request: fp.wire.Message):
        """``request`` answered by the catalog at ``address`` alone (no following), errors as flightpart's."""
        pool = ConnectionPool(Access(token=self.token) if self.token else None)
        try:
            with translated():
                return pool.action(address, request, timeout=5)
        finally:
            pool.close()

    def leadership(self, address: str) -> fp.wire.Leadership:
        return self.at(address, GetLeadership())

    def leader(self) -> str:
        return self.client.call(GetLeadership()).leader

    def stop(self) -> None:
        self.client.close()
        for daemon in [*self.nodes, *self.catalogs.values()]:
            if daemon is not None:
                daemon.stop()


_BASES = itertools.count(40, 10)


def ha_cluster(postgres: LocalPostgres, tmp: Path, database: str | None = None, **options) -> HaCluster:
    """A cluster on five loopback addresses of its own and a fresh database of ``postgres`` (``database``: one made
    already)."""
    base = next(_BASES)
    url = postgres.url(database) if database else postgres.database(f"ha_{os.getpid()}_{base}")
    return HaCluster(url, tmp, [f"127.0.0.{base + k}" for k in range(5)], **options)


def table(first: int, rows: int = 1000) -> pa.Table:
    return pa.table({"id": pa.array(range(first, first + rows), pa.int64()), "x": pa.array([1.5] * rows)})


def kill_postgres(postgres: LocalPostgres) -> None:
    """kill -9 of the server and every process it started (as a machine losing power would leave it); its data stays
    for :meth:`LocalPostgres.start`, which recovers it."""
    import psutil

    pid = int((postgres.data / "postmaster.pid").read_text().split()[0])
    main = psutil.Process(pid)
    everyone = [main, *main.children(recursive=True)]
    for process in everyone:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(everyone, timeout=30)


class PgProxy:
    """A TCP relay in front of PostgreSQL that a test can break as a network would.

    ``cut()``: every connection goes silent (bytes are taken and never passed on, nothing answers), new ones too,
    until ``mend()``. ``lose_commit_answer(marker)``: the next transaction whose statements contain ``marker`` has its
    COMMIT passed to the server, and the connection is dropped before the server's answer comes back."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self.target = (host, port)
        self.listener = socket.create_server((host, 0))
        self.port = self.listener.getsockname()[1]
        self._silent = threading.Event()
        self._marker: bytes | None = None
        self.answers_lost = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def url(self, database: str, user: str = "flightpart") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def cut(self) -> None:
        self._silent.set()

    def mend(self) -> None:
        self._silent.clear()

    def lose_commit_answer(self, marker: bytes) -> None:
        self._marker = marker

    def close(self) -> None:
        self._stop.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        held: list[socket.socket] = [client]
        try:
            if self._silent.is_set():
                self._stop.wait()  # a new connection to a cut link: accepted by the kernel, never answered
                return
            server = socket.create_connection(self.target)
            held.append(server)
            armed = False
            selector = selectors.DefaultSelector()
            selector.register(client, selectors.EVENT_READ, server)
            selector.register(server, selectors.EVENT_READ, client)
            while not self._stop.is_set():
                if self._silent.is_set():
                    self._stop.wait()  # bytes in flight are never passed on, the sockets stay open
                    return
                for key, _ in selector.select(timeout=0.1):
                    data = key.fileobj.recv(1 << 16)
                    if not data:
                        return
                    if key.fileobj is client and self._marker is not None:
                        if self._marker in data:
                            armed = True
                        if armed and b"COMMIT" in data:
                            self._marker = None
                            server.sendall(data)  # the server commits; its answer is never relayed
                            self.answers_lost += 1
                            return
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            for s in held:
                s.close()
