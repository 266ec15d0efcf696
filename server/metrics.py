"""Prometheus metrics of a daemon, read from its live counters and telemetry on each scrape.

Names follow Prometheus conventions (``flightpart_sent_bytes_total``); beside the daemon's counters: latency
histograms per RPC, refusals by reason, health, build information, and the standard ``process_*`` metrics.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.process_collector import ProcessCollector

from flightpart.version import __version__

from .telemetry import BUCKETS, Telemetry

COUNTERS = {  # stats key: (metric name without _total, help)
    "bytes_sent": ("flightpart_sent_bytes", "Bytes of partitions streamed to clients"),
    "rows_sent": ("flightpart_sent_rows", "Rows streamed to clients (after filters)"),
    "batches_sent": ("flightpart_sent_batches", "Record batches streamed to clients"),
    "partitions_served": ("flightpart_served_partitions", "Partitions streamed (do_get calls answered)"),
    "bytes_received": ("flightpart_received_bytes", "Bytes of partitions received by do_put"),
    "partitions_stored": ("flightpart_stored_partitions", "Partitions stored"),
    "put_streams": ("flightpart_put_streams", "do_put streams received (one carries several small partitions)"),
    "partitions_assembled": ("flightpart_assembled_partitions",
                             "Partitions of a new grid built from pulled and local rows (repartition, rebalance)"),
    "partitions_linked": ("flightpart_linked_partitions", "Partitions of a new version that share an unchanged file "
                                                          "(append, rebalance)"),
    "assembled_rows": ("flightpart_assembled_rows", "Rows gathered to build partitions of a new grid"),
    "pulled_bytes": ("flightpart_pulled_bytes", "Bytes pulled from other nodes to build partitions"),
    "streams_compressed": ("flightpart_compressed_streams", "Read streams sent compressed (the reader asked and a "
                                                            "sample shrank)"),
    "stale_orders": ("flightpart_stale_orders", "Orders refused because they came from a catalog that no longer leads"),
    "sql_queries_abandoned": ("flightpart_sql_queries_abandoned", "SQL queries stopped because their caller gave up"),
    "sql_queries_refused_busy": ("flightpart_sql_queries_refused_busy",
                                 "SQL queries refused BUSY: too many waiting, or waited too long for a slot"),
    "udp_heartbeats_taken": ("flightpart_udp_heartbeats_taken", "Heartbeats taken in UDP datagrams"),
    "udp_heartbeats_declined": ("flightpart_udp_heartbeats_declined",
                                "Heartbeat datagrams answered 'not taken' (the node sends the beat over Flight)"),
    "heartbeats_late": ("flightpart_late_heartbeats",
                        "Heartbeats that waited before the catalog handled them (counted from when they were sent)"),
    "udp_datagrams_ignored": ("flightpart_udp_datagrams_ignored",
                              "Datagrams on the heartbeat port left unanswered: not a beat, or not signed as its "
                              "node's"),
}
GAUGES = {
    "partitions_held": ("flightpart_held_partitions", "Partitions in the node's data directory"),
    "open_streams": ("flightpart_open_streams", "do_get/do_put streams open now"),
    "maps_open": ("flightpart_open_maps", "Partition files the node keeps memory-mapped"),
    "free_bytes": ("flightpart_disk_free_bytes", "Free bytes on the node's data directory's file system"),
    "datasets": ("flightpart_datasets", "Datasets with a committed version"),
    "leader": ("flightpart_catalog_leader",
               "1 while this catalog holds the lease (catalogs sharing a --lease), else 0"),
    "epoch": ("flightpart_catalog_epoch", "The lease's epoch this catalog leads with (0: it does not lead)"),
    "sql_queries_running": ("flightpart_sql_queries_running", "SQL queries the catalog runs now"),
    "sql_queries_waiting": ("flightpart_sql_queries_waiting", "SQL queries waiting for a slot"),
}


class DaemonCollector:
    """Turns a daemon's ``stats()``, ``problems()`` and telemetry into metric families, labelled by role."""

    def __init__(self, role: str, stats: Callable[[], dict[str, Any]], telemetry: Telemetry,
                 problems: Callable[[], list[str]] | None = None):
        self.role = role
        self.stats = stats
        self.telemetry = telemetry
        self.problems = problems

    def collect(self) -> Iterable:
        values = numbers_of(self.stats())
        for key, (name, doc) in COUNTERS.items():
            if key in values:
                yield self._one(CounterMetricFamily(name, doc, labels=["role"]), values[key])
        for key, (name, doc) in GAUGES.items():
            if key in values:
                yield self._one(GaugeMetricFamily(name, doc, labels=["role"]), values[key])
        if "nodes_alive" in values:
            nodes = GaugeMetricFamily("flightpart_nodes", "Nodes the catalog knows, by state", labels=["role", "state"])
            nodes.add_metric([self.role, "alive"], values["nodes_alive"])
            nodes.add_metric([self.role, "dead"], values.get("nodes_dead", 0))
            nodes.add_metric([self.role, "unknown"], values.get("nodes_unknown", 0))
            yield nodes
        refusals = CounterMetricFamily("flightpart_refusals", "Calls refused, by reason (the error code, lower case)",
                                       labels=["role", "reason"])
        for reason, count in sorted(self.telemetry.refusals().items()):
            refusals.add_metric([self.role, reason], count)
        yield refusals
        decisions = CounterMetricFamily("flightpart_access_decisions", "Decisions on access (sign-ins, grants, reads "
                                        "and queries allowed or refused), by action and outcome",
                                        labels=["role", "action", "outcome"])
        for (action, outcome), count in sorted(self.telemetry.decisions().items()):
            decisions.add_metric([self.role, action, outcome], count)
        yield decisions
        latency = HistogramMetricFamily("flightpart_rpc_duration_seconds",
                                        "Time to answer a call, by RPC (a stream: until it is complete)",
                                        labels=["role", "rpc"])
        for rpc, (counts, total, _count) in sorted(self.telemetry.histograms().items()):
            latency.add_metric([self.role, rpc], _cumulative(counts), total)
        yield latency
        queries = self.telemetry.measures().get("sql_query")
        if queries is not None:
            sql = HistogramMetricFamily("flightpart_sql_query_duration_seconds",
                                        "Time to answer a SQL query at the catalog (its rows produced, or its "
                                        "endpoints at the nodes handed out)", labels=["role"])
            sql.add_metric([self.role], _cumulative(queries[0]), queries[1])
            yield sql
        # a node's stats carry its problems already: its disk is not asked twice per scrape
        if self.problems is not None:
            problems = values["problems"] if isinstance(values.get("problems"), list) else self.problems()
            yield self._one(GaugeMetricFamily("flightpart_healthy", "1 while the daemon reports SERVING, else 0",
                                              labels=["role"]),
                            0 if problems else 1)
        build = InfoMetricFamily("flightpart_build", "Versions this daemon runs",
                                 labels=["role", "version", "pyarrow", "python"])
        build.add_metric([self.role, __version__, pa.__version__, platform.python_version()], {})
        yield build

    def _one(self, family: Any, value: float) -> Any:
        family.add_metric([self.role], value)
        return family


def _cumulative(counts: list[int]) -> list[tuple[str, int]]:
    """Counts per bucket as Prometheus's cumulative buckets, the last one +Inf."""
    out, running = [], 0
    for bound, n in zip([*map(str, BUCKETS), "+Inf"], counts):
        running += n
        out.append((bound, running))
    return out


def numbers_of(stats: Any) -> dict[str, Any]:
    """The entries of a stats dict a metric can carry (numbers, and ``problems``); one wrong value costs only
    its own metric."""
    if not isinstance(stats, dict):
        return {}
    return {key: value for key, value in stats.items()
            if key == "problems"
            or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))}


def metrics_registry(role: str, stats: Callable[[], dict[str, Any]], telemetry: Telemetry,
                     problems: Callable[[], list[str]] | None = None) -> CollectorRegistry:
    """A registry with the daemon's metrics and this process's ``process_*`` metrics."""
    registry = CollectorRegistry()
    registry.register(DaemonCollector(role, stats, telemetry, problems))
    ProcessCollector(registry=registry)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus's text format."""
    return generate_latest(registry)
