"""The catalog's orders to nodes, which every part of the catalog gives: a manifest signed and sealed on its
holders, a version's files dropped, the partitions a commit names checked on the nodes that hold them, each sent to
many nodes at once (:meth:`NodeOrders.fan_out`) with the epoch of the lease it was given under.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import NodeUnavailable, SchemaMismatch
from flightpart.io.connections import ConnectionPool
from flightpart.tokens import Credential, manifest_signature
from flightpart.wire import Commit, CommitPart, DropFiles, Held, HeldPartition, RevocationEntry, Seal, error_message

from ..base import ServiceBase
from ..state import CatalogState
from ..state.records import NodeRecord, PartRecord, VersionRecord, order_key
from .lease import Lease

log = logging.getLogger("flightpart.catalog")


class NodeOrders(ServiceBase):
    """What the catalog tells nodes; the base of each part of :class:`~.server.CatalogServer`."""

    state: CatalogState
    pool: ConnectionPool
    lease: Lease | None
    fan_out_timeout: float  # seconds a node has to answer an order; one that misses it is told when it registers

    # the seams of users and grants, filled by the access part (:class:`~.access.AccessControl`)

    def require(self, credential: Credential, access: str, dataset: str, what: str, *, version: int | None = None,
                client: str = "") -> None:
        """``FORBIDDEN`` unless ``credential`` may ``access`` (read or write) ``dataset``."""
        raise NotImplementedError

    def visible(self, credential: Credential) -> Callable[[str], bool]:
        """Which dataset names ``credential`` may read."""
        raise NotImplementedError

    def revocation_entries(self) -> tuple[RevocationEntry, ...] | None:
        """Every revocation in force, as a node is told it (None without a secret)."""
        raise NotImplementedError

    def epoch(self) -> int | None:
        """The epoch orders to nodes carry (None without a lease)."""
        return self.lease.epoch if self.lease is not None else None

    def signed(self, manifest: Commit) -> Commit:
        """The manifest with this catalog's signature (a catalog rebuilding its state trusts only that)."""
        unsigned = dataclasses.replace(manifest, signature=None)  # a writer's commit may carry anything there
        if self.secret is None:
            return unsigned
        return dataclasses.replace(unsigned, signature=manifest_signature(self.secret, unsigned.to_json()))

    def seal(self, manifest: Commit, nodes: Any) -> int:
        """Tell the holders the version is committed; one that misses it is told when it registers again. How many
        were told."""
        cluster, manifest = self.state.cluster(), self.signed(manifest)
        order = Seal(cluster, manifest, self.epoch())
        return self.fan_out(nodes, lambda node: self.pool.action(node.uri, order, timeout=self.fan_out_timeout),
                             f"seal {manifest.dataset} v{manifest.version}")

    def verify_on_nodes(self, name: str, version: int, expected: pa.Schema, parts: list[PartRecord]) -> None:
        """Publish only what every claimed node really holds, with the right schema and rows."""
        by_node: dict[str, NodeRecord] = {n.node_id: n for p in parts for n in p.nodes}

        def held_by(node: NodeRecord) -> dict[tuple[int, int], tuple[HeldPartition, pa.Schema | None]]:
            out: dict[tuple[int, int], tuple[HeldPartition, pa.Schema | None]] = {}
            after = None
            while True:  # one page at a time: no reply size a large dataset can reach
                try:
                    reply = self.pool.action(node.uri, Held(name, version, after))
                except flight.FlightError as exc:
                    self.pool.discard(node.uri)
                    raise NodeUnavailable(f"node {node.uri} did not answer while committing {name} v{version}: "
                                          f"{error_message(exc)}") from None
                for k, h in enumerate(reply.partitions):
                    out[h.part] = (h, reply.schema(k))
                if not reply.more or not reply.partitions:
                    return out
                after = reply.partitions[-1].part

        with ThreadPoolExecutor(max_workers=min(32, len(by_node) or 1), thread_name_prefix="flightpart-verify") as ex:
            held = dict(zip(by_node, ex.map(held_by, by_node.values())))
        for p in parts:
            for node in p.nodes:
                h, h_schema = held[node.node_id].get(p.part, (None, None))
                if h is None:
                    raise SchemaMismatch(f"partition {p.part} of {name} v{version} is not stored on node {node.uri}",
                                         field="partitions")
                if h.rows != p.shape[0]:
                    raise SchemaMismatch(f"partition {p.part} of {name} v{version} on {node.uri} has {h.rows} rows, "
                                         f"expected {p.shape[0]}", field="partitions.shape")
                if h_schema is None or not h_schema.equals(group_schema(expected, h_schema)):
                    raise SchemaMismatch(f"partition {p.part} of {name} v{version} on {node.uri} has schema "
                                         f"{h_schema}, which does not fit {expected}", field="schema")
                p.nbytes = max(p.nbytes, h.nbytes)
                p.stats = p.stats or h.stats  # computed by the node from what it stored, never taken from the writer

    def drop_files(self, name: str, version: int | None, nodes: list[NodeRecord], *, pending_only: bool = False) -> int:
        """Tell the nodes to delete a version's files, in parallel; one that misses it is told when it registers."""
        through = self.state.dropped_through(name) if version is None and not pending_only else None
        order = DropFiles(name, version, self.state.cluster(), pending_only, through, self.epoch())
        what = order_key(name, version)
        # seen dead (or not heard from yet, just after a start): told when they register again
        self.state.must_register_all([n.node_id for n in nodes if not n.alive])
        live = [n for n in nodes if n.alive]
        self.state.expect_acknowledgements([n.node_id for n in live], what)
        told: list[str] = []

        def tell(node: NodeRecord) -> None:
            self.pool.action(node.uri, order, timeout=self.fan_out_timeout)
            told.append(node.node_id)

        count = self.fan_out(live, tell, f"drop {name} v{version}")
        self.state.told(told, what)  # the others stay ``missed`` (in the database): they register again, however late
        return count

    def fan_out(self, nodes: Any, call: Any, what: str) -> int:
        """Run ``call(node)`` for every node at once, each with its own deadline; returns how many succeeded."""
        nodes = list(nodes)
        if not nodes:
            return 0
        if self.lease is not None and not self.lease.leads():
            # the lease ran out since the state was written: orders are the new leader's to give (it tells nodes
            # what they missed, as after a restart); nodes would refuse this epoch's anyway once it leads
            log.warning("%s: not sent, this catalog no longer holds the lease", what)
            return 0

        failed: list[str] = []

        def one(node: NodeRecord) -> bool:
            try:
                call(node)
                return True
            except Exception as exc:
                log.info("%s: node %s did not answer (%s); it is told again when it registers", what, node.uri, exc)
                self.pool.discard(node.uri)
                failed.append(node.node_id)
                return False

        with ThreadPoolExecutor(max_workers=min(32, len(nodes)), thread_name_prefix="flightpart-fan-out") as ex:
            count = sum(ex.map(one, nodes))
        # their next heartbeats are refused: they register and learn what they missed
        self.state.must_register_all(failed)
        return count


def manifest_of(record: VersionRecord) -> Commit:
    """The manifest a node keeps beside a committed version's partitions (the commit body, replicas included)."""
    parts = tuple(CommitPart(p.part, p.start, p.shape, tuple(n.node_id for n in p.nodes)) for p in record.parts)
    return Commit(record.dataset, record.version, pa.ipc.read_schema(pa.py_buffer(record.schema)), record.shape,
                  record.grid, parts, record.replicas)


def group_schema(full: pa.Schema, part: pa.Schema) -> pa.Schema:
    """The fields of ``full`` a column-group partition is expected to carry."""
    fields = [full.field(name) for name in part.names if full.get_field_index(name) >= 0]
    return pa.schema(fields, metadata=part.metadata) if len(fields) == len(part.names) else full
