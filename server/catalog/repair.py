"""Repair and scrub: copy under-replicated partitions from a live holder to a live node without them, drop
replicas nodes report damaged, and have every live node check its files.
"""

from __future__ import annotations

import logging
import threading

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import FlightpartError, Forbidden, NotLeader, StaleEpoch, VersionConflict
from flightpart.io.connections import DEFAULT_TIMEOUT
from flightpart.io.errors import translate
from flightpart.io.transfer import put_deadline
from flightpart.tokens import put_grant
from flightpart.wire import (
    SCRUB_DEADLINE,
    ClusterScrubReport,
    CopyFailed,
    CopyTo,
    NodeScrubReport,
    PartPlace,
    Removed,
    Repair,
    RepairReport,
    ReplicaCopy,
    ReportDamage,
    Scrub,
    ScrubCluster,
)

from ..auth import CLOCK_MARGIN, wall_clock
from ..base import Action
from ..state.records import NodeRecord, PartRecord, VersionRecord
from ..while_alive import call_while_alive
from .orders import NodeOrders, manifest_of

log = logging.getLogger("flightpart.catalog")


class Repairs(NodeOrders):
    """Keeping every partition at its replica count, and its copies sound."""

    _repairing: threading.Lock  # set by the composed server (:class:`~.server.CatalogServer`), as below
    _stopping: threading.Event

    def _repair(self, _: Repair) -> RepairReport:
        """Copy every under-replicated partition from a live holder to a live node without it.

        Each copy waits at most the holder's own put deadline
        (:func:`~flightpart.io.transfer.put_deadline`, plus twice the node
        timeout); a node that failed once is not asked again in this repair.
        A failed copy is reported and the others go on. Repairs run one at a
        time, each planning from what the last left.
        """
        with self._repairing:
            self.wait_until_nodes_are_known()
            return self._repair_now()

    def _repair_now(self) -> RepairReport:
        live = [n for n in self.state.nodes() if n.alive]
        copies: list[ReplicaCopy] = []
        missing: list[PartPlace] = []
        failed: list[CopyFailed] = []
        silent: dict[str, str] = {}  # node id -> why it is not asked again in this repair
        load = {n.node_id: 0 for n in live}
        versions = self.state.all_versions()
        for record in versions:
            for p in record.parts:
                for n in p.nodes:
                    if n.node_id in load:
                        load[n.node_id] += 1
        for record in versions:
            schema = pa.ipc.read_schema(pa.py_buffer(record.schema))
            for p in record.parts:
                holders = [n for n in p.nodes if n.alive]
                if not holders:
                    missing.append(PartPlace(record.dataset, record.version, p.part))
                    continue
                held_by = {n.node_id for n in p.nodes}
                while len(holders) < record.replicas:
                    # the least loaded live node without it, nodes low on disk last
                    spare = sorted((n for n in live if n.node_id not in held_by),
                                   key=lambda n: (n.low_space, load[n.node_id]))
                    if not spare:
                        break  # fewer live nodes than replicas: the cluster's lack, not a failed copy
                    spare = [n for n in spare if n.node_id not in silent]
                    sources = [n for n in holders if n.node_id not in silent]
                    if not spare or not sources:
                        involved = {n.node_id for n in holders} | {n.node_id for n in live if n.node_id not in held_by}
                        why = "; ".join(f"{node_id}: {reason}" for node_id, reason in silent.items()
                                        if node_id in involved)
                        failed.append(CopyFailed(record.dataset, record.version, p.part,
                                                 f"no holder and target that answered ({why})"[:1000]))
                        break
                    target = spare[0]
                    if self.lease is not None and not self.lease.leads():
                        raise NotLeader("repair stopped: this catalog no longer holds the lease; run it again",
                                        field=self.lease.leader())
                    copied = self._copy_replica(record, p, schema, sources, target, silent)
                    if copied is None:
                        continue  # a holder or the target went silent: another pair is tried
                    held_by.add(target.node_id)
                    holders.append(target)
                    load[target.node_id] += 1
                    copies.append(copied)
        return RepairReport(tuple(copies), tuple(missing), tuple(failed))

    def _copy_replica(self, record: VersionRecord, p: PartRecord, schema: pa.Schema, sources: list[NodeRecord],
                      target: NodeRecord, silent: dict[str, str]) -> ReplicaCopy | None:
        """One copy of ``p`` from the first of ``sources`` to ``target``, checked and sealed there; None when it
        failed, the node to blame added to ``silent``."""
        holder = sources[0]
        deadline = put_deadline(DEFAULT_TIMEOUT, p.nbytes) + 2 * self.node_timeout
        grant = None if self.secret is None else put_grant(  # the one put the holder may make to the target
            self.secret, record.dataset, record.version, p.part, target.node_id,
            int(wall_clock() + deadline + CLOCK_MARGIN))
        order = CopyTo(record.dataset, record.version, p.part, target.uri, self.state.cluster(), self.epoch(), grant)
        try:
            # the holder's own put to the target, after it asked the catalog who is live
            self.pool.action(holder.uri, order, timeout=deadline)
        except (flight.FlightError, ConnectionError, OSError) as exc:
            self.pool.discard(holder.uri)
            refusal = translate(exc)
            if isinstance(refusal, StaleEpoch):
                raise NotLeader("repair stopped: a node has heard from a newer leader; run it there",
                                field=self.lease.leader() if self.lease is not None else None) from None
            if not (isinstance(refusal, VersionConflict) and refusal.field == "copy-to.target"):
                # the holder marks what the target refused or left unanswered; anything else is the holder's (it did not
                # answer in time, its copy is damaged or gone, it failed)
                blamed = target if refusal.field == "copy-to.target" else holder
                return self._not_asked_again(blamed, refusal, silent,
                                             f"copying {record.dataset} v{record.version} {p.part} from {holder.uri} "
                                             f"to {target.uri}")
            # the target already stores it: the copy of a repair whose catalog died (or lost the lease) before it
            # recorded the copy; checked below as any copy is, then recorded and sealed
            log.info("repair: %s already stores %s v%d %s; checking it", target.uri, record.dataset, record.version,
                     p.part)
        try:
            self.verify_on_nodes(record.dataset, record.version, schema,
                                 [PartRecord(p.part, p.start, p.shape, 0, [target])])
        except FlightpartError as exc:
            return self._not_asked_again(target, exc, silent,
                                         f"checking the copy of {record.dataset} v{record.version} {p.part} on "
                                         f"{target.uri}")
        self.state.add_replica(record.dataset, record.version, p.part, target.node_id)
        # the new holder keeps a manifest naming it, so a catalog rebuilding lost state takes its copy
        self.seal(manifest_of(self.state.version(record.dataset, record.version)), [target])
        return ReplicaCopy(record.dataset, record.version, p.part, target.uri)

    @staticmethod
    def _not_asked_again(node: NodeRecord, refusal: FlightpartError, silent: dict[str, str], what: str) -> None:
        """``node`` failed ``what``: noted in ``silent`` with why, so this repair asks it nothing more."""
        silent[node.node_id] = f"{refusal.code} {refusal.message}"[:300]
        log.warning("repair: %s failed (%s %s); %s is not asked again in this repair", what, refusal.code,
                    refusal.message, node.uri)

    def _report_damage(self, b: ReportDamage) -> Removed:
        """A node's replicas that failed their checksum or vanished: no longer listed, so reads skip them and repair
        recreates them."""
        credential = self.caller.credential
        if credential.role == "node" and credential.name != b.node_id:
            raise Forbidden(f"a node token for {credential.name} cannot speak for node {b.node_id}",
                            field="report-damage.node_id")
        removed = 0
        for p in b.partitions:
            if self.state.remove_replica(p.dataset, p.version, p.part, b.node_id):
                removed += 1
                log.warning("node %s lost its replica of %s v%d %s (damaged or missing); no longer listed", b.node_id,
                            p.dataset, p.version, p.part)
        return Removed(removed)

    def _scrub(self, _: ScrubCluster) -> ClusterScrubReport:
        """Every live node checks its files now (in parallel); their findings, summed, and the nodes not scrubbed.

        Once the live can be told from the dead (:meth:`wait_until_nodes_are_known`). A node's scrub is waited
        for while it beats (:func:`~.while_alive.call_while_alive`); the nodes not scrubbed are listed unreachable."""
        self.wait_until_nodes_are_known()
        nodes = self.state.nodes()
        live = [n for n in nodes if n.alive]

        def one(node: NodeRecord) -> NodeScrubReport:
            report = self.pool.action(node.uri, Scrub(), timeout=SCRUB_DEADLINE)
            return NodeScrubReport(**vars(report), uri=node.uri, node_id=node.node_id)

        answers = call_while_alive(live, one, lambda n: n.node_id,
                                   lambda: {n.node_id for n in self.state.nodes() if n.alive}, self._stopping, "scrub")
        if self.lease is not None and not self.lease.leads():  # it stopped hearing the nodes' beats: its view is void
            raise NotLeader("this catalog lost the lease during the scrub; the new leader scrubs when asked again")
        for node, answer in zip(live, answers):
            if answer.why is not None:
                log.warning("scrub: node %s not scrubbed: %s", node.uri, answer.why)
                self.pool.discard(node.uri)
        found = [a.value for a in answers if a.why is None and a.value is not None]
        unreachable = ([n.uri for n in nodes if not n.alive]
                       + [n.uri for n, a in zip(live, answers) if a.why is not None])
        return ClusterScrubReport(tuple(found), tuple(unreachable),
                                  sum(len(a.damaged) for a in found), sum(len(a.missing) for a in found))


ACTIONS = (
    Action(Repair, Repairs._repair, "copy under-replicated partitions to live nodes (copy-to)", "admin"),
    Action(ReportDamage, Repairs._report_damage, "a node's replicas that failed their checksum or are gone: unlisted",
           "node"),
    Action(ScrubCluster, Repairs._scrub, "every live node checks its files against their checksums now; damaged and "
           "missing ones", "admin"),
)
"""The actions this part serves, added to the catalog's table (:attr:`~.server.CatalogServer.actions`)."""
