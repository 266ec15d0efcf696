"""Daemons as child processes: one machine playing a cluster of hosts on 127.0.0.x.

Each daemon is a real ``flightpart serve`` or ``flightpart catalog`` process, ready once it prints its
``READY`` line (:mod:`flightpart.server.daemon`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Daemon:
    """A ``flightpart`` daemon run as a child process.

    Its logs go to a temporary file, never to a pipe, which nobody reads while it runs and which would block
    the daemon once full. :meth:`log` reads the file through its own descriptor; :meth:`stop` removes it.
    """

    def __init__(self, args: Sequence[str], *, env: dict | None = None, timeout: float = 60.0,
                 launcher: Sequence[str] = ()):
        self.args = [*launcher, sys.executable, "-m", "flightpart", *args]  # launcher: e.g. ip netns exec NS
        fd, self.log_path = tempfile.mkstemp(prefix="flightpart-daemon-", suffix=".log")
        os.close(fd)
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=log, text=True,
                                         env={**os.environ, **(env or {})})
        self.uris: dict[str, str] = {}
        command = next((a for a in args if a in ("serve", "catalog")), None)
        if command is None:
            raise ValueError(f"{' '.join(args)}: a daemon runs `serve` or `catalog`")
        wanted = "node" if command == "serve" else "catalog"
        deadline = time.monotonic() + timeout
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                said = self.log()[-2000:]
                self._release()  # what it wrote goes into the error; no file is left behind
                raise RuntimeError(f"{' '.join(args)} exited before it was ready:\n{said}")
            if line.startswith("READY "):
                _, role, uri = line.split()
                self.uris[role] = uri
                if role == wanted:
                    break
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{' '.join(args)} not ready after {timeout}s")

    def log(self) -> str:
        """Everything the daemon wrote to stderr so far."""
        try:
            with open(self.log_path, errors="replace") as log:
                return log.read()
        except FileNotFoundError:
            return ""

    @property
    def uri(self) -> str:
        return self.uris.get("node") or self.uris["catalog"]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._release()

    def kill(self) -> None:
        """kill -9: no shutdown, as a crash would."""
        self.proc.kill()
        self.proc.wait()
        self._release()

    def _release(self) -> None:
        """Close the READY pipe and remove the log file."""
        if self.proc.stdout:
            self.proc.stdout.close()
        if os.path.exists(self.log_path):
            os.unlink(self.log_path)


class Cluster:
    """What every cluster on this machine offers a test or a demo: the catalog's URI, its nodes, a ``with`` block."""

    catalog: Any
    nodes: list

    @property
    def uri(self) -> str:
        return self.catalog.uri

    def stop(self) -> None:
        raise NotImplementedError

    def add_node(self, ip: str, *, heartbeat: float = 1.0) -> Any:
        raise NotImplementedError

    def add_nodes(self, count: int, first_ip: int, heartbeat: float) -> None:
        """Start ``count`` nodes on 127.0.0.``first_ip``, ...; on any failure stop everything started so far."""
        try:
            for k in range(count):
                self.add_node(f"127.0.0.{first_ip + k}", heartbeat=heartbeat)
        except BaseException:
            self.stop()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass(frozen=True)
class ClusterOptions:
    """How a :class:`LocalCluster` runs its daemons: nodes on 127.0.0.``first_ip`` on, beating every ``heartbeat``
    seconds; ``extra_args`` for every daemon (tokens, TLS), ``node_args`` for nodes only (limits), ``catalog_args``
    for the catalog only; ``env`` their
    environment; the catalog on ``catalog_port`` (0: any), with ``dead_after`` and ``rebuild_grace`` (nodes here
    beat every second: three beats to hear them all after a loss)."""

    first_ip: int = 2
    heartbeat: float = 1.0
    dead_after: float = 10.0
    extra_args: Sequence[str] = ()
    node_args: Sequence[str] = ()
    catalog_args: Sequence[str] = ()
    env: dict | None = None
    catalog_port: int = 0
    rebuild_grace: float = 3.0


class LocalCluster(Cluster):
    """A catalog and nodes on 127.0.0.x as child processes: one machine playing several hosts; ``options`` are those
    of :class:`ClusterOptions`."""

    def __init__(self, root: Path, nodes: int = 3, **options: Any):
        given = ClusterOptions(**options)
        self.root = Path(root)
        self.extra_args = list(given.extra_args)  # for every daemon (tokens, TLS)
        self.node_args = list(given.node_args)    # for nodes only (limits)
        self.catalog_args = list(given.catalog_args)
        self.env = given.env
        self.dead_after = given.dead_after
        self.catalog_port = given.catalog_port
        self.rebuild_grace = given.rebuild_grace
        self.catalog = self.start_catalog()
        self.nodes: list[Daemon] = []
        self.add_nodes(nodes, given.first_ip, given.heartbeat)

    def start_catalog(self) -> Daemon:
        """Start (or restart, on the same port and state) the catalog."""
        return Daemon(["catalog", "--host", "127.0.0.1", "--port", str(self.catalog_port), "--state-dir",
                       str(self.root / "catalog"), "--dead-after", str(self.dead_after), "--rebuild-grace",
                       str(self.rebuild_grace), *self.extra_args, *self.catalog_args],
                      env=self.env)

    def add_node(self, ip: str, *, heartbeat: float = 1.0, data_dir: Path | None = None,
                 args: Sequence[str] = ()) -> Daemon:
        """Start a node on ``ip`` (``args``: options for this node alone)."""
        data_dir = data_dir or self.root / f"node-{ip}"
        node = Daemon(["serve", "--host", ip, "--port", "0", "--data-dir", str(data_dir), "--catalog", self.catalog.uri,
                       "--heartbeat", str(heartbeat), *self.extra_args, *self.node_args, *args], env=self.env)
        self.nodes.append(node)
        return node

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.catalog.stop()
