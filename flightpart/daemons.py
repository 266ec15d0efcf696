"""Running daemons from the command line: start, announce readiness, stop on signal.

A daemon prints one line ``READY <role> <uri>`` on stdout once it accepts
calls, so a parent process (the demo, the tests, a supervisor) can wait for
it without guessing ports or sleeping.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence


def wait_for_signal(servers: Sequence) -> None:
    """Block until SIGINT/SIGTERM, then shut the servers down (last first)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    for server in reversed(servers):
        server.shutdown()


def announce(role: str, uri: str) -> None:
    print(f"READY {role} {uri}", flush=True)


class Daemon:
    """A ``flightpart`` daemon run as a child process."""

    def __init__(self, args: Sequence[str], *, env: dict | None = None, timeout: float = 60.0):
        self.args = [sys.executable, "-m", "flightpart", *args]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.uris: dict[str, str] = {}
        wanted = "node" if args[0] == "serve" else "catalog"
        deadline = time.monotonic() + timeout
        while True:
            line = self.proc.stdout.readline()
            if not line:
                err = self.proc.stderr.read()
                raise RuntimeError(f"{' '.join(args)} exited before it was ready:\n{err[-2000:]}")
            if line.startswith("READY "):
                _, role, uri = line.split()
                self.uris[role] = uri
                if role == wanted:
                    break
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{' '.join(args)} not ready after {timeout}s")

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
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()

    def kill(self) -> None:
        """kill -9: no shutdown, as a crash would."""
        self.proc.kill()
        self.proc.wait()


class LocalCluster:
    """A catalog and nodes on 127.0.0.x as child processes: one machine playing several hosts."""

    def __init__(self, root: Path, nodes: int = 3, *, first_ip: int = 2, heartbeat: float = 1.0, dead_after: float = 10.0,
                 extra_args: Sequence[str] = (), node_args: Sequence[str] = (), env: dict | None = None, catalog_port: int = 0):
        self.root = Path(root)
        self.extra_args = list(extra_args)  # for every daemon (tokens, TLS)
        self.node_args = list(node_args)    # for nodes only (limits)
        self.env = env
        self.dead_after = dead_after
        self.catalog_port = catalog_port
        self.catalog = self.start_catalog()
        self.nodes: list[Daemon] = []
        try:
            for k in range(nodes):
                self.add_node(f"127.0.0.{first_ip + k}", heartbeat=heartbeat)
        except BaseException:
            self.stop()
            raise

    def start_catalog(self) -> Daemon:
        """Start (or restart, on the same port and state) the catalog."""
        return Daemon(["catalog", "--host", "127.0.0.1", "--port", str(self.catalog_port), "--state-dir", str(self.root / "catalog"),
                       "--dead-after", str(self.dead_after), *self.extra_args], env=self.env)

    def add_node(self, ip: str, *, heartbeat: float = 1.0, data_dir: Path | None = None) -> Daemon:
        data_dir = data_dir or self.root / f"node-{ip}"
        node = Daemon(["serve", "--host", ip, "--port", "0", "--data-dir", str(data_dir), "--catalog", self.catalog.uri,
                       "--heartbeat", str(heartbeat), *self.extra_args, *self.node_args], env=self.env)
        self.nodes.append(node)
        return node

    @property
    def uri(self) -> str:
        return self.catalog.uri

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.catalog.stop()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
