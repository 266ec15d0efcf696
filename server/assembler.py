"""A node building partitions of a new grid from a committed version: repartition, rebalance, append.

The node that will hold a partition gathers it: its own rows from disk, the others pulled with sliced,
projected tickets, so data crosses the network once. The source's geometry comes from the catalog, not the
caller, so a caller can neither point the node at another host nor make it read outside the source.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import frames
from flightpart.errors import DatasetNotFound, NodeUnavailable, PartitionMissing, RequestRejected, VersionConflict
from flightpart.io.connections import ConnectionPool
from flightpart.io.errors import translated
from flightpart.io.hosts import host_addresses
from flightpart.io.pull import Expected, ReadOptions, read_replicas
from flightpart.io.transfer import BATCH_BYTES, batches_of, split_batch
from flightpart.query.apply import apply_ticket
from flightpart.regrid import Piece, is_whole, pieces_of
from flightpart.tiling import starts_from_sizes
from flightpart.wire import (
    Assemble,
    AssemblePart,
    AssembleReply,
    HeldPartition,
    Relink,
    Ticket,
    VersionInfo,
    dataset_path,
    decode_flight_info,
)

from .store import PartitionStore

log = logging.getLogger("flightpart.node")

PULLS_IN_FLIGHT = 4
"""Pieces of one partition fetched at once."""


class Assembler:
    """Builds the partitions an ``assemble`` order names, on the node that holds ``store``."""

    def __init__(self, store: PartitionStore, pool: ConnectionPool, uri: str, catalog: Callable[[], str | None],
                 count: Callable[..., None], timeout: float = 30.0):
        self.store = store
        self.pool = pool
        self.uri = uri
        self._catalog = catalog  # the leading catalog's address, asked at each use (it moves at a takeover)
        self.count = count
        self.timeout = timeout

    @property
    def catalog_uri(self) -> str | None:
        return self._catalog()

    def run(self, order: Assemble) -> AssembleReply:
        if order.version == order.source:
            raise RequestRejected(f"assemble: version {order.version} is the source itself", field="version")
        deadline = _Deadline(order.deadline_ms)
        source = self._source(order.dataset, order.source, deadline)
        self._check_pending(order.dataset, order.version, deadline)
        data_cols = len(frames.data_columns(frames.empty_table(source.schema)))
        if not 1 <= order.groups <= max(data_cols, 1):
            raise RequestRejected(f"assemble.groups: expected 1 to {max(data_cols, 1)} column groups, got "
                                  f"{order.groups}",
                                  field="assemble.groups")
        plan = _Plan(source, order.groups)
        receipts: list[HeldPartition] = []
        linked = 0
        written = False
        for target in order.parts:
            deadline.check(f"assemble {order.dataset} v{order.version}")
            pieces = plan.pieces(target)
            whole = is_whole(pieces, plan.row_sizes, plan.source_groups)
            if whole is not None and self._holds(source, whole.source):
                try:
                    receipts.append(self.store.link(order.dataset, order.source, whole.source, order.version,
                                                    target.part))
                except PartitionMissing:  # damaged (quarantined) or gone meanwhile: gathered from its other replicas
                    pass
                else:
                    linked += 1
                    self.count(partitions_linked=1, assembled_rows=receipts[-1].rows)
                    continue
            table = frames.from_pieces(self._gather(plan, pieces, deadline), plan.schema(target.part[1]))
            batches = (piece for batch in batches_of(table) for piece in split_batch(batch, BATCH_BYTES))
            receipts.append(self.store.write(order.dataset, order.version, target.part, table.schema, batches,
                                             sync_directory=False))
            written = True
            self.count(partitions_assembled=1)
        if written:
            self.store.sync(order.dataset, order.version)
        return AssembleReply(tuple(receipts), linked)

    def relink(self, order: Relink) -> AssembleReply:
        """Link partitions this node holds of ``order.source`` into the uncommitted ``order.version``."""
        if order.version == order.source:
            raise RequestRejected(f"relink: version {order.version} is the source itself", field="version")
        self._check_pending(order.dataset, order.version, _Deadline(None))
        receipts = tuple(self.store.link(order.dataset, order.source, p.source, order.version, p.part)
                         for p in order.parts)
        self.count(partitions_linked=len(receipts))
        return AssembleReply(receipts, len(receipts))

    def _source(self, dataset: str, version: int, deadline: _Deadline) -> VersionInfo:
        """The committed source version as the catalog describes it."""
        if self.catalog_uri is None:
            raise RequestRejected("assemble: this node has no catalog to describe the source version", field="catalog")
        descriptor = flight.FlightDescriptor.for_path(*dataset_path(dataset, version))
        options = self.pool.options(deadline.timeout(self.timeout))
        with translated():
            info = self.pool.client(self.catalog_uri).get_flight_info(descriptor, options=options)
        return decode_flight_info(info)

    def _check_pending(self, dataset: str, version: int, deadline: _Deadline) -> None:
        """A committed version takes no new partition: the catalog must not know ``version`` as committed."""
        try:
            self._source(dataset, version, deadline)
        except DatasetNotFound:
            return
        raise VersionConflict(f"{dataset} v{version} is committed; its partitions cannot change", field="version")

    def _holds(self, source: VersionInfo, position: tuple[int, int]) -> bool:
        return self.store.path(source.dataset, source.version, position).exists()

    def _gather(self, plan: _Plan, pieces: list[list[Piece]], deadline: _Deadline) -> list[list[pa.Table]]:
        """Every piece as a table, the ones this node holds read from disk and the others pulled in parallel."""
        flat = [piece for block in pieces for piece in block]
        with ThreadPoolExecutor(max_workers=min(PULLS_IN_FLIGHT, max(len(flat), 1)),
                                thread_name_prefix="flightpart-pull") as ex:
            tables = list(ex.map(lambda piece: self._piece(plan, piece, deadline), flat))
        out, k = [], 0
        for block in pieces:
            out.append(tables[k:k + len(block)])
            k += len(block)
        return out

    def _piece(self, plan: _Plan, piece: Piece, deadline: _Deadline) -> pa.Table:
        source = plan.source
        info = plan.parts.get(piece.source)
        if info is None:
            raise PartitionMissing(f"{source.dataset} v{source.version} has no partition {piece.source}", field="part")
        if self._holds(source, piece.source):
            try:
                table = apply_ticket(self.store.open(source.dataset, source.version, piece.source), piece.columns,
                                     piece.rows)
            except PartitionMissing:  # its checksum failed (now quarantined): pulled from another replica below
                pass
            else:
                self.count(assembled_rows=table.num_rows)
                return table
        replicas = [r for r in info.replicas if r[0] != self.uri]
        ticket = Ticket(source.dataset, source.version, piece.source, piece.columns, piece.rows)
        expected = Expected(rows=piece.rows[1] - piece.rows[0],
                            most_bytes=max(info.nbytes, 1) if plan.bytes_bounded else 0)
        table = read_replicas(self.pool, ticket, replicas,
                              f"partition {piece.source} of {source.dataset!r} v{source.version}",
                              expected, ReadOptions(here=host_addresses(), deadline=deadline.at))
        try:  # read safely already (read_replicas); now all of it, text as UTF-8 too, as a put's batches are
            table.validate(full=True)
        except pa.ArrowException as exc:
            raise RequestRejected(f"partition {piece.source} of {source.dataset!r} v{source.version}: a holder sent "
                                  f"values that are not valid Arrow, not stored ({str(exc)[:200]})",
                                  field="part") from None
        self.count(assembled_rows=table.num_rows, pulled_bytes=frames.size_of(table))
        return table


class _Deadline:
    """When the caller of an ``assemble`` stops waiting (``None``: it named no deadline, as older clients do)."""

    REPLY_SHARE = 0.2
    """The part of the caller's wait kept for the answer: a node that gives up on a silent source a little
    before its caller does can still say which source it was (else the caller only sees this node late)."""

    def __init__(self, deadline_ms: int | None):
        if deadline_ms is None:
            self.at = None
        else:
            wait = deadline_ms / 1000
            self.at = time.monotonic() + wait - min(max(wait * self.REPLY_SHARE, 0.25), 5.0)

    def timeout(self, default: float) -> float:
        """A call's timeout: ``default``, cut to what is left of the caller's deadline."""
        if self.at is None:
            return default
        return max(0.001, min(default, self.at - time.monotonic()))

    def check(self, what: str) -> None:
        """NodeUnavailable once the caller has given up: work past it would only be aborted."""
        if self.at is not None and time.monotonic() > self.at:
            raise NodeUnavailable(f"{what}: the caller's deadline passed before this node finished", field="deadline")


class _Plan:
    """One source version's grid, and the columns and schema of each column group of the new grid."""

    def __init__(self, source: VersionInfo, groups: int):
        self.source = source
        self.parts = {p.position: p for p in source.parts}
        self.row_sizes = [p.shape[0] for p in sorted(source.parts, key=lambda p: p.position) if p.position[1] == 0]
        self.row_starts = starts_from_sizes(self.row_sizes)
        self.source_groups = frames.stored_columns(source.schema, source.grid[1])
        self.target_groups = frames.stored_columns(source.schema, groups)
        # a peer's piece is bounded by its partition's stored bytes, unless a column may take more bytes sent
        self.bytes_bounded = (source.schema is not None
                              and not any(frames.sent_unlike_stored(f.type) for f in source.schema))

    def pieces(self, target: AssemblePart) -> list[list[Piece]]:
        (i, j), (lo, hi) = target.part, target.rows
        if j >= len(self.target_groups) or i >= 1 << 31:
            raise RequestRejected(f"assemble.parts: position {target.part} is outside a grid of "
                                  f"{len(self.target_groups)} column groups", field="assemble.parts")
        if not lo <= hi <= self.source.shape[0]:
            raise RequestRejected(f"assemble.parts: rows [{lo}, {hi}) of {target.part} are outside the source's "
                                  f"{self.source.shape[0]} rows", field="assemble.parts")
        return pieces_of(target.rows, self.target_groups[j], self.row_sizes, self.source_groups, self.row_starts)

    def schema(self, j: int) -> pa.Schema:
        full = self.source.schema
        return pa.schema([full.field(c) for c in self.target_groups[j]], metadata=full.metadata)
