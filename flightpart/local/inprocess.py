"""A catalog and nodes as servers inside this process, each node on its own loopback address.

For tests that neither kill, freeze nor restart a daemon: the same server classes the daemons run, on real
sockets, streamed over gRPC as from another host (direct reads off). Its surface is
:class:`~flightpart.local.cluster.LocalCluster`'s (``uri``, ``nodes[i].uri``, ``add_node``, ``with``).
"""

from __future__ import annotations

import os
from pathlib import Path

from flightpart.server.node import NodeServer
from flightpart.server.settings import CatalogSettings, Identity, NodeSettings
from flightpart.sql import SqlCatalogServer

from .cluster import Cluster


class InProcessNode:
    """One node server of an :class:`InProcessCluster`, named as a :class:`~flightpart.local.cluster.Daemon` is."""

    def __init__(self, server: NodeServer):
        self.server = server

    @property
    def uri(self) -> str:
        return self.server.uri

    @property
    def pid(self) -> int:
        return os.getpid()

    def log(self) -> str:
        """Empty: an in-process server logs through this process's logging."""
        return ""

    def stop(self) -> None:
        self.server.shutdown()


class InProcessCluster(Cluster):
    """A catalog on 127.0.0.1 and ``nodes`` nodes on 127.0.0.``first_ip``, ``first_ip + 1``, ... in this process."""

    def __init__(self, root: Path, nodes: int = 3, *, first_ip: int = 2, heartbeat: float = 1.0,
                 dead_after: float = 10.0, rebuild_grace: float = 3.0):
        self.root = Path(root)
        self.heartbeat = heartbeat
        state = self.root / "catalog"
        state.mkdir(parents=True, exist_ok=True)
        self.catalog = SqlCatalogServer(CatalogSettings.in_process(state_dir=str(state), dead_after=dead_after,
                                                                   identity=Identity(rebuild_grace=rebuild_grace)))
        self.nodes: list[InProcessNode] = []
        self.add_nodes(nodes, first_ip, heartbeat)

    def add_node(self, ip: str, *, heartbeat: float | None = None, data_dir: Path | None = None) -> InProcessNode:
        """Start a node on ``ip``, registered with the catalog before this returns."""
        settings = NodeSettings.in_process(ip, data_dir=data_dir or self.root / f"node-{ip}", catalog=self.catalog.uri,
                                           heartbeat=heartbeat or self.heartbeat)
        server = NodeServer(settings, direct_reads=False)
        node = InProcessNode(server)
        self.nodes.append(node)
        server.register()
        return node

    def stop(self) -> None:
        """Nodes first, then the catalog; each stops once."""
        for node in self.nodes:
            node.stop()
        self.nodes = []
        if self.catalog is not None:
            self.catalog.shutdown()
            self.catalog = None  # type: ignore[assignment]
