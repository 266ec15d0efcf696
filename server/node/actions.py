"""A node's own actions: who it is, what it counts and holds, and the builds of new versions it is asked for.

``assemble`` and ``relink`` build partitions of a version not yet committed (a repartition, a rebalance, an
append) and need the writer's grant for that version; the :class:`~flightpart.server.assembler.Assembler` does
the work.
"""

from __future__ import annotations

from flightpart.wire import (
    Assemble,
    AssembleReply,
    GetNodeInfo,
    GetStats,
    Held,
    HeldReply,
    NodeInfo,
    Relink,
    StatsReply,
    pages,
)

from ..assembler import Assembler
from ..auth import require_version_grant
from ..base import Action
from .shared import NodeBase, held_weight, within_limit


class NodeActions(NodeBase):
    """``node-info``, ``stats``, ``held``, ``assemble``, ``relink``."""

    assembler: Assembler

    def _node_info(self, _: GetNodeInfo) -> NodeInfo:
        return NodeInfo(**self.info())

    def _stats(self, _: GetStats) -> StatsReply:
        return StatsReply(self.stats())

    HELD_PAGE_BYTES = 4 << 20
    """About how much one page of a ``held`` reply may weigh; the catalog asks for the next page with ``after``."""

    def _held(self, body: Held) -> HeldReply:
        held = self.store.held(body.dataset, body.version, after=body.after, with_schema=False)
        page, more = next(pages(held, held_weight, self.HELD_PAGE_BYTES))
        groups = sorted({p.part[1] for p in page})
        schemas = [self.store.group_schema(body.dataset, body.version, j) for j in groups]
        index = {j: k for k, j in enumerate(groups)}
        return HeldReply(tuple(page), tuple(schemas), tuple(index[p.part[1]] for p in page), more)

    def _assemble(self, body: Assemble) -> AssembleReply:
        within_limit(body.dataset, body.version, "assemble.version")
        require_version_grant(getattr(self.caller, "guard", None), body.dataset, body.version, "assemble order")
        with self.counting_errors("assemble"):
            return self.assembler.run(body)

    def _relink(self, body: Relink) -> AssembleReply:
        within_limit(body.dataset, body.version, "relink.version")
        guard = getattr(self.caller, "guard", None)
        require_version_grant(guard, body.dataset, body.version, "relink order")
        # its source too: another writer's staged rows would otherwise be published as this writer's version
        require_version_grant(guard, body.dataset, body.source, "relink order's source", body.source_grant)
        with self.counting_errors("relink"):
            return self.assembler.relink(body)


NODE_ACTIONS = (
    Action(GetNodeInfo, NodeActions._node_info, "who this node is: id, uri, ip, pid, data dir, version", "locate",
           changes_state=False),
    Action(GetStats, NodeActions._stats, "bytes and batches served, partitions stored and held", "read",
           changes_state=False),
    Action(Held, NodeActions._held, "partitions of one dataset version on this node", "node", changes_state=False),
    Action(Assemble, NodeActions._assemble, "build partitions of a new grid from a committed version (repartition, "
           "rebalance, append): pulled from their holders, linked when unchanged", "write"),
    Action(Relink, NodeActions._relink, "link partitions this node holds into an uncommitted version (a stream append "
           "made again on top of a newer version)", "write"),
)
"""The node's own actions, for its action table."""
