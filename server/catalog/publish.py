"""SPMD publish: the ranks of a job each store their part and join one pending version of their writer's,
committed by the last rank in.
"""

from __future__ import annotations

import logging

import pyarrow as pa

from flightpart.errors import RequestRejected, SchemaMismatch, VersionConflict
from flightpart.wire import PublishBegin, PublishPart, PublishReply, VersionReply

from ..base import Action
from ..state.records import PartRecord
from .orders import NodeOrders, manifest_of

log = logging.getLogger("flightpart.catalog")


class Publishing(NodeOrders):
    """One version from many ranks."""

    def _publish_begin(self, b: PublishBegin) -> VersionReply:
        if not b.rank < b.nranks:
            raise RequestRejected(f"publish-begin: rank {b.rank} is not in [0, {b.nranks})", field="publish-begin.rank")
        self.require(self.caller.credential, "write", b.dataset, "publish")
        self.cluster_for_write()
        # a rank joins its own writer's open publish (another writer's cannot hold it up), opened if there is none
        version = self.state.join_publish(b.dataset, b.nranks, b.rank, writer=self.writer(),
                                          most_pending=self.pending_share())
        return VersionReply(version, self.grant(b.dataset, version))

    def _publish_part(self, b: PublishPart) -> PublishReply:
        name, version = b.dataset, b.version
        self.require(self.caller.credential, "write", name, "publish", version=version)
        self.check_writer(name, version, "publish")
        state = self.state.version_state(name, version)
        if state is None or state[0] != "pending" or state[1] is None:
            raise RequestRejected(f"publish-part: {name} v{version} is not an open SPMD publish",
                                  field="publish-part.version")
        nranks = state[1]
        first = self.state.version_schema(name, version)
        if first is not None and not pa.ipc.read_schema(pa.py_buffer(first)).equals(b.schema):
            raise SchemaMismatch(f"rank {b.rank} sent schema {b.schema}, other ranks sent "
                                 f"{pa.ipc.read_schema(pa.py_buffer(first))}",
                                 field="publish-part.schema")
        if b.node_id not in {n.node_id for n in self.state.nodes()}:
            raise RequestRejected(f"publish-part: unknown node {b.node_id!r}", field="publish-part.node_id")
        schema_bytes = b.schema.serialize().to_pybytes()
        joined = self.state.add_rank_part(name, version, b.rank, b.rows, b.cols, 0, b.node_id, schema_bytes)
        if joined < nranks:
            return PublishReply(version, False, joined)
        # the last rank in commits; the node checks run without holding the database
        nodes = {n.node_id: n for n in self.state.nodes()}
        start, parts = 0, []
        for rank, rows, cols, node_id in self.state.rank_parts(name, version):
            parts.append(PartRecord((rank, 0), (start, 0), (rows, cols), 0, [nodes[node_id]]))
            start += rows
        self.verify_on_nodes(name, version, b.schema, parts)
        try:
            with self.outcome_watched(name, version):
                self.state.commit(name, version, schema_bytes, (start, parts[0].shape[1]), (nranks, 1), parts)
        except VersionConflict:
            return PublishReply(version, True, joined)  # another last rank committed it first, and sealed it
        # its holders are told, as a writer's commit tells them (an SPMD version had been sealed only when its nodes
        # registered again: not rebuildable from them until then, and its rows no reader's)
        holders = {n.node_id: n for p in parts for n in p.nodes}
        if self.seal(manifest_of(self.state.version(name, version)), holders.values()) == len(holders):
            self.state.sealed_everywhere(name, version)
        return PublishReply(version, True, joined)


ACTIONS = (
    Action(PublishBegin, Publishing._publish_begin, "SPMD: join (or open) the pending publish of a dataset", "write",
           changes_state=False),
    Action(PublishPart, Publishing._publish_part, "SPMD: one rank's part is stored; commits when all ranks are in",
           "write"),
)
"""The actions this part serves, added to the catalog's table (:attr:`~.server.CatalogServer.actions`)."""
