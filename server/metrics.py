"""Prometheus metrics of a daemon, read from its live counters on each scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

COUNTERS = {
    "bytes_sent": "Bytes of partitions streamed to clients",
    "rows_sent": "Rows streamed to clients (after filters)",
    "batches_sent": "Record batches streamed to clients",
    "partitions_served": "Partitions streamed (do_get calls answered)",
    "bytes_received": "Bytes of partitions received by do_put",
    "partitions_stored": "Partitions stored",
    "put_streams": "do_put streams received (one carries several small partitions)",
    "partitions_assembled": "Partitions of a new grid built from pulled and local rows (repartition, rebalance)",
    "partitions_linked": "Partitions of a new version that share an unchanged file (append, rebalance)",
    "assembled_rows": "Rows gathered to build partitions of a new grid",
    "pulled_bytes": "Bytes pulled from other nodes to build partitions",
    "streams_compressed": "Read streams sent compressed (the reader asked and a sample of the data shrank)",
    "errors": "Requests refused as invalid or not found",
    "refused_calls": "Calls refused (bad token or stream limit)",
}
GAUGES = {
    "partitions_held": "Partitions in the node's data directory",
    "open_streams": "do_get/do_put streams open now",
    "datasets": "Datasets with a committed version",
    "nodes_alive": "Nodes heard from within the dead-after timeout",
    "nodes_dead": "Nodes not heard from within the dead-after timeout",
}


class StatsCollector:
    """Turns a ``stats()`` dict into ``flightpart_*`` metric families."""

    def __init__(self, role: str, stats: Callable[[], dict[str, Any]]):
        self.role = role
        self.stats = stats

    def collect(self) -> Iterable:
        values = self.stats()
        for key, doc in COUNTERS.items():
            if key in values:
                family = CounterMetricFamily(f"flightpart_{key}", doc, labels=["role"])
                family.add_metric([self.role], values[key])
                yield family
        for key, doc in GAUGES.items():
            if key in values:
                family = GaugeMetricFamily(f"flightpart_{key}", doc, labels=["role"])
                family.add_metric([self.role], values[key])
                yield family


def serve_metrics(host: str, port: int, role: str, stats: Callable[[], dict[str, Any]]) -> Any:
    """Start the HTTP exporter; returns the server (``.shutdown()`` stops it)."""
    registry = CollectorRegistry()
    registry.register(StatsCollector(role, stats))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
