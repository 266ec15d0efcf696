"""An embedded node and catalog in this process: ``fp.connect()`` with no address."""

from __future__ import annotations

import tempfile
from typing import Any

from flightpart.client import Client
from flightpart.client.fetch import check_streams
from flightpart.io.compression import check_mode
from flightpart.server.node import NodeServer
from flightpart.server.settings import CatalogSettings, NodeSettings
from flightpart.sql import SqlCatalogServer


class _TempDir:
    """Removes the embedded node's temporary data directory on close."""

    def __init__(self, tmp: tempfile.TemporaryDirectory):
        self.tmp = tmp

    def shutdown(self) -> None:
        self.tmp.cleanup()


def start_embedded(host: str | None = None, data_dir: str | None = None, **client_options: Any) -> Client:
    """Start a catalog and one node on ``host`` (default 127.0.0.1; ports chosen by the OS).

    ``client_options`` are the :class:`~flightpart.client.Client`'s own
    (timeout, idle_timeout, compression, streams_per_partition). Closing the
    client stops both (node first) and removes a temporary data directory if
    none was given.
    """
    host = host or "127.0.0.1"
    check_mode(client_options.get("compression", "auto"))  # a bad value is refused before anything starts
    check_streams(client_options.get("streams_per_partition", 1))
    owned: list = []  # shut down in reverse order
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="flightpart-")
        owned.append(_TempDir(tmp))
        data_dir = tmp.name
    catalog = SqlCatalogServer(CatalogSettings.in_process(host))
    owned.append(catalog)
    node = NodeServer(NodeSettings.in_process(host, data_dir=data_dir, catalog=catalog.uri))
    owned.append(node)
    node.register()
    return Client(catalog.uri, host=host, owned=owned, **client_options)
