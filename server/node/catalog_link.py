"""A node's link to its catalog: registration, heartbeats, and the orders the catalog gives it.

The node tells its catalog who it is and everything its directory holds (in pages), then beats; a catalog that
forgot it makes it register again. Orders that delete, seal or copy data (and a new leader's ``lead``) are obeyed
only from the node's own cluster and from its leading catalog (:meth:`CatalogLink._check_cluster`).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import (
    ForeignCluster,
    NodeConflict,
    PartitionDamaged,
    RequestRejected,
    StaleEpoch,
    VersionConflict,
)
from flightpart.frames import size_of
from flightpart.grants import Revocation
from flightpart.io import layout
from flightpart.io.connections import DEFAULT_TIMEOUT, ConnectionPool
from flightpart.io.errors import translate, translated
from flightpart.io.transfer import chunks, put_deadline, send_partition
from flightpart.query.soundness import unsound
from flightpart.version import __version__
from flightpart.wire import (
    Commit,
    Copied,
    CopyTo,
    DropFiles,
    Following,
    Heartbeat,
    Lead,
    ListNodes,
    RegisterNode,
    RegisterReply,
    Removed,
    RevocationEntry,
    Revocations,
    RevocationsTaken,
    Seal,
    Sealed,
    Ticket,
    VersionRef,
    pages,
)

from ..auth import wall_clock
from ..base import Action
from ..store import StoredPartition
from ..telemetry import describe
from .shared import NodeBase, held_weight, log


def register_pages(held: list[StoredPartition], sealed: list[Commit],
                   page_bytes: int) -> list[tuple[tuple[StoredPartition, ...], tuple[Commit, ...]]]:
    """A node's partitions and manifests cut into registration pages of about ``page_bytes`` (at least one page)."""
    items: list[StoredPartition | Commit] = [*sealed, *held]

    def weight(item: StoredPartition | Commit) -> int:
        return len(item.encode()) if isinstance(item, Commit) else held_weight(item)

    return [(tuple(p for p in page if not isinstance(p, Commit)), tuple(p for p in page if isinstance(p, Commit)))
            for page, _more in pages(items, weight, page_bytes)]


class CatalogLink(NodeBase):
    """Registration, heartbeats and the catalog's orders (``lead``, ``drop``, ``seal``, ``copy-to``)."""

    registered: threading.Event
    last_contact: float | None
    """Monotonic time of the catalog's last answer."""
    refused_by_catalog: str | None
    """Why the catalog last refused this node, until it accepts it."""

    def start_reports(self) -> None:
        """Register and beat in the background, until the node stops."""
        threading.Thread(target=self._report_loop, name="flightpart-heartbeat", daemon=True).start()

    def register(self) -> None:
        """Tell the catalog who we are and everything our directory holds.

        The catalog answers with its cluster, the versions dropped or
        aborted meanwhile (deleted only for our own cluster) and the
        manifests of committed versions we hold unsealed.
        """
        held, sealed, versions = self.store.scan()
        refs = tuple(VersionRef(d, v) for d, v in versions)
        sealed_refs = tuple(VersionRef(m.dataset, m.version) for m in sealed)
        pages = register_pages(held, sealed, self.REGISTER_PAGE_BYTES)
        tombstones = tuple(self.store.all_tombstones())
        for k, (parts, manifests) in enumerate(pages):
            body = RegisterNode(self.node_id, self.uri, self.ip, self.pid, str(self.store.root), __version__, parts,
                                self.store.cluster, manifests, refs, sealed_refs, more=k < len(pages) - 1,
                                tombstones=tombstones)
            self._follow(self.to_catalog(body))
        self.last_contact = time.monotonic()
        self.refused_by_catalog = None
        self.registered.set()
        self.find_missing()

    REGISTER_PAGE_BYTES = 4 << 20
    """About how much one page of a registration may weigh (the action body limit is 16 MiB)."""

    def _follow(self, reply: RegisterReply) -> None:
        """Do what the catalog's answer to a registration says: join its cluster, delete orphans, keep manifests."""
        if reply.cluster is not None:
            self.store.join_cluster(reply.cluster)
        if reply.epoch is not None and not self.store.obey_epoch(reply.epoch):
            raise StaleEpoch(f"the catalog that answered leads with epoch {reply.epoch}, lower than "
                             f"{self.store.epoch}: it no longer leads", field="epoch")
        if reply.cluster is not None and reply.cluster == self.store.cluster:
            for orphan in reply.orphans:
                removed = self.store.drop(orphan.dataset, orphan.version, remember=True)
                self.forget_seals(orphan.dataset, orphan.version)
                if removed:
                    log.info("dropped %s v%d (%d files): dropped or aborted while this node was away", orphan.dataset,
                             orphan.version, removed)
            for manifest in reply.seal:
                self.store.seal(manifest)
            if reply.revocations is not None:
                self.take_revocations(reply.revocations)

    def _report_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                if not self.registered.is_set():
                    self.register()
                else:
                    free = self.free_bytes()
                    beat = Heartbeat(self.node_id, free, free is not None and free < self.min_free_bytes,
                                     int(wall_clock() * 1000))
                    # in a datagram when the catalog takes it so; anything else over Flight, whose answer decides
                    # (with the clock of now: a beat counts from when it was sent, and the datagram's wait was not
                    # the catalog's)
                    known = self.datagrams.beat(self.catalog_uri, beat)
                    heard = self.datagrams.heard if known else None
                    if not known:
                        sent = wall_clock()
                        reply = self.to_catalog(dataclasses.replace(beat, clock_ms=int(sent * 1000), asks_clock=True),
                                                 timeout=5)
                        known = reply.known
                        heard = (sent, wall_clock(), reply.clock_ms / 1000) if reply.clock_ms is not None else None
                    # expiry is judged by the catalog's clock (docs/operations/security.md, "Clocks")
                    if heard is not None:
                        self.guard.heard_catalog_clock(*heard)
                    self.last_contact = time.monotonic()
                    if not known:
                        self.registered.clear()
                        continue
                    self.report_lost()
                if self.store.leftovers:
                    self.store.retry_cleanup()
            except (NodeConflict, ForeignCluster, StaleEpoch) as exc:
                log.error("the catalog refused this node: %s", exc)
                self.refused_by_catalog = str(exc)
                self.pool.discard(self.catalog_uri)
                self.registered.clear()
            except Exception as exc:  # catalog down: keep serving, keep trying
                log.debug("catalog %s unreachable: %s", self.catalog_uri, exc)
                self.pool.discard(self.catalog_uri)
                self.registered.clear()
            self.stopping.wait(self.heartbeat_interval)

    def _check_cluster(self, cluster: str | None, epoch: int | None) -> None:
        """An order that deletes or seals data must come from this node's own cluster, and from its leading catalog
        (an epoch no lower than the highest seen); a node that has none yet joins the one its catalog's order names."""
        if self.store.cluster is not None and cluster != self.store.cluster:
            raise ForeignCluster(f"this node belongs to cluster {self.store.cluster}, the order came from "
                                 f"{cluster or 'no cluster'}; nothing was changed", field="cluster")
        self._check_epoch(epoch)
        if cluster is not None and self.store.cluster is None:
            # registered while its catalog had no identity yet (a new cluster before its first write): its catalog's
            # first order names it (the catalog also makes the node register again, which names it too)
            self.store.join_cluster(cluster)

    def _check_epoch(self, epoch: int | None) -> None:
        if not self.store.obey_epoch(epoch):
            self.counters.add(stale_orders=1)
            raise StaleEpoch(f"this node follows the catalog of epoch {self.store.epoch}; an order of epoch "
                             f"{epoch if epoch is not None else '(none)'} comes from a catalog that no longer leads: "
                             "nothing was changed", field="epoch")

    def _lead(self, body: Lead) -> Following:
        """A catalog took the lease: orders of lower epochs are refused from now, and reports go to it."""
        self._check_cluster(body.cluster, body.epoch)
        if self.catalogs is not None:
            self.catalogs.follow(body.leader)
        self.last_contact = time.monotonic()
        log.info("catalog %s leads from epoch %d", body.leader, body.epoch)
        return Following(self.node_id)

    def _drop(self, body: DropFiles) -> Removed:
        self._check_cluster(body.cluster, body.epoch)
        removed = self.store.drop(body.dataset, body.version, pending_only=body.pending_only, through=body.through,
                                  remember=True)
        if not body.pending_only:
            self.forget_seals(body.dataset, body.version)
        describe("drop", dataset=body.dataset, version=body.version, files=removed)
        return Removed(removed)

    def _check_target(self, target: str) -> None:
        """copy-to sends data only to a live node registered with this node's catalog, checked before any connection."""
        live = []
        if self.catalog_uri is not None:
            with translated():
                live = [n.uri for n in self.to_catalog(ListNodes(), timeout=5).nodes if n.alive]
        if target not in live or target == self.uri:
            raise RequestRejected("copy-to.target: not a live node of this cluster; nothing was sent",
                                  field="copy-to.target")

    def _revocations(self, body: Revocations) -> RevocationsTaken:
        """Enforce the withdrawals the catalog lists from now (the whole list, replacing the last)."""
        self._check_epoch(body.epoch)
        self.take_revocations(body.entries)
        return RevocationsTaken(len(body.entries))

    def take_revocations(self, entries: tuple[RevocationEntry, ...]) -> None:
        """The withdrawals this node enforces on every call and stream from now (:mod:`flightpart.grants`), kept in its
        data directory too, so a node restarted while its catalog is out of reach still enforces them."""
        self.guard.revoked.set(tuple(Revocation(e.holder, e.pattern, e.at, e.until) for e in entries))
        body = json.dumps([e.to_json() for e in entries], separators=(",", ":")).encode()
        layout.write_atomically(self.store.root / REVOCATIONS_FILE, body, self.store.modes.file)
        log.info("enforcing %d revocations from the catalog", len(entries))

    def load_revocations(self) -> None:
        """The withdrawals last heard from the catalog, kept in the data directory (none when there is no file; a file
        that cannot be read is logged and left for the catalog's next word)."""
        path = self.store.root / REVOCATIONS_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return
        try:
            entries = Revocations.from_json({"entries": json.loads(raw)}).entries
        except (ValueError, RequestRejected) as exc:
            log.warning("%s cannot be read (%s): revocations are taken from the catalog when it answers", path, exc)
            return
        self.guard.revoked.set(tuple(Revocation(e.holder, e.pattern, e.at, e.until) for e in entries))

    def _seal(self, body: Seal) -> Sealed:
        self._check_cluster(body.cluster, body.epoch)
        return Sealed(self.store.seal(body.manifest))

    def _copy_to(self, body: CopyTo) -> Copied:
        if body.cluster is not None:
            self._check_cluster(body.cluster, body.epoch)
        else:
            self._check_epoch(body.epoch)
        self._check_target(body.target)
        table = self.store.open(body.dataset, body.version, body.part)
        # the copy goes with the catalog's grant for it (a node token writes to no node), or as this node (no secret)
        pool = self.pool if body.grant is None else ConnectionPool(dataclasses.replace(self.pool.access,
                                                                                       token=body.grant))
        try:
            send_partition(pool, body.target, body.dataset, body.version, body.part, table)
        except (flight.FlightError, ConnectionError, OSError) as exc:  # the target's doing: the catalog tries another
            refusal = translate(exc)
            if isinstance(refusal, VersionConflict) and self._holds_the_same(body, table):
                log.info("copy-to %s: it stores %s v%d %s already, the same rows as here", body.target, body.dataset,
                         body.version, body.part)
                return Copied(0)  # the copy of a repair whose catalog died before recording it
            if isinstance(refusal, VersionConflict):
                raise PartitionDamaged(f"copy-to {body.target}: it stores other rows for {body.dataset} "
                                       f"v{body.version} {body.part} than this replica (a file no catalog placed "
                                       "there); not taken",
                                       field="copy-to.target") from None
            raise type(refusal)(f"copy-to {body.target}: {refusal.message}", field="copy-to.target") from None
        finally:
            if pool is not self.pool:
                pool.close()
        return Copied(size_of(table))

    def _holds_the_same(self, body: CopyTo, table: pa.Table) -> bool:
        """Whether the target of ``body``, which says it stores the partition already, serves the rows this replica
        holds (a repair takes such a copy as its own, so a planted file must not pass). Each batch is checked
        before it is compared."""
        ticket = flight.Ticket(Ticket(body.dataset, body.version, body.part).encode())
        offset = 0
        try:
            reader = self.pool.client(body.target).do_get(ticket, options=self.pool.options(
                put_deadline(DEFAULT_TIMEOUT, size_of(table))))
            for chunk in chunks(reader):
                if chunk.data is None:
                    continue
                piece = pa.Table.from_batches([chunk.data])
                if unsound(piece) is not None or offset + piece.num_rows > table.num_rows \
                        or not piece.equals(table.slice(offset, piece.num_rows)):
                    reader.cancel()
                    return False
                offset += piece.num_rows
        except (flight.FlightError, ConnectionError, OSError) as exc:  # not an answer: the target's real refusal
            refusal = translate(exc)
            raise type(refusal)(f"copy-to {body.target}: it says it stores {body.dataset} v{body.version} {body.part} "
                                f"already, but reading it failed: {refusal.message}", field="copy-to.target") from None
        return offset == table.num_rows


REVOCATIONS_FILE = "revocations.json"
"""Where a node keeps the withdrawals its catalog last sent (in its data directory)."""

CATALOG_ORDERS = (
    Action(DropFiles, CatalogLink._drop, "remove a dataset version's files (orders from this node's own cluster only)",
           "catalog"),
    Action(Seal, CatalogLink._seal,
           "keep a committed version's manifest: the version becomes immutable and rebuildable", "catalog"),
    Action(Lead, CatalogLink._lead, "a catalog took the lease: refuse orders of lower epochs, report to it", "catalog"),
    Action(Revocations, CatalogLink._revocations, "the withdrawals in force (users removed, grants and tokens "
           "revoked): credentials and handles they void are refused from now", "catalog"),
    Action(CopyTo, CatalogLink._copy_to, "send a partition to another live node of the cluster (replication)",
           "catalog"),
)
"""The catalog's orders, for the node's action table."""
