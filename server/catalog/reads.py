"""Reads: a dataset's FlightInfo (built once per version and state of the nodes), its schema, the listing of
datasets, and the status page's and stats action's facts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.tokens import capability
from flightpart.wire import (
    GetStats,
    PartInfo,
    StatsReply,
    VersionInfo,
    encode_flight_info,
    parse_dataset_path,
)

from ..auth import authorize, peer_ip, wall_clock
from ..base import Action, boundary, schema_error
from ..info_cache import FlightInfoCache
from ..state.records import VersionRecord
from ..status_page import cluster_status
from .orders import NodeOrders

log = logging.getLogger("flightpart.catalog")


def version_info(record: VersionRecord, cap: str | None = None) -> VersionInfo:
    """What the wire says of a stored version (replicas as (uri, ip, pid), live ones first)."""
    shared: dict[tuple[int, ...], tuple] = {}  # a few replica sets serve many partitions: one tuple each

    def replicas(nodes: list) -> tuple:
        key = tuple(map(id, nodes))
        found = shared.get(key)
        if found is None:
            found = shared[key] = tuple((n.uri, n.ip, n.pid) for n in nodes)
        return found

    parts = tuple(PartInfo(p.part, p.start, p.shape, replicas(p.nodes), p.nbytes, p.stats) for p in record.parts)
    return VersionInfo(record.dataset, record.version, pa.ipc.read_schema(pa.py_buffer(record.schema)), record.shape,
                       record.grid, parts, cap)


def peer_of(context: Any) -> str:
    """The caller's IP, for the audit trail ("" for a call made in this process)."""
    try:
        return peer_ip(context.peer()) if context is not None else ""
    except Exception:
        return ""


class Reads(NodeOrders):
    """What readers, the status page and the metrics endpoint ask of the catalog."""

    _infos: FlightInfoCache  # set by the composed server (:class:`~.server.CatalogServer`), as below
    _unsure: set[tuple[str, int]]
    _status_lock: threading.Lock
    _status: tuple[float, dict] | None

    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        with boundary(log, "get_flight_info", self.telemetry, context):
            credential = authorize(context, "read")
            name, version = parse_dataset_path(descriptor)
            issued = wall_clock()  # before the check: a revocation racing it voids what it hands out
            self.require(credential, "read", name, "open", version=version, client=peer_of(context))
            return self.opened_info(name, version, credential.expiry, credential.holder, issued)

    def opened_info(self, name: str, version: int | None, token_expiry: int = 0, holder: str = "",
                    issued: float | None = None) -> flight.FlightInfo:
        """The FlightInfo an open of ``name`` (its latest version, or ``version``) is given (:meth:`cached_info`: the
        same object while nothing it says changed), by Flight and by the catalog's own SQL."""
        # a commit's answer was lost: what the database took is sealed before anyone opens it (while the database
        # does not answer, opens go on from memory and the settling thread keeps trying)
        if self._unsure and (self.lease is None or self.lease.reachable):
            self.settle_unsure()
        version = self.state.latest(name) if version is None else version
        return self.cached_info(name, version, token_expiry, holder, issued)

    def get_schema(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        """A dataset's schema (``[name]`` or ``[name, version]``), as plain Flight clients ask for it."""
        with boundary(log, "get_schema", self.telemetry, context, schema_error):
            credential = authorize(context, "read")
            name, version = parse_dataset_path(descriptor)
            self.require(credential, "read", name, "schema", version=version, client=peer_of(context))
            version = self.state.latest(name) if version is None else version
            return flight.SchemaResult(self.cached_info(name, version, credential.expiry, credential.holder).schema)

    def cached_info(self, name: str, version: int, token_expiry: int = 0, holder: str = "",
                    issued: float | None = None) -> flight.FlightInfo:
        """Versions are immutable: their FlightInfo is built once per state of the nodes (and capability expiry and
        holder; ``issued``: when the caller's grant was checked, default now).

        With a cluster secret it carries a read capability for this version
        alone, its expiry rounded to a quarter of ``capability_ttl`` (one
        FlightInfo serves that quarter's opens) and never later than
        ``token_expiry`` of the token that asked (0: none). It names its
        ``holder`` (the credential's :attr:`~flightpart.tokens.Credential.holder`) and when it was made, so a
        withdrawal voids it on the nodes; every change to access forgets the FlightInfos built before it.
        """
        nodes = tuple((n.node_id, n.uri, n.alive) for n in self.state.nodes())
        quarter = max(self.capability_ttl / 4, 1.0)
        expiry = int((wall_clock() // quarter) * quarter + self.capability_ttl)
        if token_expiry:
            expiry = min(expiry, token_expiry)

        def build() -> tuple[flight.FlightInfo, int]:
            made = wall_clock() if issued is None else issued
            cap = capability(self.secret, name, version, expiry, holder, made) if self.secret is not None else None
            info = version_info(self.state.version(name, version), cap)
            return encode_flight_info(info), len(info.parts)

        return self._infos.get((name, version, expiry, holder), nodes, build)

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[flight.FlightInfo]:
        with boundary(log, "list_flights", self.telemetry, context):
            credential = authorize(context, "read")
            shown = self.visible(credential)
            infos = [encode_flight_info(version_info(record), with_endpoints=False) for record in self.state.datasets()
                     if shown(record.dataset)]
        return iter(infos)

    def after_action(self, name: str) -> None:
        self._infos.clear()  # replicas, versions or nodes may have changed

    STATUS_FRESH_SECONDS = 1.0
    """How long one gathering of the status page's facts serves every viewer (each asks every live node)."""

    def status(self) -> dict:
        """What the status page shows: nodes with their health and traffic, datasets with their grids; gathered at
        most once per :attr:`STATUS_FRESH_SECONDS`."""
        with self._status_lock:
            if self._status is None or time.monotonic() - self._status[0] > self.STATUS_FRESH_SECONDS:
                self._status = (time.monotonic(), cluster_status(self.state, self.pool,
                                                                 self.leadership().to_json()))
            return self._status[1]

    def stats(self) -> dict:
        """StatsReply for the ``stats`` action and the metrics endpoint."""
        nodes = self.state.nodes()
        unheard = self.state.unheard()  # just after a start or takeover: a node not heard from yet is not known dead
        out = {"datasets": len(self.state.datasets()), "nodes_alive": sum(n.alive for n in nodes),
               "nodes_dead": sum(not n.alive and n.node_id not in unheard for n in nodes),
               "nodes_unknown": sum(not n.alive and n.node_id in unheard for n in nodes),
               "refused_calls": self.guard.refused, "heartbeats_late": self.state.late_heartbeats}
        if self.lease is not None:
            out.update(leader=int(self.lease.leads()), epoch=self.lease.epoch or 0)
        if self.beats is not None:
            out.update(self.beats.counts())
        return out

    def _stats(self, _: GetStats) -> StatsReply:
        return StatsReply(self.stats())


ACTIONS = (
    Action(GetStats, Reads._stats, "datasets and nodes alive or dead", "read", changes_state=False),
)
"""The actions this part serves, added to the catalog's table (:attr:`~.server.CatalogServer.actions`)."""
