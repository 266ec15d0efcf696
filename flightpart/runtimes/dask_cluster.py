"""flightpart on a Dask cluster: the catalog on the scheduler, one node per worker host.

A worker plugin runs on every worker, joining ones too; the worker that takes its host's file lock runs the
node. The lock dies with its process, so when that worker goes a later one on the host takes over.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import Any

from flightpart.runtimes.tasks import host_of

PLUGIN_NAME = "flightpart-node"
_catalog: dict[str, Any] = {}


def _start_catalog(dask_scheduler: Any = None, host: str = "127.0.0.1") -> str:
    from flightpart.server.catalog import CatalogServer
    from flightpart.server.settings import CatalogSettings

    if "server" not in _catalog:
        _catalog["server"] = CatalogServer(CatalogSettings.in_process(host))
    return _catalog["server"].uri


def _stop_catalog(dask_scheduler: Any = None) -> None:
    server = _catalog.pop("server", None)
    if server is not None:
        server.shutdown()


try:
    from distributed.diagnostics.plugin import WorkerPlugin as _WorkerPlugin
except Exception:  # pragma: no cover
    _WorkerPlugin = object


class NodePlugin(_WorkerPlugin):
    """Starts the flightpart node of this worker's host, once per host."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, catalog: str, data_dir: str | None = None):
        self.catalog = catalog
        self.data_dir = data_dir
        self.node = None
        self._lock_file = None

    def setup(self, worker: Any) -> None:
        host = host_of(worker.address)
        lock_path = Path(tempfile.gettempdir()) / f"flightpart-node-{host}.lock"
        handle = open(lock_path, "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return  # another worker on this host runs the node
        import platformdirs

        from flightpart.server.node import NodeServer
        from flightpart.server.settings import NodeSettings

        base = Path(self.data_dir) if self.data_dir else Path(platformdirs.user_data_dir("flightpart")) / "dask"
        self._lock_file = handle
        self.node = NodeServer(NodeSettings.in_process(host, data_dir=base / host, catalog=self.catalog))
        self.node.register()

    def teardown(self, worker: Any) -> None:
        if self.node is not None:
            self.node.shutdown()
            self.node = None
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None


def start(client: Any, data_dir: str | None = None, *, catalog_host: str | None = None) -> Any:
    """Start flightpart on a Dask cluster; returns a connected ``Client``."""
    from flightpart.client import Client

    host = catalog_host or host_of(client.scheduler.address)
    uri = client.run_on_scheduler(_start_catalog, host=host)
    client.register_plugin(NodePlugin(uri, data_dir), name=PLUGIN_NAME)
    return Client(uri)


def stop(client: Any) -> None:
    """Stop every node (the plugin's teardown) and the catalog."""
    try:
        client.unregister_worker_plugin(PLUGIN_NAME)
    except (ValueError, KeyError):
        pass
    client.run_on_scheduler(_stop_catalog)


def node_pids(client: Any) -> dict[str, int]:
    """The worker addresses whose process runs a node, with their PIDs."""
    def probe(dask_worker: Any = None) -> int | None:
        plugin = dask_worker.plugins.get(PLUGIN_NAME)
        return os.getpid() if plugin is not None and plugin.node is not None else None

    return {w: pid for w, pid in client.run(probe).items() if pid is not None}
