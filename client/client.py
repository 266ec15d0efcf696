"""``Client``: what a user holds to talk to a flightpart cluster.

One object, an explicit lifetime (``with fp.connect(...) as client:``),
thread-safe, reusing its Flight connections, raising flightpart's own
exceptions with messages that say what to do. Its
:class:`~flightpart.io.access.Access` (token, TLS) reaches every connection
it makes, the reads of the datasets it opens included.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import frames, lenient
from flightpart.errors import NodeUnavailable, VersionConflict
from flightpart.io.access import Access
from flightpart.io.connections import ConnectionPool
from flightpart.io.errors import translated
from flightpart.io.transfer import send_partition, send_partitions, streams_of
from flightpart.tiling import grid_cells
from flightpart.wire import (
    Commit,
    CommitPart,
    DatasetRef,
    Drop,
    Empty,
    PublishBegin,
    PublishPart,
    PublishReply,
    VersionRef,
    VersionReply,
    check_name,
    dataset_path,
    decode_flight_info,
    list_entry,
)

from .dataset import Dataset
from .fetch import IDLE_TIMEOUT, MAPS, FlightGet
from .plugins import runtime_of

Progress = Callable[[int, int], None]  # (bytes done, bytes total)
STREAM_PARTITION_BYTES = 64 << 20
"""The size of the row blocks a stream is cut into when no rows_per_partition is given."""
STREAM_PUTS_IN_FLIGHT = 2
"""Partitions of a stream being sent at once (per replica) while the next one fills."""


class Client:
    """A connection to one catalog (and, through it, to every node)."""

    def __init__(self, uri: str, *, host: str | None = None, access: Access | None = None, timeout: float = 30.0,
                 idle_timeout: float = IDLE_TIMEOUT, owned: Sequence[Any] = ()):
        self.uri = uri
        self.host = host
        self.access = access or Access()
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self.pool = ConnectionPool(self.access)
        self._owned = list(owned)

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

    def call(self, action: str, body: Any = None, timeout: float | None = None) -> Any:
        """Run a catalog action (a wire Message or JSON body) within ``timeout`` (default: the client's); its JSON reply."""
        with translated():
            return self.pool.action(self.uri, action, body, timeout=timeout or self.timeout)

    # ------------------------------------------------------------------ cluster

    def nodes(self) -> list[dict]:
        """Every node the catalog knows: id, uri, ip, pid, last heartbeat, alive."""
        return self.call("nodes", Empty())

    def stats(self, uri: str) -> dict:
        """A node's counters (bytes and batches served, partitions stored and held)."""
        with translated():
            return self.pool.action(uri, "stats", Empty(), timeout=self.timeout)

    def list(self) -> list[dict]:
        """The latest committed version of every dataset."""
        with translated():
            infos = list(self.pool.client(self.uri).list_flights(options=self.pool.options(self.timeout)))
        return [list_entry(info) for info in infos]

    def repair(self) -> dict:
        """Copy under-replicated partitions to live nodes; returns what was copied and what is lost."""
        return self.call("repair", Empty(), timeout=3600)

    def versions(self, name: str) -> list[int]:
        return self.call("versions", DatasetRef(check_name(name)))

    def drop(self, name: str, version: int | None = None) -> None:
        """Drop one version (or every version) of a dataset; nodes free its files, and this process its maps of them."""
        self.call(Drop.ACTION, Drop(check_name(name), version))
        MAPS.prune(every=0)

    # ------------------------------------------------------------------ put

    def put(self, name: str, data: Any, tiling: Sequence[int] | None = None, replicas: int = 1,
            nodes: Sequence[str] | None = None, progress: Progress | None = None, *,
            rows_per_partition: int | None = None) -> Dataset:
        """Store a frame or a stream as the next version of ``name``; returns it opened.

        A frame (pandas, polars, pyarrow, or any object with
        ``__partitioned__``, read as :func:`flightpart.from_partitioned` reads it) is cut by ``tiling``, by default one
        row block per node (the Dist RFC's default partition). A stream (a
        ``RecordBatchReader``, a ``pyarrow.dataset`` over Parquet files, a
        DuckDB relation, any object with ``__arrow_c_stream__``) is cut into
        row blocks as it is read, of ``rows_per_partition`` rows (default:
        about 64 MiB each), so a dataset larger than this process's memory
        can be put. Partitions go round-robin to nodes, replicas to distinct
        nodes, puts to different nodes run in parallel, and nothing is
        published unless every partition is stored.
        """
        check_name(name)
        collection = runtime_of(data)
        if collection is not None:
            return self._put_collection(name, data, collection, tiling, replicas, nodes)
        stream = frames.stream_of(data)
        if stream is not None:
            if tiling is not None:
                raise ValueError("tiling: a stream is cut into row blocks as it is read; pass rows_per_partition= instead")
            return self._put_stream(name, stream, rows_per_partition, replicas, nodes, progress)
        table = lenient.from_partitioned(data) if hasattr(data, "__partitioned__") else frames.to_arrow(data)
        targets = self._targets_for(nodes, replicas)
        grid = _grid(tiling, len(targets))
        shape = frames.frame_shape(table)
        cells = {c.position: c for c in grid_cells(shape, grid)}
        parts = frames.split_grid(table, grid)
        first = random.randrange(len(targets))  # spreads small puts over the nodes instead of always starting at one
        placement = {pos: [targets[(first + k + r) % len(targets)] for r in range(replicas)] for k, pos in enumerate(sorted(parts))}

        def store(version: int) -> Commit:
            self._send(name, version, parts, placement, progress)
            return Commit(name, version, table.schema, shape, grid, tuple(
                CommitPart(pos, cells[pos].start, cells[pos].shape, tuple(n["node_id"] for n in placement[pos]))
                for pos in sorted(parts)), replicas)

        return self._versioned(name, store)

    def _versioned(self, name: str, store: Callable[[int], Commit], attempts: int = 3) -> Dataset:
        """Reserve a version, store it, commit it; abort on any failure.

        A node that already has the reserved version number (a catalog that
        lost its state hands out a number before its nodes re-registered)
        refuses the put with VersionConflict; the put then takes the next
        number, so no version is ever written twice.
        """
        for attempt in range(attempts):
            version = VersionReply.from_json(self.call("begin", DatasetRef(name))).version
            try:
                self.call(Commit.ACTION, store(version), timeout=self.timeout * 4)
                return self.open(name, version)
            except BaseException as exc:
                try:
                    self.call("abort", VersionRef(name, version), timeout=10)
                except Exception:
                    pass  # the catalog is gone too; the pending version was never published
                if not isinstance(exc, VersionConflict) or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _put_collection(self, name: str, data: Any, runtime: Any, tiling: Sequence[int] | None, replicas: int,
                        nodes: Sequence[str] | None) -> Dataset:
        """A Dask DataFrame or Ray Dataset: sent by the workers that hold it."""
        kind = runtime.__name__.rsplit(".", 1)[-1]
        if replicas != 1:
            raise ValueError(f"replicas={replicas}: a {kind} collection is put with one replica; add more with repair")
        if tiling is not None:
            raise ValueError(f"tiling: a {kind} collection keeps its own partitions (one row block each); pass tiling=None")
        targets = self._target_nodes(nodes)

        def store(version: int) -> Commit:
            receipts, placement = runtime.put(self, name, data, targets, version)
            if not receipts:
                raise ValueError(f"{name}: the {kind} collection has no partitions")
            start, parts = 0, []
            for k, (receipt, (_holder, node)) in enumerate(zip(receipts, placement)):
                parts.append(CommitPart((k, 0), (start, 0), (receipt.rows, receipt.cols), (node["node_id"],)))
                start += receipt.rows
            return Commit(name, version, receipts[0].schema, (start, receipts[0].cols), (len(parts), 1), tuple(parts))

        return self._versioned(name, store)

    def _targets_for(self, nodes: Sequence[str] | None, replicas: int) -> list[dict]:
        targets = self._target_nodes(nodes)
        if not isinstance(replicas, int) or not 1 <= replicas <= len(targets):
            raise ValueError(f"replicas must be between 1 and the {len(targets)} usable nodes, got {replicas!r}")
        return targets

    def _put_stream(self, name: str, reader: pa.RecordBatchReader, rows_per_partition: int | None, replicas: int,
                    nodes: Sequence[str] | None, progress: Progress | None) -> Dataset:
        """Cut a stream into row blocks as it is read and send each as soon as it is complete.

        At most :data:`STREAM_PUTS_IN_FLIGHT` partitions are being sent while
        the next one fills, so memory is bounded by a few partitions whatever
        the stream's length.
        """
        if rows_per_partition is not None and (not isinstance(rows_per_partition, int) or rows_per_partition < 1):
            raise ValueError(f"rows_per_partition must be a positive integer, got {rows_per_partition!r}")
        targets = self._targets_for(nodes, replicas)
        schema = reader.schema
        ncols = frames.frame_shape(schema.empty_table())[1]
        first = random.randrange(len(targets))

        def store(version: int) -> Commit:
            parts: list[CommitPart] = []
            sending: deque = deque()
            sent = [0]
            with ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="flightpart-put") as pool:

                def send(batches: list[pa.RecordBatch], rows: int) -> None:
                    k, start = len(parts), (parts[-1].start[0] + parts[-1].shape[0] if parts else 0)
                    table = pa.Table.from_batches(batches, schema)
                    holders = [targets[(first + k + r) % len(targets)] for r in range(replicas)]
                    for node in holders:
                        sending.append(pool.submit(self._send_one, node["uri"], name, version, (k, 0), table))
                    parts.append(CommitPart((k, 0), (start, 0), (rows, ncols), tuple(n["node_id"] for n in holders)))
                    while len(sending) > STREAM_PUTS_IN_FLIGHT * replicas:
                        sending.popleft().result()
                    sent[0] += table.nbytes * replicas
                    if progress:
                        progress(sent[0], 0)

                pending: list[pa.RecordBatch] = []
                rows = 0
                limit = rows_per_partition
                for batch in reader:
                    while batch.num_rows:
                        if limit is None and batch.num_rows:  # about 64 MiB per partition, from the first batch's width
                            limit = max(1, STREAM_PARTITION_BYTES * batch.num_rows // max(batch.nbytes, 1))
                        take = min(batch.num_rows, limit - rows)
                        piece, batch = batch.slice(0, take), batch.slice(take)
                        pending.append(piece)
                        rows += piece.num_rows
                        if rows >= limit:
                            send(pending, rows)
                            pending, rows = [], 0
                if pending or not parts:
                    send(pending, rows)  # the last block (an empty stream is one empty partition)
                for future in sending:
                    future.result()
            total = parts[-1].start[0] + parts[-1].shape[0]
            return Commit(name, version, schema, (total, ncols), (len(parts), 1), tuple(parts), replicas)

        return self._versioned(name, store)

    def _send_one(self, uri: str, name: str, version: int, part: tuple[int, int], table: pa.Table) -> None:
        with translated():  # a node that stops taking data fails the put within its deadline
            send_partition(self.pool, uri, name, version, part, table, timeout=self.timeout)

    def _target_nodes(self, nodes: Sequence[str] | None) -> list[dict]:
        """Live nodes to put to (those named by ``nodes``), leaving out nodes low on disk while others have room."""
        alive = [n for n in self.nodes() if n["alive"]]
        if nodes is not None:
            wanted = set(nodes)
            alive = [n for n in alive if wanted & {n["node_id"], n["uri"], n["ip"]}]
        roomy = [n for n in alive if not n.get("low_space")]
        alive = roomy or alive
        if not alive:
            raise NodeUnavailable(
                "no live node to put to" + (f" among {list(nodes)}" if nodes is not None else "")
                + "; start one with `flightpart serve --catalog " + self.uri + "`"
            )
        return alive

    def _send(self, name: str, version: int, parts: dict, placement: dict, progress: Progress | None) -> None:
        """Every partition to its nodes: one thread per node, small partitions several to a stream."""
        by_node: dict[str, list] = {}
        for pos, holders in placement.items():
            for node in holders:
                by_node.setdefault(node["uri"], []).append(pos)
        total = sum(parts[pos].nbytes * len(h) for pos, h in placement.items())
        done = [0]
        lock = threading.Lock()

        def send_all(uri: str) -> None:
            for group in streams_of(by_node[uri], parts):
                if len(group) == 1:
                    self._send_one(uri, name, version, group[0], parts[group[0]])
                else:
                    with translated():
                        send_partitions(self.pool, uri, name, version, [(pos, parts[pos]) for pos in group],
                                        timeout=self.timeout)
                with lock:  # one thread per node adds to the same count
                    done[0] += sum(parts[pos].nbytes for pos in group)
                    sent = done[0]
                if progress:
                    progress(sent, total)

        with ThreadPoolExecutor(max_workers=len(by_node), thread_name_prefix="flightpart-put") as ex:
            for future in [ex.submit(send_all, uri) for uri in by_node]:
                future.result()

    # ------------------------------------------------------------------ SPMD publish

    def publish_begin(self, name: str, rank: int, nranks: int) -> int:
        """SPMD: the version rank ``rank`` of ``nranks`` publishes into (joined or opened)."""
        return VersionReply.from_json(self.call(PublishBegin.ACTION, PublishBegin(check_name(name), nranks, rank))).version

    def publish_part(self, part: PublishPart) -> PublishReply:
        """SPMD: one rank's part is stored; the last rank in commits the version."""
        return PublishReply.from_json(self.call(PublishPart.ACTION, part))

    # ------------------------------------------------------------------ open

    def open(self, name: str, version: int | None = None, *, rank: int | None = None, nranks: int | None = None) -> Dataset:
        """The latest committed version of ``name`` (or ``version``).

        With ``rank``/``nranks`` the SPMD view: ``locals`` lists this rank's
        partitions and the others' ``data`` is ``None``.
        """
        path = dataset_path(check_name(name), version)
        with translated():
            info = self.pool.client(self.uri).get_flight_info(flight.FlightDescriptor.for_path(*path),
                                                              options=self.pool.options(self.timeout))
        version_info = decode_flight_info(info)
        # what the dataset's get carries: a capability for this version alone when the cluster issues one
        reader = dataclasses.replace(self.access, token=version_info.capability) if version_info.capability else self.access
        ds = Dataset.from_version(version_info, FlightGet(self.host, reader, self.idle_timeout))
        if rank is not None or nranks is not None:
            ds = ds.spmd(rank, nranks)
        return ds


def _grid(value: Sequence[int] | None, nodes: int) -> tuple[int, int]:
    if value is None:
        return (nodes, 1)
    grid = tuple(value)
    if len(grid) != 2 or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in grid):
        raise ValueError(f"tiling must be (row blocks, column groups) of positive integers, got {value!r}")
    return grid  # type: ignore[return-value]
