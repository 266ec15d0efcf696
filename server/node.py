"""A node's Flight server: stores partitions, serves them, reports to its catalog.

Each method does one thing and hands Arrow objects to Arrow: ``do_get``
returns a ``RecordBatchStream`` over a memory-mapped table (projection and
row ranges are zero-copy slices), so no Python runs per batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import (
    CannotStart,
    FlightpartError,
    Forbidden,
    ForeignCluster,
    NodeConflict,
    PartitionDamaged,
    PartitionMissing,
    RequestRejected,
    SchemaMismatch,
    ServerBusy,
    StaleEpoch,
    StorageFull,
    StorageUnwritable,
    VersionConflict,
)
from flightpart.frames import check_columns, growing_dictionaries, size_of
from flightpart.io import inprocess, layout
from flightpart.io.access import Access
from flightpart.io.allocator import keep_freed_memory
from flightpart.io.compression import PLAIN, write_options
from flightpart.io.connections import DEFAULT_TIMEOUT, ConnectionPool
from flightpart.io.counters import Counters
from flightpart.io.errors import translate, translated
from flightpart.io.hosts import advertised_ip
from flightpart.io.layout import default_data_dir
from flightpart.io.leader import CatalogAddresses, split_addresses
from flightpart.io.maps import stored_facts, stored_nbytes
from flightpart.io.transfer import (
    BATCH_BYTES,
    BUFFERED_BYTES,
    PiecePace,
    batches_of,
    chunks,
    put_deadline,
    row_pieces,
    send_partition,
    split_batch,
)
from flightpart.query.apply import apply_ticket
from flightpart.query.soundness import decimal_past_precision, holds_decimal, unsound
from flightpart.tokens import PUT_GRANT, Keys, outdated_format, role_token, verify_token
from flightpart.version import __version__
from flightpart.wire import (
    MAX_PARTS_PER_RUN,
    VERSION_LIMIT,
    Assemble,
    AssembleReply,
    Checked,
    CheckedParts,
    CheckParts,
    Commit,
    Copied,
    CopyTo,
    DropFiles,
    Following,
    GetNodeInfo,
    GetStats,
    Heartbeat,
    Held,
    HeldReply,
    Lead,
    ListNodes,
    NodeInfo,
    PartHeader,
    PartPlace,
    PartRun,
    PutReceipts,
    PutTrailer,
    RegisterNode,
    RegisterReply,
    Relink,
    Removed,
    ReportDamage,
    Scrub,
    ScrubReport,
    Seal,
    Sealed,
    StatsReply,
    Ticket,
    VersionRef,
    pages,
    parse_put_path,
)

from . import substrait_check
from .assembler import Assembler
from .auth import admit_stream, authorize, credential_of, guard_of, require_version_grant, wall_clock
from .base import Action, ServiceBase, action_table, boundary, flight_error
from .beats import ANSWER_SECONDS, DatagramBeats
from .store import PartitionStore, StoredPartition
from .telemetry import describe

log = logging.getLogger("flightpart.node")


NODE_COUNTERS = ("bytes_sent", "rows_sent", "batches_sent", "partitions_served", "bytes_received", "partitions_stored",
                 "put_streams", "errors", "storage_full_refusals", "partitions_assembled", "partitions_linked", "assembled_rows",
                 "pulled_bytes", "streams_compressed", "partitions_damaged", "partitions_missing", "scrubbed_bytes",
                 "get_streams", "stale_orders")
"""What a node's ``stats`` action and metrics count."""


def decimal_columns(schema: pa.Schema) -> tuple[int, ...]:
    """The positions of ``schema``'s columns that are or hold decimals (a list or struct of them, at any depth), whose
    values :func:`checked` looks at beyond Arrow."""
    return tuple(k for k, field in enumerate(schema) if holds_decimal(field.type))


def checked(batch: pa.RecordBatch, name: str, version: int, part: tuple[int, int],
            decimals: tuple[int, ...] = ()) -> pa.RecordBatch:
    """A received batch after a full validation: offsets, lengths, row counts and dictionary indices in bounds,
    and its ``decimals`` (the positions of its decimal columns) without the one value past their precision that
    Arrow's validation misses (:func:`~flightpart.query.soundness.decimal_past_precision`).

    Nothing else touches a batch before this check, so a lying batch can
    neither crash the node nor be stored to crash its readers later.
    """
    try:
        batch.validate(full=True)
        for k in decimals:
            decimal_past_precision(batch.column(k))
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        raise RequestRejected(f"the put of {name} v{version} {part} sent an invalid record batch: {str(exc)[:200]}",
                              field="batch") from None
    return batch


def _stats_weight(stats: dict | None) -> int:
    """An upper bound of the JSON size of a partition's statistics, without encoding them."""
    def size(v: Any) -> int:
        return 6 * len(v) + 2 if isinstance(v, str) else len(str(v))  # JSON escapes a character in at most 6

    return sum(6 * len(column) + 48 + sum(size(v) for v in entry.values()) for column, entry in (stats or {}).items())


def register_pages(held: list[StoredPartition], sealed: list[Commit],
                   page_bytes: int) -> list[tuple[tuple[StoredPartition, ...], tuple[Commit, ...]]]:
    """A node's partitions and manifests cut into registration pages of about ``page_bytes`` (at least one page)."""
    items: list[StoredPartition | Commit] = [*sealed, *held]

    def weight(item: StoredPartition | Commit) -> int:
        return len(item.encode()) if isinstance(item, Commit) else held_weight(item)

    return [(tuple(p for p in page if not isinstance(p, Commit)), tuple(p for p in page if isinstance(p, Commit)))
            for page, _more in pages(items, weight, page_bytes)]


def held_weight(stored: StoredPartition) -> int:
    """About what one partition weighs in a ``held`` reply or a registration."""
    return 120 + _stats_weight(stored.stats)


class _Pacer:
    """Sleeps so that the bytes counted through :meth:`pace` stay under ``rate`` per second (ends early on ``stop``)."""

    def __init__(self, rate: int, stop: threading.Event):
        self.rate = rate
        self.stop = stop
        self.started = time.monotonic()
        self.done = 0

    def pace(self, nbytes: int) -> None:
        self.done += nbytes
        ahead = self.done / self.rate - (time.monotonic() - self.started)
        if ahead > 0:
            self.stop.wait(ahead)


def split_all(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield from split_batch(batch, BATCH_BYTES)


READS_UNPUBLISHED = frozenset({"admin", "node", "owner"})
"""Who may read a version this node holds but was not told is committed (a put in progress, a staged append, an
aborted write): an admin, the owner, nodes (a repair's comparison, a repartition's pulls). A reader's or writer's
token had read such rows straight from a node; now they get ``BUSY`` (retried: a seal that is late arrives)."""

STREAM_PIECE_BYTES = 4 << 20
"""A ``do_get`` hands its stream a partition in zero-copy row ranges of at least about this size (several of a
stored file's 1 MiB batches each): the reader's pace is seen range by range, and Python steps in once per range,
not per batch."""
STREAM_WHOLE_BYTES = BUFFERED_BYTES
"""A ``do_get`` of at most this many bytes is handed to Arrow whole, not in row ranges: flow-control windows and
socket buffers take most of it at once whatever the reader's pace, so ranges would show the idle watch little, and
their steps of Python were most of a small read's cost on the node (0.15 ms of 0.75 ms of CPU for 1 MiB). Such a
stream keeps its slot until it ends, or until the idle watch frees it once it ran the idle timeout longer than a
reader at :data:`~flightpart.server.auth.WHOLE_STREAM_RATE` needs (the stream goes on, still counted in its
caller's share)."""
STREAM_PIECE_MOST_BYTES = 64 << 20
"""The largest row range a fast reader is handed at once (:class:`~flightpart.io.transfer.PiecePace`)."""
STREAM_PIECE_SECONDS = 0.1
"""About how long a reader should take one row range, once its pace is known (never more than a tenth of the
stream idle timeout, so a reader taking ranges at a steady pace is never seen idle)."""
STREAM_IDLE_TIMEOUT = 60.0
"""Seconds a ``do_get`` whose reader takes nothing keeps its stream slot (``--stream-idle-timeout``)."""


def node_name(keys: Keys | None, token: str | None) -> str | None:
    """The node a node credential names (None without one); a token this cluster did not sign for a node is refused."""
    if token is None:
        return None
    credential = verify_token(keys, token, time.time()) if keys is not None else None
    if credential is None or credential.role != "node":
        outdated = outdated_format(token)
        why = (f"it is an {outdated} token, signed with an earlier release's key" if outdated else
               "it is not a node token of this cluster (or it has expired, or there is no --verify-key-file to check it)")
        raise CannotStart(f"the node token cannot be used: {why}; mint one with "
                          "`flightpart token --role node --name NODE`")
    return credential.name


def within_limit(dataset: str, version: int, field: str) -> None:
    """INVALID_REQUEST for a version past :data:`~flightpart.wire.VERSION_LIMIT`: no catalog hands one out, and a
    file at such a number would reach the catalog with the node's next registration."""
    if version > VERSION_LIMIT:
        raise RequestRejected(f"version {version:,} of {dataset} is past the {VERSION_LIMIT:,} a dataset may reach; a "
                              "catalog hands out no such number", field=field)


class NodeServer(ServiceBase):
    """One node of a flightpart cluster."""

    log = log
    role = "node"
    streams_timed = True
    wrong_daemon_hint = "; client commands talk to the catalog: point --catalog (or $FLIGHTPART_CATALOG) at its address"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        data_dir: str | os.PathLike | None = None,
        catalog: str | None = None,
        advertise_ip: str | None = None,
        advertise: str | None = None,
        heartbeat_interval: float = 2.0,
        max_partition_bytes: int | None = None,
        max_streams: int | None = None,
        stream_idle_timeout: float | None = STREAM_IDLE_TIMEOUT,
        min_free_bytes: int = 0,
        max_maps: int = 256,
        group: str | None = None,
        secret: Keys | None = None,
        token: str | None = None,
        pool: ConnectionPool | None = None,
        scrub_rate: int = 64 << 20,
        scrub_interval: float = 3600.0,
        direct_reads: bool = True,
        **server_kwargs: Any,
    ):
        super().__init__(host, port, secret=secret, max_streams=max_streams, advertise=advertise,
                         stream_idle_timeout=stream_idle_timeout, **server_kwargs)
        if advertise_ip is None and advertise:
            advertise_ip = socket.gethostbyname(advertise)
        self.ip = advertise_ip or (host if host not in ("0.0.0.0", "::", "") else advertised_ip())
        self.store = PartitionStore(data_dir or default_data_dir(), max_partition_bytes=max_partition_bytes, max_maps=max_maps,
                                    group=group, node_id=node_name(secret, token))
        self.min_free_bytes = min_free_bytes
        self.node_id = self.store.node_id
        self.pid = os.getpid()
        keep_freed_memory()  # receiving puts and pulls: freed buffers reused, not faulted in again per partition
        self.counters = Counters(NODE_COUNTERS)
        # the cluster's catalogs (several when they share a lease): reports go to the leader, followed when it moves
        self.catalogs = CatalogAddresses(split_addresses(catalog)) if catalog else None
        self.heartbeat_interval = heartbeat_interval
        access = pool.access if pool is not None else Access()
        if token is not None or isinstance(secret, bytes):  # it speaks to the catalog and to other nodes as the node it is
            access = dataclasses.replace(access, token=token or role_token(secret, "node", self.node_id))
        self.pool = ConnectionPool(access)
        self.datagrams = DatagramBeats(access.token, timeout=min(ANSWER_SECONDS, max(0.25, heartbeat_interval / 2)))
        self.assembler = Assembler(self.store, self.pool, self.uri, lambda: self.catalog_uri, self.counters.add)
        self.filters = substrait_check.shared()  # a ticket's filter is read by a child process first: some abort Arrow
        self._stopping = threading.Event()
        self.registered = threading.Event()
        self.last_contact: float | None = None  # monotonic time of the catalog's last answer
        self.refused_by_catalog: str | None = None  # why the catalog last refused this node, until it accepts it
        self._seen_sealed: set[tuple[str, int]] = set()  # versions a read found sealed here (see _published)
        self.scrub_rate = scrub_rate
        self.scrub_interval = scrub_interval
        self._lost_lock = threading.Lock()
        self._unreported: set[tuple[str, int, tuple[int, int]]] = set()  # damaged or missing, not yet told to the catalog
        self._settled: set[tuple[str, int, tuple[int, int]]] = set()  # missing ones the catalog already knows of
        self.store.on_damage = self._damaged
        if direct_reads:  # a client in this process reads the stored table itself (off: it streams, as from anywhere)
            inprocess.register(self.uri, self.store.open)
        if catalog:
            threading.Thread(target=self._report_loop, name="flightpart-heartbeat", daemon=True).start()
        if scrub_interval > 0 and scrub_rate > 0:
            threading.Thread(target=self._scrub_loop, name="flightpart-scrub", daemon=True).start()

    # ------------------------------------------------------------------ catalog

    @property
    def catalog_uri(self) -> str | None:
        """The catalog this node reports to: the leader, as last heard of."""
        return self.catalogs.current if self.catalogs is not None else None

    def _to_catalog(self, body: Any, timeout: float | None = None) -> Any:
        """An action at the leading catalog (a standby's NOT_LEADER followed, one that does not answer skipped)."""
        assert self.catalogs is not None
        with translated():
            return self.catalogs.call(lambda uri: self.pool.action(uri, body, timeout=timeout))

    def info(self) -> dict:
        return {
            "node_id": self.node_id,
            "uri": self.uri,
            "ip": self.ip,
            "pid": self.pid,
            "data_dir": str(self.store.root),
            "version": __version__,
        }

    def register(self) -> None:
        """Tell the catalog who we are and everything our directory holds.

        The catalog answers with the cluster this node belongs to, the
        versions it dropped or aborted while we were away (deleted here only
        when the catalog is of our own cluster) and the manifests of
        committed versions we hold but have not sealed yet.
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
            self._follow(self._to_catalog(body))
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
            raise StaleEpoch(f"the catalog that answered leads with epoch {reply.epoch}, lower than {self.store.epoch}: "
                             "it no longer leads", field="epoch")
        if reply.cluster is not None and reply.cluster == self.store.cluster:
            for orphan in reply.orphans:
                removed = self.store.drop(orphan.dataset, orphan.version, remember=True)
                self._forget_seals(orphan.dataset, orphan.version)
                if removed:
                    log.info("dropped %s v%d (%d files): dropped or aborted while this node was away", orphan.dataset,
                             orphan.version, removed)
            for manifest in reply.seal:
                self.store.seal(manifest)

    def _report_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                if not self.registered.is_set():
                    self.register()
                else:
                    free = self.free_bytes()
                    beat = Heartbeat(self.node_id, free, free is not None and free < self.min_free_bytes,
                                     int(wall_clock() * 1000))
                    # in a datagram when the catalog takes it so; anything else over Flight, whose answer decides (with
                    # the clock of now: a beat counts from when it was sent, and the datagram's wait was not the catalog's)
                    known = self.datagrams.beat(self.catalog_uri, beat)
                    heard = self.datagrams.heard if known else None
                    if not known:
                        sent = wall_clock()
                        reply = self._to_catalog(dataclasses.replace(beat, clock_ms=int(sent * 1000), asks_clock=True),
                                                 timeout=5)
                        known = reply.known
                        heard = (sent, wall_clock(), reply.clock_ms / 1000) if reply.clock_ms is not None else None
                    if heard is not None:  # expiry is judged by the catalog's clock (docs/operations.md, "Clocks")
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
            self._stopping.wait(self.heartbeat_interval)

    def shutdown(self) -> None:
        self._stopping.set()
        inprocess.unregister(self.uri)
        self.datagrams.close()
        super().shutdown()

    def free_bytes(self) -> int | None:
        try:
            return self.store.free_bytes()
        except OSError:
            return None

    def problems(self) -> list[str]:
        """Why this node should not get new work, if it should not: its data directory is gone, read-only or nearly full,
        or it is not (or no longer) registered with its catalog. Empty: SERVING."""
        root = self.store.root
        if not root.is_dir():
            return [f"data directory {root} is gone"]
        found = [] if os.access(root, os.W_OK) else [f"data directory {root} is not writable"]
        free = self.free_bytes()
        if free is None or free < self.min_free_bytes:
            found.append(f"low disk space: {free or 0:,} bytes free, below --min-free-bytes {self.min_free_bytes:,}")
        if self.catalog_uri is not None:
            # one heartbeat lost on a busy machine is not a reason to turn probes away: the node re-registers at the
            # next beat, so it is NOT_SERVING only when refused, never registered, or its catalog silent for a while
            silent = time.monotonic() - self.last_contact if self.last_contact is not None else None
            if self.refused_by_catalog is not None:
                found.append(f"the catalog {self.catalog_uri} refused this node: {self.refused_by_catalog}")
            elif silent is None:
                found.append(f"not registered with the catalog {self.catalog_uri} yet")
            elif silent > max(3 * self.heartbeat_interval, 5.0):
                state = "has not answered" if self.registered.is_set() else "has not registered this node"
                found.append(f"the catalog {self.catalog_uri} {state} for {silent:.0f} s")
        return found

    def stats(self) -> dict:
        """Counters for the ``stats`` action and the metrics endpoint."""
        return {**self.counters.snapshot(), "partitions_held": self.store.count(), "maps_open": len(self.store.maps),
                "free_bytes": self.free_bytes() or 0, "open_streams": self.guard.open_streams,
                "refused_calls": self.guard.refused, "problems": self.problems()}

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

    # ------------------------------------------------------------------ integrity

    def _damaged(self, dataset: str, version: int, part: tuple[int, int]) -> None:
        """A file failed its checksum (and was quarantined): count it and tell the catalog now, in the background."""
        self.counters.add(partitions_damaged=1)
        log.error("partition %s of %s v%d failed its checksum: moved to quarantine, not served", part, dataset, version)
        with self._lost_lock:
            self._unreported.add((dataset, version, part))
            self._settled.add((dataset, version, part))  # quarantined: not reported missing as well
        threading.Thread(target=self.report_lost, name="flightpart-report-damage", daemon=True).start()

    def report_lost(self) -> None:
        """Tell the catalog which replicas this node no longer has intact; kept for the next beat when it does not answer."""
        with self._lost_lock:
            places = sorted(self._unreported)
        if not places or self.catalog_uri is None:
            return
        body = ReportDamage(self.node_id, tuple(PartPlace(d, v, p) for d, v, p in places))
        try:
            self._to_catalog(body, timeout=10)
        except Exception as exc:
            log.info("could not report %d damaged or missing partitions to the catalog yet: %s", len(places), exc)
            return
        with self._lost_lock:
            self._unreported.difference_update(places)

    def scrub(self, rate: int | None = None) -> ScrubReport:
        """Check every stored file against its checksum and find missing ones; tell the catalog what is lost.

        ``rate`` bounds the bytes read per second (None: as fast as the
        disk goes, for ``flightpart scrub``). Files that drops remove while
        it runs are no finding (the drops are watched from before the
        manifests are read).
        """
        pace = _Pacer(rate, self._stopping).pace if rate else None
        since = self.store.drops.mark()
        found = self.store.scrub(self._claimed(), pace, self._stopping.is_set, since)
        missing = found["missing"]
        self._lost(missing)
        self.counters.add(scrubbed_bytes=found["bytes"])
        self.report_lost()
        return ScrubReport(found["checked"], found["bytes"], tuple(PartPlace(*p) for p in found["damaged"]),
                           tuple(PartPlace(*p) for p in missing))

    def _lost(self, missing: list[tuple[str, int, tuple[int, int]]]) -> None:
        """Partitions found missing: reported to the catalog (once per process), their statistics moved aside."""
        for place in missing:
            self.store.forget_missing(*place)
        with self._lost_lock:
            self._unreported.update(missing)
            self._settled.update(missing)
        if missing:
            self.counters.add(partitions_missing=len(missing))
            log.error("partitions missing from the data directory: %s", missing)

    def _claimed(self) -> set[tuple[str, int, tuple[int, int]]]:
        """What the manifests say this node holds, less what it already reported lost."""
        claimed = self.store.claimed(self.node_id)
        with self._lost_lock:
            return claimed - self._settled

    def find_missing(self) -> None:
        """At registration: partitions the manifests say this node holds whose files are gone (names only, no read)."""
        since = self.store.drops.mark()
        self._lost(self.store.missing(self._claimed(), since))
        self.report_lost()

    def _scrub_loop(self) -> None:
        """Scrub at ``scrub_rate`` bytes/s, one pass every ``scrub_interval`` seconds: a pass over B bytes takes B/rate s."""
        while not self._stopping.wait(self.scrub_interval):
            try:
                self.scrub(self.scrub_rate)
            except Exception as exc:  # a scrub never takes the node down; the next pass tries again
                log.warning("scrub pass failed: %s", exc)

    def _check(self, body: PartPlace) -> Checked:
        """Vouch for a partition before a reader on this host maps the file itself (verified once per file and process)."""
        self.store.open(body.dataset, body.version, body.part)
        return Checked()

    def _check_parts(self, body: CheckParts) -> CheckedParts:
        """:meth:`_check` for many partitions at once; a damaged one is quarantined (and reported) as by a read."""
        failed = []
        for part in body.parts:
            try:
                self.store.verify(body.dataset, body.version, part)
            except (OSError, FlightpartError):
                failed.append(part)
        return CheckedParts(tuple(failed))

    def _scrub(self, _: Scrub) -> ScrubReport:
        return self.scrub()

    # ------------------------------------------------------------------ data

    RECEIPTS_PER_PAGE = 2000
    """Receipts per metadata message in the answer to a put of several partitions (about 300 KB)."""

    def do_put(self, context: Any, descriptor: flight.FlightDescriptor, reader: Any, writer: Any) -> None:
        with boundary(log, "do_put", self.telemetry, context, counted=functools.partial(self._count_error, "put")) as call:
            name, version, part = parse_put_path(descriptor)
            credential = credential_of(context)
            if credential.role == PUT_GRANT:  # a copy the catalog ordered: this partition, to this node, nothing else
                if part is None or credential.put_scope != (name, version, part, self.node_id):
                    raise Forbidden(f"a put grant for {credential.name} does not put {name} v{version} {part} to node "
                                    f"{self.node_id}", field="authorization")
            else:  # a writer's put; a node token writes to no node (a copy carries the catalog's grant)
                authorize(context, "write")
                require_version_grant(guard_of(context), name, version, "put")
            within_limit(name, version, "descriptor.version")
            check_columns(reader.schema)  # a writer's own client refuses them first; a plain Flight writer meets this
            # a share of the streams per caller, and the slot of a put that sends nothing freed (as a do_get's is)
            guard = admit_stream(context, call.peer)
            self.counters.add(put_streams=1)
            stream = self.guard.received(guard, chunks(reader))
            if part is not None:
                stored = self._receive(context, stream, name, version, part, reader.schema, alone=True)
                describe("put", dataset=name, version=version, part=part, partitions=1, bytes=stored.nbytes, rows=stored.rows)
                writer.write(pa.py_buffer(stored.encode()))
                return
            received: list[StoredPartition] = []
            for chunk in stream:
                if chunk.data is not None or chunk.app_metadata is None:
                    raise RequestRejected(f"the put of several partitions of {name} v{version} sent a record batch before "
                                          "its partition header", field="partition header")
                header = PartHeader.decode(chunk.app_metadata.to_pybytes(), "partition header")
                received.append(self._receive(context, stream, name, version, header.part, reader.schema, alone=False))
            if received:
                self.store.sync(name, version)  # every rename durable before any receipt
            describe("put", dataset=name, version=version, partitions=len(received), bytes=sum(p.nbytes for p in received),
                     rows=sum(p.rows for p in received))
            for k in range(0, len(received), self.RECEIPTS_PER_PAGE):
                writer.write(pa.py_buffer(PutReceipts(tuple(received[k:k + self.RECEIPTS_PER_PAGE])).encode()))

    def _receive(self, context: Any, stream: Iterator[Any], name: str, version: int, part: tuple[int, int],
                 schema: pa.Schema, *, alone: bool) -> StoredPartition:
        """Store one partition from ``stream``: its batches up to its trailer.

        ``alone``: the stream carries this partition only, so it must end
        after the trailer (data after it is refused); otherwise the trailer
        ends the partition and the stream goes on with the next header.
        """
        expected = self.store.group_schema(name, version, part[1])
        if expected is not None and not expected.equals(schema):
            raise SchemaMismatch(
                f"schema of {name} v{version} {part} differs from the partitions of its column group already stored: "
                f"got {schema}, expected {expected}", field="schema",
            )
        received = [0]
        declared: list[int] = []
        limit = self.store.max_partition_bytes
        decimals = decimal_columns(schema)

        def batches() -> Iterator[pa.RecordBatch]:
            for chunk in stream:
                if chunk.data is not None:
                    if declared:
                        raise RequestRejected(f"the put of {name} v{version} {part} sent data after its trailer",
                                              field="put trailer")
                    size = chunk.data.get_total_buffer_size()  # from buffer sizes alone: safe on a lying batch
                    received[0] += size
                    if limit is not None and received[0] > limit:
                        raise self.store.too_large(name, version, part)
                    yield checked(chunk.data, name, version, part, decimals)
                if chunk.app_metadata is not None:
                    declared.append(PutTrailer.decode(chunk.app_metadata.to_pybytes(), "put trailer").rows)
                    if not alone:
                        return

        def check_complete(rows: int) -> None:
            if context.is_cancelled():
                raise RequestRejected(f"the put of {name} v{version} {part} was cancelled after {rows} rows; "
                                      "nothing was stored", field="stream")
            if not declared:
                raise RequestRejected(f"the put of {name} v{version} {part} ended without its trailer after {rows} rows "
                                      '(a complete put ends with the metadata message {"rows": n}); nothing was stored',
                                      field="put trailer")
            if declared[-1] != rows:
                raise RequestRejected(f"the put of {name} v{version} {part} ended after {rows} rows, "
                                      f"the sender declared {declared[-1]}", field="put trailer")

        try:
            stored = self.store.write(name, version, part, schema, split_all(growing_dictionaries(batches())), check_complete,
                                      sync_directory=alone)
        except pa.ArrowInvalid as exc:  # a dictionary nested in a list or struct, replaced between batches
            if "dictionary" not in str(exc).lower():
                raise
            raise RequestRejected(f"the put of {name} v{version} {part} replaced a nested column's dictionary between "
                                  "batches, which a partition file cannot hold; send one dictionary for it",
                                  field="dictionary") from None
        self.counters.add(bytes_received=received[0], partitions_stored=1)
        return stored

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        with boundary(log, "do_get", self.telemetry, context, counted=functools.partial(self._count_error, "get")) as call:
            spec = Ticket.decode(ticket.ticket)
            credential = authorize(context, "read", (spec.dataset, spec.version))
            if credential.role not in READS_UNPUBLISHED and not self._published(spec.dataset, spec.version):
                raise ServerBusy(f"{spec.dataset} v{spec.version} is not published on this node: not committed, or "
                                 "its seal has not reached this node yet; retry shortly")
            guard = admit_stream(context, call.peer)
            if spec.more is not None:
                return self._several(spec, guard)
            if spec.filter is not None:
                self.filters.check(spec.filter)
            table = apply_ticket(self.store.open(spec.dataset, spec.version, spec.part), spec.columns, spec.rows, spec.filter,
                                 spec.matched, spec.aggregate, bool(spec.row_numbers), spec.top)
            compressed = write_options(table, spec.compression)
            options = compressed or PLAIN
            nbytes, batches, dictionaries = stored_facts(table)  # once per map for a whole partition
            describe("get", dataset=spec.dataset, version=spec.version, part=spec.part, bytes=nbytes, rows=table.num_rows,
                     compressed=compressed is not None)
        self.counters.add(bytes_sent=nbytes, rows_sent=table.num_rows, batches_sent=batches, partitions_served=1,
                          streams_compressed=int(compressed is not None), get_streams=1)
        if not table.num_rows:  # a stream of the table sends no batch, and so no dictionary (at any depth): one of none
            self.guard.sent_whole(guard, nbytes)
            return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(table.schema, batches_of(table)),
                                            options=options)
        if nbytes <= STREAM_WHOLE_BYTES or dictionaries:
            # a small partition (STREAM_WHOLE_BYTES), or dictionaries that grow from batch to batch, which go out as
            # deltas only Arrow's own stream of the table writes: sent whole, the reader given time by its size
            self.guard.sent_whole(guard, nbytes)
            return flight.RecordBatchStream(table, options=options)
        # row ranges handed out one at a time, so the guard sees a reader that stops taking them (its slot is freed);
        # each range's batches are written by Arrow without a step of Python per batch
        pace = PiecePace(STREAM_PIECE_BYTES, STREAM_PIECE_MOST_BYTES, self._piece_seconds())
        pieces = (flight.RecordBatchStream(piece, options=options)
                  for piece in pace.paced(row_pieces(table, nbytes, pace, STREAM_PIECE_BYTES), nbytes, table.num_rows))
        return flight.GeneratorStream(table.schema, self.guard.watch(guard, pieces), options=options)

    def _published(self, dataset: str, version: int) -> bool:
        """Whether ``version`` is sealed here (committed, and this node told so). Remembered once true: a seal is
        never taken back, and a version number never reused, so a read asks the disk once per version."""
        if (dataset, version) in self._seen_sealed:
            return True
        if not self.store.sealed(dataset, version):
            return False
        self._seen_sealed.add((dataset, version))
        return True

    def _forget_seals(self, dataset: str, version: int | None) -> None:
        """Let go of the seals reads remembered (:meth:`_published`) for a dropped version, or every version of
        ``dataset``: the set would otherwise grow with every version ever read here."""
        self._seen_sealed.difference_update([key for key in list(self._seen_sealed)
                                             if key[0] == dataset and (version is None or key[1] == version)])

    def _piece_seconds(self) -> float:
        """How long a reader should take one row range: :data:`STREAM_PIECE_SECONDS`, or a tenth of the stream idle
        timeout when that is shorter."""
        idle = self.guard.stream_idle_timeout
        return STREAM_PIECE_SECONDS if idle is None else min(STREAM_PIECE_SECONDS, idle / 10)

    def _several(self, spec: Ticket, guard: Any) -> flight.GeneratorStream:
        """Whole partitions of one column group in one stream, in runs: each run's rows one batch, opened by a
        :class:`PartRun` naming its partitions and their rows (a partition larger than a batch goes alone).

        Each partition is opened as its turn comes (one map held at a time, not 4,096 files open at once); a
        missing one is refused before the stream starts, so the reader can ask another replica.
        """
        positions = (spec.part, *(spec.more or ()))
        folder = str(self.store.version_dir(spec.dataset, spec.version))
        paths = [Path(f"{folder}/{i}_{j}{layout.SUFFIX}") for i, j in positions]  # one walk of pathlib, not one each
        missing = [p for p, path in zip(positions[1:], paths[1:]) if not os.path.exists(path)]
        if missing:
            raise PartitionMissing(f"partition {missing[0]} of dataset {spec.dataset!r} version {spec.version} is not on "
                                   "this node", field="ticket.more")
        first = apply_ticket(self.store.open(spec.dataset, spec.version, spec.part), spec.columns, None)
        schema = first.schema
        if any(pa.types.is_dictionary(field.type) for field in schema):
            raise RequestRejected("ticket.more: dictionary columns are read one partition per stream", field="ticket.more")
        options = write_options(first, spec.compression)
        self.counters.add(streams_compressed=int(options is not None), get_streams=1)
        describe("get", dataset=spec.dataset, version=spec.version, parts=len(positions), compressed=options is not None)
        empty = pa.RecordBatch.from_pylist([], schema=schema)  # what opens a partition of no rows

        def opened(k: int, position: tuple[int, int]) -> pa.Table:
            """The next partition, or (past the start of the stream) a Flight error with its code."""
            if k == 0:
                return first
            try:
                table = apply_ticket(self.store.open_at(spec.dataset, spec.version, position, paths[k]), spec.columns,
                                     None)
                if not table.schema.equals(schema):
                    raise RequestRejected("ticket.more: partitions of different column groups cannot share a stream",
                                          field="ticket.more")
            except FlightpartError as exc:
                self.counters.add(errors=1)
                raise flight_error(exc) from None
            return table

        def sent(run: list[tuple[tuple[int, int], pa.Table, int]]) -> Iterator[Any]:
            """One run of partitions: their rows as one batch (a lone or large one as its own batches), the first
            batch carrying the :class:`PartRun` that says where each partition starts."""
            header = pa.py_buffer(PartRun(tuple(p for p, _t, _n in run), tuple(t.num_rows for _p, t, _n in run)).encode())
            whole = run[0][1] if len(run) == 1 else pa.concat_tables([t for _p, t, _n in run]).combine_chunks()
            batches = [piece for batch in whole.to_batches() for piece in split_batch(batch, STREAM_PIECE_BYTES)]
            self.counters.add(bytes_sent=sum(n for _p, _t, n in run), rows_sent=whole.num_rows,
                              partitions_served=len(run), batches_sent=max(1, len(batches)))
            yield (batches[0] if batches else empty), header
            yield from batches[1:]

        def pieces() -> Iterator[Any]:
            run: list[tuple[tuple[int, int], pa.Table, int]] = []
            size = 0
            for k, position in enumerate(positions):
                table = opened(k, position)
                nbytes = stored_nbytes(table)
                if run and (size + nbytes > STREAM_PIECE_BYTES or len(run) >= MAX_PARTS_PER_RUN):
                    yield from sent(run)
                    run, size = [], 0
                run.append((position, table, nbytes))
                size += nbytes
            if run:
                yield from sent(run)

        return flight.GeneratorStream(schema, self.guard.watch(guard, pieces()), options=options)

    @contextlib.contextmanager
    def _counting_errors(self, what: str) -> Iterator[None]:
        """Count a refused call (:meth:`_count_error`)."""
        try:
            yield
        except BaseException as exc:
            self._count_error(what, exc)
            raise

    def _count_error(self, what: str, exc: BaseException) -> None:
        """Count a refused call; a write refused for a full disk also as such, with a warning in the log."""
        if isinstance(exc, StorageUnwritable):
            self.counters.add(errors=1)
            log.error("refused a %s: the data disk refused a write", what)
        elif isinstance(exc, StorageFull):
            self.counters.add(errors=1, storage_full_refusals=1)
            log.warning("refused a %s: the disk is full (%s bytes free)", what, self.free_bytes())
        else:
            self.counters.add(errors=1)

    # ------------------------------------------------------------------ actions

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

    def _drop(self, body: DropFiles) -> Removed:
        self._check_cluster(body.cluster, body.epoch)
        removed = self.store.drop(body.dataset, body.version, pending_only=body.pending_only, through=body.through,
                                  remember=True)
        if not body.pending_only:
            self._forget_seals(body.dataset, body.version)
        describe("drop", dataset=body.dataset, version=body.version, files=removed)
        return Removed(removed)

    def _check_target(self, target: str) -> None:
        """copy-to sends data only to a live node registered with this node's catalog, checked before any connection."""
        live = []
        if self.catalog_uri is not None:
            with translated():
                live = [n.uri for n in self._to_catalog(ListNodes(), timeout=5).nodes if n.alive]
        if target not in live or target == self.uri:
            raise RequestRejected("copy-to.target: not a live node of this cluster; nothing was sent", field="copy-to.target")

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
        pool = self.pool if body.grant is None else ConnectionPool(dataclasses.replace(self.pool.access, token=body.grant))
        try:
            send_partition(pool, body.target, body.dataset, body.version, body.part, table)
        except (flight.FlightError, ConnectionError, OSError) as exc:  # the target's doing: the catalog tries another
            refusal = translate(exc)
            if isinstance(refusal, VersionConflict) and self._holds_the_same(body, table):
                log.info("copy-to %s: it stores %s v%d %s already, the same rows as here", body.target, body.dataset,
                         body.version, body.part)
                return Copied(0)  # the copy of a repair whose catalog died before recording it
            if isinstance(refusal, VersionConflict):
                raise PartitionDamaged(f"copy-to {body.target}: it stores other rows for {body.dataset} v{body.version} "
                                       f"{body.part} than this replica (a file no catalog placed there); not taken",
                                       field="copy-to.target") from None
            raise type(refusal)(f"copy-to {body.target}: {refusal.message}", field="copy-to.target") from None
        finally:
            if pool is not self.pool:
                pool.close()
        return Copied(size_of(table))

    def _holds_the_same(self, body: CopyTo, table: pa.Table) -> bool:
        """Whether the target of ``body``, which says it stores the partition already, serves the rows this replica
        holds. A repair takes such a copy as its own (its catalog may have died before recording it), so a file
        planted there (a writer's put to a node that holds nothing of the version) must not pass for one. Read
        batch by batch, each checked before it is compared, and left at the first that differs."""
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

    def _assemble(self, body: Assemble) -> AssembleReply:
        within_limit(body.dataset, body.version, "assemble.version")
        require_version_grant(getattr(self.caller, "guard", None), body.dataset, body.version, "assemble order")
        with self._counting_errors("assemble"):
            return self.assembler.run(body)

    def _relink(self, body: Relink) -> AssembleReply:
        within_limit(body.dataset, body.version, "relink.version")
        guard = getattr(self.caller, "guard", None)
        require_version_grant(guard, body.dataset, body.version, "relink order")
        # its source too: another writer's staged rows would otherwise be published as this writer's version
        require_version_grant(guard, body.dataset, body.source, "relink order's source", body.source_grant)
        with self._counting_errors("relink"):
            return self.assembler.relink(body)

    actions = action_table(
        Action(GetNodeInfo, _node_info, "who this node is: id, uri, ip, pid, data dir, version", "locate",
               changes_state=False),
        Action(GetStats, _stats, "bytes and batches served, partitions stored and held", "read", changes_state=False),
        Action(Held, _held, "partitions of one dataset version on this node", "node", changes_state=False),
        Action(DropFiles, _drop, "remove a dataset version's files (orders from this node's own cluster only)", "catalog"),
        Action(Seal, _seal, "keep a committed version's manifest: the version becomes immutable and rebuildable",
               "catalog"),
        Action(PartPlace, _check, "verify a partition's checksum before a reader on this host maps it", "locate",
               changes_state=False),
        Action(CheckParts, _check_parts, "verify the checksums of many partitions of one version before a reader on "
               "this host maps them; answers which failed", "locate", changes_state=False),
        Action(Scrub, _scrub, "check every stored file against its checksum now; report damaged and missing ones",
               "catalog"),
        Action(Lead, _lead, "a catalog took the lease: refuse orders of lower epochs, report to it", "catalog"),
        Action(CopyTo, _copy_to, "send a partition to another live node of the cluster (replication)", "catalog"),
        Action(Assemble, _assemble, "build partitions of a new grid from a committed version (repartition, rebalance, "
               "append): pulled from their holders, linked when unchanged", "write"),
        Action(Relink, _relink, "link partitions this node holds into an uncommitted version (a stream append made "
               "again on top of a newer version)", "write"),
    )
