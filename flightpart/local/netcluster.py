"""A cluster whose hosts are network namespaces: real sockets between hosts, links with a real bandwidth.

Each host gets a network namespace, joined by a veth pair to a bridge in a namespace of its own (the
machine's network is untouched), each link can be shaped by ``tbf``; addresses come from 198.18.0.0/15.
Namespaces are named after the process that made them, so the next cluster sweeps away those of an owner
that died (:func:`sweep`), daemons inside included.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .cluster import Daemon

PREFIX = "fpns"
SUBNET = "198.18.0"
OPEN = ("--insecure",)
"""The hosts' daemons run open on the namespaces' own network (no secret), which they must be told beyond loopback."""
_clusters = itertools.count()


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()[:200]}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def namespaces() -> list[str]:
    """Every namespace a cluster of this module made (of any owner)."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def _owner(namespace: str) -> int | None:
    match = re.match(rf"{PREFIX}(\d+)c", namespace)
    return int(match.group(1)) if match else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove(namespace: str) -> None:
    """Kill whatever runs in ``namespace``, then delete it (its veth ends go with it)."""
    pids = _ip("netns", "pids", namespace, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _ip("netns", "del", namespace, check=False)


def sweep() -> list[str]:
    """Remove the namespaces of clusters whose owning process is gone; returns their names."""
    stale = [ns for ns in namespaces() if (owner := _owner(ns)) is not None and not _alive(owner)]
    for ns in stale:
        remove(ns)
    return stale


@dataclass
class Host:
    """One host: a namespace on the bridge and its address, or (namespace None) a loopback alias of this machine."""

    namespace: str | None
    ip: str

    def launcher(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace] if self.namespace else []

    def env(self) -> dict[str, str]:
        """For every process on the host: ``FLIGHTPART_HOST`` names a loopback alias; in a namespace it is
        empty, so the host is found from the namespace's interfaces."""
        return {"FLIGHTPART_HOST": "" if self.namespace else self.ip}

    def environ(self, extra: dict | None = None) -> dict[str, str]:
        """This process's environment, the host's variables and ``extra``: what every process on the host gets."""
        return {**os.environ, **self.env(), **(extra or {})}

    def popen(self, argv: Sequence[str], *, env: dict | None = None, **kwargs) -> subprocess.Popen:
        """``argv`` started on this host."""
        return subprocess.Popen([*self.launcher(), *argv], env=self.environ(env), **kwargs)

    def run(self, code: str, *, env: dict | None = None, timeout: float = 300.0) -> subprocess.CompletedProcess:
        """``python -c code`` on this host."""
        return subprocess.run([*self.launcher(), sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout, env=self.environ(env))


class NetCluster:
    """A catalog and ``nodes`` nodes, each on a host (namespace) of its own, links shaped to ``rate``.

    ``rate``: a ``tc`` rate such as ``"1gbit"`` (None: unshaped). :meth:`add_host` makes further hosts. With
    ``loopback`` the hosts are 127.0.0.1, .2, ... instead (no root, no shaping), for comparison.
    """

    def __init__(self, root: Path, nodes: int = 3, *, rate: str | None = None, heartbeat: float = 1.0,
                 dead_after: float = 10.0, node_args: Sequence[str] = (), loopback: bool = False,
                 env: dict[str, str] | None = None):
        if loopback and rate:
            raise ValueError("a loopback cluster cannot be shaped")
        if not loopback:
            sweep()
        self.root = Path(root)
        self.rate = rate
        self.loopback = loopback
        self.env = dict(env or {})  # for every daemon, beside each host's own
        self.tag = f"{PREFIX}{os.getpid()}c{next(_clusters)}"
        self.hosts: list[Host] = []
        self.daemons: list[Daemon] = []
        self.bridge = f"{self.tag}-br"
        try:
            if not loopback:
                _ip("netns", "add", self.bridge)
                _ip("-n", self.bridge, "link", "set", "lo", "up")
                _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
                _ip("-n", self.bridge, "link", "set", "br0", "up")
            self.catalog_host = self.add_host()
            self.catalog = self._daemon(self.catalog_host,
                                        ["catalog", "--host", self.catalog_host.ip, "--port", "0", *OPEN,
                                         "--state-dir", str(self.root / "catalog"),
                                         "--dead-after", str(dead_after)])
            self.nodes: list[Daemon] = []
            self.node_hosts: list[Host] = []
            for _ in range(nodes):
                host = self.add_host()
                self.node_hosts.append(host)
                self.nodes.append(self._daemon(host, ["serve", "--host", host.ip, "--port", "0", *OPEN, "--data-dir",
                                                      str(self.root / f"node-{host.ip}"), "--catalog", self.catalog.uri,
                                                      "--heartbeat", str(heartbeat), *node_args]))
        except BaseException:
            self.stop()
            raise

    @property
    def uri(self) -> str:
        return self.catalog.uri

    def add_host(self) -> Host:
        """A new namespace joined to the bridge by a veth pair, with the next address."""
        k = len(self.hosts) + 1
        if self.loopback:
            host = Host(None, f"127.0.0.{k}")
            self.hosts.append(host)
            return host
        host = Host(f"{self.tag}-h{k}", f"{SUBNET}.{k}")
        _ip("netns", "add", host.namespace)
        self.hosts.append(host)
        port = f"p{k}"
        _ip("link", "add", "eth0", "netns", host.namespace, "type", "veth", "peer", "name", port, "netns", self.bridge)
        _ip("-n", self.bridge, "link", "set", port, "master", "br0")
        _ip("-n", self.bridge, "link", "set", port, "up")
        _ip("-n", host.namespace, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip("-n", host.namespace, "link", "set", "eth0", "up")
        _ip("-n", host.namespace, "link", "set", "lo", "up")
        if self.rate:
            self._shape(host.namespace, "eth0")
            self._shape(self.bridge, port)
        return host

    def _shape(self, namespace: str, device: str) -> None:
        """Egress of ``device`` limited to the cluster's rate (each direction of a link is shaped once)."""
        bits = rate_bits(self.rate)
        burst = max(bits // 8 // 250, 64 << 10)  # at least a tick's worth of bytes at HZ=250
        subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", device, "root", "tbf", "rate",
                        self.rate, "burst", str(burst), "latency", "50ms"], check=True, capture_output=True, text=True)

    def _daemon(self, host: Host, args: list[str]) -> Daemon:
        daemon = Daemon(args, launcher=host.launcher(), env={**self.env, **host.env()})
        self.daemons.append(daemon)
        return daemon

    def node_on(self, k: int) -> tuple[Daemon, Host]:
        return self.nodes[k], self.node_hosts[k]

    def stop(self) -> None:
        """Stop every daemon, then remove every namespace (processes left inside are killed)."""
        for daemon in reversed(self.daemons):
            try:
                daemon.stop()
            except Exception:
                pass
        if self.loopback:
            return
        for host in self.hosts:
            remove(host.namespace)
        remove(self.bridge)

    def __enter__(self) -> NetCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def rate_bits(rate: str) -> int:
    """A tc rate ("1gbit", "500mbit", "10gbit") in bits per second."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.strip().lower())
    if not match:
        raise ValueError(f"rate: expected a tc rate such as 1gbit or 500mbit, got {rate!r}")
    return int(float(match.group(1)) * {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[match.group(2)])
