"""``Client``: what a user holds to talk to a flightpart cluster.

One object with an explicit lifetime (``with fp.connect(...) as client:``), thread-safe, reusing its Flight
connections, raising flightpart's own exceptions. Its :class:`~flightpart.io.access.Access` (token, TLS) reaches
every connection it makes, its datasets' reads included.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import random
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import frames, lenient
from flightpart.errors import (
    DatasetNotFound,
    FlightpartError,
    NodeUnavailable,
    OutcomeUnknown,
    ServerError,
    VersionConflict,
)
from flightpart.io.access import Access
from flightpart.io.compression import check_mode
from flightpart.io.connections import ConnectionPool
from flightpart.io.errors import translated
from flightpart.io.leader import CatalogAddresses, split_addresses, unanswered
from flightpart.io.transfer import PutCall, send_partition, send_partitions, streams_of
from flightpart.query.catalog_columns import CatalogColumns
from flightpart.regrid import balanced, near_placement
from flightpart.tiling import grid_cells
from flightpart.wire import (
    ALREADY_DROPPED,
    Abort,
    Begin,
    Commit,
    CommitPart,
    DatasetEntry,
    Drop,
    GetLeadership,
    GetQueries,
    GetStats,
    Leadership,
    ListNodes,
    ListVersions,
    Message,
    NodeRow,
    PublishBegin,
    PublishPart,
    PublishReply,
    QueriesReply,
    Relink,
    Repair,
    StatsReply,
    VersionInfo,
    VersionReply,
    check_name,
    dataset_path,
    decode_flight_info,
    list_entry,
)

from . import reshape
from .dataset import Dataset
from .fetch import IDLE_TIMEOUT, MAPS, FlightGet, check_streams
from .plugins import runtime_of
from .progress import Progress, Reporter, reporter
from .sql import SqlResult, run_sql
from .users import Users

STREAM_PARTITION_BYTES = 64 << 20
"""The size of the row blocks a stream is cut into when no rows_per_partition is given."""
STREAM_PUTS_IN_FLIGHT = 2
"""Partitions of a stream being sent at once (per replica) while the next one fills."""
REBASE_ATTEMPTS = 12
"""Times a write is computed again from the latest version after losing a race (VERSION_CONFLICT on commit.base)."""


@dataclasses.dataclass(frozen=True)
class RoundRobin:
    """Where a put's partitions go: the ``k``-th to ``replicas`` nodes of ``targets`` in turn, from ``targets[first]``
    (a random ``first`` spreads small puts over the nodes instead of always starting at one)."""

    targets: list[NodeRow]
    replicas: int
    first: int = 0

    def holders(self, k: int) -> list[NodeRow]:
        return [self.targets[(self.first + k + r) % len(self.targets)] for r in range(self.replicas)]


class Client:
    """A connection to one catalog (and, through it, to every node)."""

    def __init__(self, uri: str, *, host: str | None = None, access: Access | None = None, timeout: float = 30.0,
                 idle_timeout: float = IDLE_TIMEOUT, compression: str = "auto", streams_per_partition: int = 1,
                 owned: Sequence[Any] = ()):
        self.catalogs = CatalogAddresses(split_addresses(uri))
        self.host = host
        self.access = access or Access()
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self.compression = check_mode(compression)
        self.streams_per_partition = check_streams(streams_per_partition)
        self.pool = ConnectionPool(self.access)
        self._owned = list(owned)
        self._grants: dict[tuple[str, int], str] = {}  # the catalog's leave to write each version this client began

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Close connections and stop any embedded servers this client started; later calls raise ClientClosed."""
        self.pool.close()
        for server in reversed(self._owned):
            server.shutdown()
        self._owned.clear()

    @property
    def closed(self) -> bool:
        return self.pool.closed

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.uri!r}{', closed' if self.closed else ''})"

    @property
    def uri(self) -> str:
        """The catalog calls go to: the leader as last heard of."""
        return self.catalogs.current

    def call(self, body: Message, timeout: float | None = None) -> Any:
        """Send a catalog action's request (a wire Message) to the leading catalog within ``timeout`` (default: the
        client's); returns the reply its class names."""
        return self.catalogs.call(lambda uri: self.pool.action(uri, body, timeout=timeout or self.timeout))

    # ------------------------------------------------------------------ cluster

    def sql(self, query: str, timeout: float | None = None) -> SqlResult:
        """``query`` (one SELECT over datasets as tables: ``sales``, ``"sales@3"``) answered by the catalog's Flight
        SQL, as any ADBC client would (docs/querying.md). A bad query is :class:`~flightpart.RequestRejected` (unknown
        tables :class:`~flightpart.DatasetNotFound`) with DuckDB's message."""
        if not isinstance(query, str) or not query.strip():
            raise ValueError("sql: expected the text of a query")
        return self.catalogs.call(lambda uri: run_sql(self.pool, uri, query, timeout or self.timeout,
                                                      idle_timeout=self.idle_timeout, compression=self.compression,
                                                      host=self.host))

    def nodes(self) -> list[NodeRow]:
        """Every node the catalog knows, alive or not: its ``node_id``, ``uri``, ``ip``, ``pid``, ``last_heartbeat``,
        ``alive``, disk (``free_bytes``, ``low_space``) and ``clock_skew``, as the catalog's ``nodes`` reply says."""
        return list(self.call(ListNodes()).nodes)

    def leadership(self) -> Leadership:
        """Which catalog leads, since when, with which epoch, and the standbys (``role`` "single" without a lease)."""
        return self.call(GetLeadership())

    def stats(self, uri: str) -> StatsReply:
        """A daemon's counters (bytes and batches served, partitions stored and held): ``values`` maps each name to
        its figure, e.g. ``client.stats(uri).values["bytes_sent"]`` (an open mapping: new counters need no new
        message)."""
        with translated():
            return self.pool.action(uri, GetStats(), timeout=self.timeout)

    @property
    def users(self) -> Users:
        """The catalog's users, groups and grants (:class:`~flightpart.client.users.Users`): an admin's calls."""
        return Users(self)

    def queries(self) -> QueriesReply:
        """The catalog's SQL queries: ``running`` and ``recent``, the most recent first, each a dict with its id,
        caller, text, start, seconds, rows, bytes the nodes sent and outcome (an admin's call)."""
        return self.call(GetQueries())

    def list(self) -> list[DatasetEntry]:
        """The latest committed version of every dataset: its name, version, shape, tiling and bytes."""
        infos = self.catalogs.call(
            lambda uri: list(self.pool.client(uri).list_flights(options=self.pool.options(self.timeout))))
        return [list_entry(info) for info in infos]

    def repair(self) -> dict:
        """Copy under-replicated partitions to live nodes; returns what was ``copied``, what is ``lost`` (no live
        replica) and what ``failed``, with reasons (a node that did not answer is skipped: run it again once it is
        back)."""
        return self.call(Repair(), timeout=3600).to_json()

    def versions(self, name: str) -> builtins.list[int]:
        return list(self.call(ListVersions(check_name(name))).versions)

    def drop(self, name: str, version: int | None = None) -> None:
        """Drop one version (or every version) of a dataset; nodes free its files, and this process its maps of them.
        A drop retried at the next catalog and found dropped there is done; DATASET_NOT_FOUND means it never existed
        or was dropped before this call."""
        request = Drop(check_name(name), version)
        lost: list[str] = []

        def once(uri: str) -> Any:
            try:
                return self.pool.action(uri, request, timeout=self.timeout)
            except BaseException as exc:
                if unanswered(exc):
                    lost.append(uri)
                raise

        try:
            self.catalogs.call(once)
        except DatasetNotFound as exc:
            if not (lost and exc.field == ALREADY_DROPPED):
                raise
        MAPS.prune(every=0)

    # ------------------------------------------------------------------ put

    def put(self, name: str, data: Any, tiling: Sequence[int] | None = None, replicas: int = 1,
            nodes: Sequence[str] | None = None, progress: Progress | Any | None = None, *,
            rows_per_partition: int | None = None) -> Dataset:
        """Store a frame or a stream as the next version of ``name``; returns it opened.

        A frame (pandas, polars, pyarrow, or anything with ``__partitioned__``) is cut by ``tiling``, by default one
        row block per node. A stream (a ``RecordBatchReader``, a ``pyarrow.dataset``, a DuckDB relation, anything with
        ``__arrow_c_stream__``) is cut as it is read into blocks of ``rows_per_partition`` rows (default about 64 MiB),
        so it may be larger than memory; so is a frame given ``rows_per_partition``. Partitions go round-robin to
        nodes, replicas to distinct nodes, and nothing is published unless every partition is stored. ``progress``: a
        function of (bytes sent, bytes total; 0 for a stream) or a bar with ``update(n)``
        (:mod:`flightpart.client.progress`).
        """
        check_name(name)
        report = reporter(progress)
        _check_rows_per_partition(rows_per_partition)
        collection = runtime_of(data)
        if collection is not None:
            if rows_per_partition is not None:
                raise ValueError("rows_per_partition: a Dask or Ray collection keeps its own partitions (one row block "
                                 "each); repartition it first")
            return self._put_collection(name, data, collection, tiling, replicas, nodes)
        stream = frames.stream_of(data)
        if stream is not None:
            if tiling is not None:
                raise ValueError("tiling: a stream is cut into row blocks as it is read; pass "
                                 "rows_per_partition= instead")
            frames.check_columns(stream.schema)
            return self._put_stream(name, stream, rows_per_partition, replicas, nodes, report)
        table = lenient.from_partitioned(data) if hasattr(data, "__partitioned__") else frames.to_arrow(data)
        frames.check_columns(table.schema)
        if rows_per_partition is not None:  # a frame cut as a stream is: row blocks of that many rows, the last shorter
            if tiling is not None:
                raise ValueError("tiling and rows_per_partition both cut the rows: pass one of them")
            return self._put_stream(name, table.to_reader(), rows_per_partition, replicas, nodes, report)
        targets = self._targets_for(nodes, replicas)
        grid = _grid(tiling, len(targets))
        spread = RoundRobin(targets, replicas, random.randrange(len(targets)))

        def store(version: int) -> Commit:
            parts = self._send_frame(name, version, table, grid, spread, report)
            return Commit(name, version, table.schema, frames.frame_shape(table), grid, tuple(parts), replicas)

        return self._rebasing(lambda: self._versioned(name, store))

    def _send_frame(self, name: str, version: int, table: pa.Table, grid: tuple[int, int], spread: RoundRobin,
                    progress: Reporter | None, *, base: tuple[int, int] = (0, 0)) -> builtins.list[CommitPart]:
        """``table`` cut by ``grid`` and sent to the nodes ``spread`` names in turn, placed after ``base`` (row blocks,
        rows) of an appended-to version; the commit's partitions."""
        cells = grid_cells(frames.frame_shape(table), grid)
        parts = frames.split_grid(table, grid)

        def at(pos: tuple[int, ...]) -> tuple[int, int]:
            return (pos[0] + base[0], pos[1])

        placement = {at(c.position): spread.holders(k) for k, c in enumerate(cells)}
        self._send(name, version, {at(pos): t for pos, t in parts.items()}, placement, progress)
        return [CommitPart(at(c.position), (c.start[0] + base[1], c.start[1]), (c.shape[0], c.shape[1]),
                           tuple(n.node_id for n in placement[at(c.position)])) for c in cells]

    def _versioned(self, name: str, store: Callable[[int], Commit], attempts: int = 3) -> Dataset:
        """Reserve a version, store it, commit it; abort on any failure. A node that already holds the reserved number
        refuses the put with VersionConflict and the next number is taken, so no version is written twice."""
        for attempt in range(attempts):
            version = self._begin(name)
            try:
                commit = store(version)
                try:
                    self.call(commit, timeout=self.timeout * 4)
                except (NodeUnavailable, ServerError):
                    if not self._settle_commit(name, version):
                        raise
                return self.open(name, version)
            except BaseException as exc:
                try:
                    self.call(Abort(name, version), timeout=10)
                except Exception:
                    pass  # the catalog is gone too; the pending version was never published
                if not isinstance(exc, VersionConflict) or exc.field == "commit.base" or attempt == attempts - 1:
                    raise  # a lost race (commit.base) is computed again by the caller, see _rebasing
            finally:
                self._grants.pop((name, version), None)
        raise AssertionError("unreachable")

    COMMIT_OUTCOME_WAIT = 60.0
    """Seconds a writer whose commit got no answer waits for the catalog to say whether it was published."""

    def _settle_commit(self, name: str, version: int) -> bool:
        """Whether a commit that got no answer was published.

        The version was reserved for this write alone, so "v is committed" means this commit was. A version still
        pending is aborted first, so False is final. Raises OutcomeUnknown when the catalog does not answer for
        :attr:`COMMIT_OUTCOME_WAIT` seconds.
        """
        deadline = time.monotonic() + max(self.COMMIT_OUTCOME_WAIT, self.timeout)
        while True:
            try:
                if self._published(name, version):
                    return True
                self.call(Abort(name, version), timeout=10)
                return self._published(name, version)
            except (NodeUnavailable, ServerError) as exc:
                if time.monotonic() > deadline:
                    raise OutcomeUnknown(f"the commit of {name} v{version} got no answer and the catalog "
                                         f"{self.uri} has not answered since ({exc}); once it is back, `flightpart ls` "
                                         "or client.versions() says whether it was published "
                                         "(whole, or not at all)") from None
                time.sleep(0.5)

    def _published(self, name: str, version: int) -> bool:
        try:
            self.info(name, version)
            return True
        except DatasetNotFound:
            return False

    def _rebasing(self, attempt: Callable[[], Dataset]) -> Dataset:
        """``attempt()`` (read the latest, store, commit) again, after a jittered backoff, while it loses a race to
        another writer: the catalog commits only on top of the latest version (``Commit.base``). Only writes whose input
        is still in hand come here."""
        for k in range(REBASE_ATTEMPTS):
            try:
                return attempt()
            except VersionConflict as exc:
                if exc.field != "commit.base" or k == REBASE_ATTEMPTS - 1:
                    raise
            time.sleep(random.uniform(0, min(0.02 * 2 ** k, 1.0)))
        raise AssertionError("unreachable")

    def _put_collection(self, name: str, data: Any, runtime: Any, tiling: Sequence[int] | None, replicas: int,
                        nodes: Sequence[str] | None) -> Dataset:
        """A Dask DataFrame or Ray Dataset: sent by the workers that hold it."""
        kind = runtime.__name__.rsplit(".", 1)[-1]
        if replicas != 1:
            raise ValueError(f"replicas={replicas}: a {kind} collection is put with one replica; add more with repair")
        if tiling is not None:
            raise ValueError(f"tiling: a {kind} collection keeps its own partitions (one row block each); "
                             "pass tiling=None")
        targets = self._target_nodes(nodes)

        def store(version: int) -> Commit:
            receipts, placement = runtime.put(self, name, data, targets, version)
            if not receipts:
                raise ValueError(f"{name}: the {kind} collection has no partitions")
            start, parts = 0, []
            for k, (receipt, (_holder, node)) in enumerate(zip(receipts, placement)):
                parts.append(CommitPart((k, 0), (start, 0), (receipt.rows, receipt.cols), (node.node_id,)))
                start += receipt.rows
            return Commit(name, version, receipts[0].schema, (start, receipts[0].cols), (len(parts), 1), tuple(parts))

        return self._rebasing(lambda: self._versioned(name, store))

    def _targets_for(self, nodes: Sequence[str] | None, replicas: int) -> builtins.list[NodeRow]:
        targets = self._target_nodes(nodes)
        if not isinstance(replicas, int) or not 1 <= replicas <= len(targets):
            raise ValueError(f"replicas must be between 1 and the {len(targets)} usable nodes, got {replicas!r}")
        return targets

    def _put_stream(self, name: str, reader: pa.RecordBatchReader, rows_per_partition: int | None, replicas: int,
                    nodes: Sequence[str] | None, progress: Reporter | None) -> Dataset:
        """Cut a stream into row blocks as it is read and send each once complete."""
        targets = self._targets_for(nodes, replicas)
        spread = RoundRobin(targets, replicas, random.randrange(len(targets)))
        schema = reader.schema
        once = _OneShot(name)

        def store(version: int) -> Commit:
            once.use()
            parts = self._send_stream(name, version, reader, rows_per_partition, spread, progress)
            total = parts[-1].start[0] + parts[-1].shape[0]
            return Commit(name, version, schema, (total, frames.frame_shape(frames.empty_table(schema))[1]),
                          (len(parts), 1), tuple(parts), replicas)

        return self._versioned(name, store)

    def _send_stream(self, name: str, version: int, reader: pa.RecordBatchReader, rows_per_partition: int | None,
                     spread: RoundRobin, progress: Reporter | None, *, groups: int = 1,
                     base: tuple[int, int] = (0, 0)) -> builtins.list[CommitPart]:
        """Row blocks of ``reader`` (``rows_per_partition`` rows) in ``groups`` column groups, sent as they fill, after
        ``base`` of an appended-to version. At most :data:`STREAM_PUTS_IN_FLIGHT` are in flight, so memory holds a few
        partitions whatever the stream's length. An empty stream is one empty block, unless appended."""
        _check_rows_per_partition(rows_per_partition)
        schema = reader.schema
        widths = [len(g) for g in frames.column_groups(frames.data_columns(frames.empty_table(schema)), groups)]
        parts: list[CommitPart] = []
        sending: deque = deque()
        sent_rows = [0]
        with ThreadPoolExecutor(max_workers=len(spread.targets), thread_name_prefix="flightpart-put") as pool:

            def send(batches: list[pa.RecordBatch], rows: int) -> None:
                k = len(parts) // groups
                start = base[1] + sent_rows[0]
                sent_rows[0] += rows
                table = pa.Table.from_batches(batches, schema)
                holders = spread.holders(k)
                for (_i, j), piece in sorted(frames.split_grid(table, (1, groups)).items()):
                    pos = (base[0] + k, j)
                    for node in holders:
                        sending.append(pool.submit(self._send_one, node.uri, name, version, pos, piece, progress))
                    parts.append(CommitPart(pos, (start, sum(widths[:j])), (rows, widths[j]),
                                            tuple(n.node_id for n in holders)))
                while len(sending) > STREAM_PUTS_IN_FLIGHT * spread.replicas * groups:
                    sending.popleft().result()

            pending: list[pa.RecordBatch] = []
            rows = 0
            limit = rows_per_partition
            for batch in reader:
                while batch.num_rows:
                    if limit is None:  # about 64 MiB per partition, from the first batch's width
                        limit = max(1, STREAM_PARTITION_BYTES * batch.num_rows // max(frames.size_of(batch), 1))
                    take = min(batch.num_rows, limit - rows)
                    piece, batch = batch.slice(0, take), batch.slice(take)
                    pending.append(piece)
                    rows += piece.num_rows
                    if rows >= limit:
                        send(pending, rows)
                        pending, rows = [], 0
            if pending or (not parts and base == (0, 0)):
                send(pending, rows)  # the last block (an empty stream put alone is one empty partition)
            for future in sending:
                future.result()
        return parts

    def _send_one(self, uri: str, name: str, version: int, part: tuple[int, int], table: pa.Table,
                  progress: Reporter | None = None) -> None:
        with translated():  # a node that stops taking data fails the put within its deadline
            send_partition(self.pool, uri, name, version, part, table, self._put_call(name, version, progress))

    def _put_call(self, name: str, version: int, progress: Reporter | None) -> PutCall:
        """How this client's puts into ``version`` go: its timeout, ``progress`` told the bytes, the version's grant."""
        return PutCall(self.timeout, progress.add if progress is not None else None, self.grant_for(name, version))

    def _begin(self, name: str) -> int:
        """Reserve the next version of ``name``, keeping the catalog's grant to write it."""
        return self._granted(name, self.call(Begin(name)))

    def _granted(self, name: str, reply: VersionReply) -> int:
        if reply.grant is not None:
            self._grants[(name, reply.version)] = reply.grant
        return reply.version

    def grant_for(self, name: str, version: int) -> str | None:
        """The catalog's grant for this client to write ``version`` of ``name`` (None: not needed, or not begun here),
        which its puts, orders and Dask and Ray tasks carry."""
        return self._grants.get((name, version))

    def _target_nodes(self, nodes: Sequence[str] | None) -> builtins.list[NodeRow]:
        """Live nodes to put to (those named by ``nodes``), without nodes low on disk while others have room."""
        alive = [n for n in self.nodes() if n.alive]
        if nodes is not None:
            wanted = set(nodes)
            alive = [n for n in alive if wanted & {n.node_id, n.uri, n.ip}]
        roomy = [n for n in alive if not n.low_space]
        alive = roomy or alive
        if not alive:
            raise NodeUnavailable(
                "no live node to put to" + (f" among {list(nodes)}" if nodes is not None else "")
                + "; start one with `flightpart serve --catalog " + self.uri + "`"
            )
        return alive

    def _send(self, name: str, version: int, parts: dict, placement: dict, progress: Reporter | None) -> None:
        """Every partition to its nodes: one thread per node, small partitions several to a stream."""
        by_node: dict[str, list] = {}
        for pos, holders in placement.items():
            for node in holders:
                by_node.setdefault(node.uri, []).append(pos)
        if progress is not None:
            progress.expect(sum(frames.size_of(parts[pos]) * len(h) for pos, h in placement.items()))

        def send_all(uri: str) -> None:
            for group in streams_of(by_node[uri], parts):
                if len(group) == 1:
                    self._send_one(uri, name, version, group[0], parts[group[0]], progress)
                else:
                    with translated():
                        send_partitions(self.pool, uri, name, version, [(pos, parts[pos]) for pos in group],
                                        self._put_call(name, version, progress))

        with ThreadPoolExecutor(max_workers=len(by_node), thread_name_prefix="flightpart-put") as ex:
            for future in [ex.submit(send_all, uri) for uri in by_node]:
                future.result()

    # ------------------------------------------------------------------ new versions built on the nodes

    def repartition(self, name: str, tiling: Sequence[int], nodes: Sequence[str] | None = None,
                    replicas: int | None = None) -> Dataset:
        """The next version of ``name`` cut by ``tiling`` (row blocks, column groups), built by the nodes.

        Each new partition is assembled on a node that will hold it, pulling what it needs from the current holders:
        no data passes through this process. Partitions go to ``nodes`` (default: every live node), preferring the
        node holding most of its rows up to its share; ``replicas`` copies each (default: as now). Published only when
        every partition is stored; a write that commits first makes it plan again from the new latest version.
        """
        grid = _grid(tiling, 1)
        return self._rebasing(lambda: self._repartition_latest(name, grid, nodes, replicas))

    def _repartition_latest(self, name: str, grid: tuple[int, int], nodes: Sequence[str] | None,
                            replicas: int | None) -> Dataset:
        """One try of :meth:`repartition`, planned from the latest version and committed on top of it only."""
        source = self.info(name)
        if grid[1] > max(source.shape[1], 1):
            raise ValueError(f"tiling {grid}: {source.shape[1]} columns cannot make {grid[1]} column groups")
        replicas = reshape.replicas_of(source) if replicas is None else replicas
        targets = self._targets_for(nodes, replicas)
        cells = grid_cells(source.shape, grid)
        rows = {(c.position[0], c.position[1]): (c.start[0], c.start[0] + c.shape[0]) for c in cells}
        weights = reshape.source_bytes(source, list(rows.values()))
        chosen = near_placement(weights, [n.uri for n in targets], replicas)
        by_uri = {n.uri: n for n in targets}
        placement = {position: [by_uri[u] for u in uris] for position, uris in zip(rows, chosen)}

        def store(version: int) -> Commit:
            with self._reading(source):
                parts = reshape.assemble_on_nodes(self.pool, source, version, grid[1], rows, placement,
                                                  timeout=self.timeout, grant=self.grant_for(source.dataset, version))
            return Commit(name, version, source.schema, source.shape, grid, tuple(parts), replicas, base=source.version)

        return self._versioned(name, store)

    def rebalance(self, name: str, nodes: Sequence[str] | None = None) -> Dataset:
        """The next version of ``name`` with partitions moved so that bytes per node differ by at most one partition
        (over ``nodes``, when given). Staying partitions are linked, moving ones pulled by their new node; returns the
        current version when nothing moves. A write that commits first makes it plan again."""
        return self._rebasing(lambda: self._rebalance_latest(name, nodes))

    def _rebalance_latest(self, name: str, nodes: Sequence[str] | None) -> Dataset:
        """One try of :meth:`rebalance`, planned from the latest version and committed on top of it only."""
        source = self.info(name)
        live = self._target_nodes(nodes)
        holders = {p.position: [uri for uri, _ip, _pid in p.replicas] for p in source.parts}
        placed = balanced({p.position: p.nbytes for p in source.parts}, holders, [n.uri for n in live])
        if all(sorted(placed[pos]) == sorted(holders[pos]) for pos in placed):
            return self.open(name, source.version)
        by_uri = {n.uri: n for n in live}
        placement = {pos: [by_uri[u] for u in uris] for pos, uris in placed.items()}
        rows = {p.position: (p.start[0], p.start[0] + p.shape[0]) for p in source.parts}

        def store(version: int) -> Commit:
            with self._reading(source):
                parts = reshape.assemble_on_nodes(self.pool, source, version, source.grid[1], rows, placement,
                                                  timeout=self.timeout, grant=self.grant_for(name, version))
            return Commit(name, version, source.schema, source.shape, source.grid, tuple(parts),
                          reshape.replicas_of(source), base=source.version)

        return self._versioned(name, store)

    def append(self, name: str, data: Any, nodes: Sequence[str] | None = None, *,
               rows_per_partition: int | None = None) -> Dataset:
        """The next version of ``name``: every row of the current one, then the rows of ``data``.

        Current partitions are linked into the new version, not copied, so either version may be dropped alone. The
        new rows are cut like a put's into the same column groups and replicas; ``data`` must have the dataset's columns
        and types. The version commits only on top of the one it was computed from: if another write commits first, a
        frame is appended again to the new latest, and a stream (read once into a staging version never published) is
        linked again. An append racing a whole-dataset drop fails with DatasetNotFound. So an acknowledged append's rows
        are in the latest version until a later write replaces or drops them.
        """
        stream = frames.stream_of(data)
        if stream is not None:
            return self._append_stream(name, stream, nodes, rows_per_partition)
        table = lenient.from_partitioned(data) if hasattr(data, "__partitioned__") else frames.to_arrow(data)
        if rows_per_partition is not None:  # cut as a stream's rows are
            return self._append_stream(name, table.to_reader(), nodes, rows_per_partition)
        return self._rebasing(lambda: self._append_latest(name, table, nodes))

    def _append_stream(self, name: str, stream: pa.RecordBatchReader, nodes: Sequence[str] | None,
                       rows_per_partition: int | None) -> Dataset:
        """A stream's rows stored once under a staging version, then linked into a version on top of the latest."""
        source = self.info(name)
        replicas = reshape.replicas_of(source)
        targets = self._targets_for(nodes, replicas)
        groups = source.grid[1]
        uri_of = {n.node_id: n.uri for n in targets}
        staging = self._begin(name)
        try:
            spread = RoundRobin(targets, replicas, random.randrange(len(targets)))
            staged = self._send_stream(name, staging, reshape.conformed_stream(stream, source.schema),
                                       rows_per_partition, spread, None, groups=groups)
            staged = [p for p in staged if p.shape[0]]  # an empty stream adds no row block
            return self._rebasing(lambda: self._append_staged(name, source.schema, groups, staging, staged, uri_of))
        finally:
            self._grants.pop((name, staging), None)
            try:
                self.call(Abort(name, staging), timeout=10)  # the versions that link its files keep them
            except Exception:
                pass  # the catalog is gone too: the pending staging version expires by its TTL

    def _append_staged(self, name: str, schema: pa.Schema, groups: int, staging: int, staged: builtins.list[CommitPart],
                       uri_of: dict[str, str]) -> Dataset:
        """One try of a stream append: the latest version's partitions and the staged ones, committed on top of it."""
        source = self.info(name)
        if not source.schema.equals(schema) or source.grid[1] != groups:
            raise VersionConflict(f"{name}: v{source.version}, committed while the stream was stored, "
                                  "has other columns or column groups than the stream was cut for; nothing was "
                                  "published, append it again",
                                  field="append.schema")
        kept = reshape.live_holders(source, [n for n in self.nodes() if n.alive])
        base = (source.grid[0], source.shape[0])

        def store(version: int) -> Commit:
            rows = {p.position: (p.start[0], p.start[0] + p.shape[0]) for p in source.parts}
            with self._reading(source):
                old = reshape.assemble_on_nodes(self.pool, source, version, groups, rows, kept, timeout=self.timeout,
                                                grant=self.grant_for(name, version))
            order = Relink(name, staging, version, (), self.grant_for(name, staging))
            new = reshape.relink_on_nodes(self.pool, order, staged, base, uri_of, timeout=self.timeout,
                                          grant=self.grant_for(name, version))
            shape = (base[1] + sum(p.shape[0] for p in new if p.part[1] == 0), source.shape[1])
            grid = (base[0] + len({p.part[0] for p in new}), groups)
            return Commit(name, version, source.schema, shape, grid, tuple(old + new), reshape.replicas_of(source),
                          base=source.version)

        return self._versioned(name, store)

    def _append_latest(self, name: str, table: pa.Table, nodes: Sequence[str] | None) -> Dataset:
        """One try of a frame :meth:`append` onto the latest version, committed on top of it only."""
        source = self.info(name)
        kept = reshape.live_holders(source, [n for n in self.nodes() if n.alive])
        replicas = reshape.replicas_of(source)
        targets = self._targets_for(nodes, replicas)
        base = (source.grid[0], source.shape[0])
        spread = RoundRobin(targets, replicas, random.randrange(len(targets)))
        table = reshape.conformed(table, source.schema)

        def store(version: int) -> Commit:
            rows = {p.position: (p.start[0], p.start[0] + p.shape[0]) for p in source.parts}
            with self._reading(source):
                old = reshape.assemble_on_nodes(self.pool, source, version, source.grid[1], rows, kept,
                                                timeout=self.timeout, grant=self.grant_for(name, version))
            blocks = min(len(targets), table.num_rows)  # no empty row blocks: appends add up
            new = self._send_frame(name, version, table, (blocks, source.grid[1]), spread, None,
                                   base=base) if blocks else []
            parts = old + new
            shape = (base[1] + sum(p.shape[0] for p in new if p.part[1] == 0), source.shape[1])
            grid = (base[0] + len({p.part[0] for p in new}), source.grid[1])
            return Commit(name, version, source.schema, shape, grid, tuple(parts), replicas, base=source.version)

        return self._versioned(name, store)

    @contextlib.contextmanager
    def _reading(self, source: VersionInfo) -> Iterator[None]:
        """Nodes reading ``source``: a failure because the version was dropped meanwhile becomes DatasetNotFound, or
        VersionConflict when a newer version is left."""
        try:
            yield
        except FlightpartError as exc:
            if self._exists(source.dataset, source.version):
                raise
            if not self._exists(source.dataset):
                raise DatasetNotFound(f"{source.dataset!r} was dropped while this write read v{source.version}; "
                                      "nothing was published", field="commit.base") from exc
            raise VersionConflict(f"{source.dataset} v{source.version} was dropped while this write read it; "
                                  "a newer version is the latest", field="commit.base") from exc

    def _exists(self, name: str, version: int | None = None) -> bool:
        """False only when the catalog says ``name`` (``version``, default the latest) does not exist."""
        try:
            self.info(name, version)
        except DatasetNotFound:
            return False
        except FlightpartError:
            return True  # unknown (the catalog did not answer): keep the error the write met
        return True

    # ------------------------------------------------------------------ SPMD publish

    def publish_begin(self, name: str, rank: int, nranks: int) -> int:
        """SPMD: the version rank ``rank`` of ``nranks`` publishes into (joined or opened)."""
        return self._granted(name, self.call(PublishBegin(check_name(name), nranks, rank)))

    def publish_part(self, part: PublishPart) -> PublishReply:
        """SPMD: one rank's part is stored; the last rank in commits the version."""
        reply = self.call(part)
        self._grants.pop((part.dataset, part.version), None)  # this rank writes nothing more to it
        return reply

    # ------------------------------------------------------------------ open

    def info(self, name: str, version: int | None = None) -> VersionInfo:
        """What the catalog says of the latest committed version of ``name`` (or ``version``), without opening it:
        schema, shape, tiling and each partition's replicas."""
        path = dataset_path(check_name(name), version)
        info = self.catalogs.call(lambda uri: self.pool.client(uri).get_flight_info(
            flight.FlightDescriptor.for_path(*path), options=self.pool.options(self.timeout)))
        return decode_flight_info(info)

    def open(self, name: str, version: int | None = None, *, rank: int | None = None, nranks: int | None = None,
             halo: tuple[int, int] | None = None, periodic: bool = False) -> Dataset:
        """The latest committed version of ``name`` (or ``version``).

        With ``rank``/``nranks``, the SPMD view (``locals``: this rank's partitions; others' ``data`` is None). With
        ``halo=(left, right)`` each local partition carries its neighbours' rows as padding (``periodic`` wraps).
        """
        if (halo is not None or periodic) and rank is None and nranks is None:
            raise ValueError("halo= and periodic= need the SPMD view: pass rank= and nranks= too")
        ds = self.dataset_of(self.info(name, version))
        if rank is not None or nranks is not None:
            ds = ds.spmd(rank, nranks, halo=halo, periodic=periodic)
        return ds


    def dataset_of(self, version_info: VersionInfo) -> Dataset:
        """The dataset a version's FlightInfo (decoded) describes, read by this client's host, credential and
        settings, as :meth:`open` gives it."""
        # what the dataset's get carries: a capability for this version alone when the cluster issues one
        reader = (dataclasses.replace(self.access, token=version_info.capability) if version_info.capability
                  else self.access)
        get = FlightGet(self.host, reader, self.idle_timeout, self.compression, self.streams_per_partition,
                        CatalogColumns.of(version_info))
        return Dataset.from_version(version_info, get)


class _OneShot:
    """Guards a store that reads a stream: a second try would find it consumed."""

    def __init__(self, name: str):
        self.name = name
        self.used = False

    def use(self) -> None:
        if self.used:
            raise VersionConflict(f"{self.name}: the stream was consumed by a first try that could not be committed "
                                  "(another version took its place); nothing of it was published, write it again",
                                  field="commit.base")
        self.used = True


def _check_rows_per_partition(value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or value < 1):
        raise ValueError(f"rows_per_partition must be a positive integer, got {value!r}")


def _grid(value: Sequence[int] | None, nodes: int) -> tuple[int, int]:
    if value is None:
        return (nodes, 1)
    grid = tuple(value)
    if len(grid) != 2 or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in grid):
        raise ValueError(f"tiling must be (row blocks, column groups) of positive integers, got {value!r}")
    return grid  # type: ignore[return-value]
