"""The picklable ``get``: partitions on this host by memory map, others over Flight.

A :class:`PartitionRef` is a partition's ``data`` handle: small, picklable, meaningful in any process. A
:class:`FlightGet` turns handles into tables, deciding locality where it runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import FlightpartError, PartitionedError, RequestRejected
from flightpart.io import inprocess, layout
from flightpart.io.access import Access
from flightpart.io.allocator import keep_freed_memory
from flightpart.io.compression import check_mode
from flightpart.io.connections import ConnectionPool, shared_pool
from flightpart.io.hosts import host_addresses
from flightpart.io.maps import MappedFiles, mapped_bytes
from flightpart.io.pull import (
    IDLE_TIMEOUT,
    LONE_READ_BYTES,
    SMALL_READ_BYTES,
    Expected,
    ReadOptions,
    read_replicas,
    read_several,
)
from flightpart.io.transfer import TRAFFIC
from flightpart.query.apply import apply_ticket
from flightpart.query.catalog_columns import CatalogColumns
from flightpart.query.functions import AGGREGATE
from flightpart.wire import (
    MAX_PARTS_PER_CHECK,
    MAX_PARTS_PER_STREAM,
    Aggregate,
    CheckParts,
    GetNodeInfo,
    NodeInfo,
    PartPlace,
    Replica,
    Ticket,
    TopRows,
)

MAX_STREAMS = 8


TICKET_FIELDS = frozenset({"columns", "rows", "filter", "matched", "aggregate", "row_numbers", "top"})
"""What a handle asks of its partition, kept in its :class:`~flightpart.wire.Ticket` (:meth:`PartitionRef.asking`)."""


@dataclass(frozen=True)
class PartitionRef:
    """Handle of one partition: the :class:`~flightpart.wire.Ticket` a node is asked (``spec``: which partition,
    projected, sliced, filtered, aggregated or topped), the replicas that hold it, and what the catalog says of it
    (``expected_rows``, ``stored_bytes``; ``shareable_bytes``: a whole partition of no dictionary column, which may
    share a read stream). A new ticket field is read here through ``spec``, with no change to this class."""

    spec: Ticket
    replicas: tuple[Replica, ...]
    shareable_bytes: int = 0
    expected_rows: int | None = None  # the rows the catalog says its partition holds in its range (None: unknown)
    stored_bytes: int = 0  # its partition's stored size, when no column may take more bytes sent (0: not known)

    def __reduce__(self):  # plain values: nothing but data when unpickled
        return (PartitionRef, (self.spec, self.replicas, self.shareable_bytes, self.expected_rows, self.stored_bytes))

    def __dask_tokenize__(self) -> tuple:
        """Plain values for Dask's token (cheap at tens of thousands of handles)."""
        return ("flightpart.PartitionRef", self.spec.encode(), self.replicas, self.expected_rows)

    def asking(self, **changes: Any) -> PartitionRef:
        """This handle with ticket fields (:data:`TICKET_FIELDS`) and its own fields changed."""
        asked = {k: v for k, v in changes.items() if k in TICKET_FIELDS}
        if "row_numbers" in asked:
            asked["row_numbers"] = True if asked["row_numbers"] else None
        own = {k: v for k, v in changes.items() if k not in TICKET_FIELDS}
        return replace(self, spec=replace(self.spec, **asked), **own) if asked else replace(self, **own)

    @property
    def dataset(self) -> str:
        return self.spec.dataset

    @property
    def version(self) -> int:
        return self.spec.version

    @property
    def position(self) -> tuple[int, int]:
        return self.spec.part

    @property
    def columns(self) -> tuple[str, ...] | None:
        return self.spec.columns

    @property
    def rows(self) -> tuple[int, int] | None:
        return self.spec.rows

    @property
    def filter(self) -> bytes | None:
        """Substrait (:mod:`flightpart.query.filters`): the node sends only the rows it keeps."""
        return self.spec.filter

    @property
    def matched(self) -> tuple[int, int] | None:
        return self.spec.matched

    @property
    def aggregate(self) -> Aggregate | None:
        """A partial aggregate instead of rows (:mod:`flightpart.query.aggregates`)."""
        return self.spec.aggregate

    @property
    def row_numbers(self) -> bool:
        """Each row comes with its position in the partition (:data:`flightpart.wire.ROW_NUMBER`)."""
        return bool(self.spec.row_numbers)

    @property
    def top(self) -> TopRows | None:
        """Only the partition's first rows by sort keys (:mod:`flightpart.query.top`)."""
        return self.spec.top

    @property
    def known_rows(self) -> int | None:
        """The rows a node sends for this handle when the catalog knows them: :attr:`expected_rows`, unless a filter, an
        aggregate or a top was set on it since."""
        if self.filter is not None or self.aggregate is not None or self.top is not None:
            return None
        return self.expected_rows

    @property
    def most_rows(self) -> int | None:
        """The most rows a node may send for this handle, when known: a filter or a top keeps at most the range's rows;
        an aggregate sends at most one row per distinct key, one without keys."""
        if self.aggregate is not None and self.expected_rows is not None:
            return max(self.expected_rows, 1) if self.aggregate.by else 1
        return self.expected_rows

    @property
    def most_bytes(self) -> int:
        """The most bytes of values a node may send for this handle (0: not bounded), bounding a faulty stream as
        :attr:`most_rows` bounds its rows (decision 0004). A filter, row range or top keeps some of the stored values;
        an aggregate some of its keys' values, plus per group its functions' ``group_bytes`` and the values of those
        that copy values. A computed column leaves it unbounded."""
        if self.stored_bytes <= 0:
            return 0
        if self.aggregate is None:
            return self.stored_bytes
        if self.aggregate.computed:
            return 0
        entries = [AGGREGATE[function] for _column, function in self.aggregate.functions]
        values = sum(1 for entry in entries if entry.copies_values)
        return self.stored_bytes * (1 + values) + sum(entry.group_bytes for entry in entries) * (self.most_rows or 0)

    def ticket(self) -> flight.Ticket:
        return flight.Ticket(self.spec.encode())

    def apply(self, table: pa.Table) -> pa.Table:
        """What this handle asks of its partition, done here (on a local map)."""
        return apply_ticket(table, self.columns, self.rows, self.filter, self.matched, self.aggregate, self.row_numbers,
                            self.top)


SPLIT_BYTES = 32 << 20
"""A remote partition is split into parallel row-range streams of at least this size (when asked for)."""


def split_rows(ref: PartitionRef, rows: tuple[int, int], pieces: int) -> list[PartitionRef]:
    """``ref`` (covering ``rows``) as up to ``pieces`` handles of consecutive row ranges, each naming the replicas in
    another order so different nodes serve them."""
    count = rows[1] - rows[0]
    pieces = max(1, min(pieces, count))
    if pieces == 1:
        return [ref]
    cuts = [rows[0] + count * k // pieces for k in range(pieces + 1)]
    n = len(ref.replicas)
    return [ref.asking(rows=(cuts[k], cuts[k + 1]), replicas=ref.replicas[k % n:] + ref.replicas[:k % n],
                       expected_rows=None if ref.expected_rows is None else cuts[k + 1] - cuts[k])
            for k in range(pieces)]


def check_streams(count: int) -> int:
    """``streams_per_partition`` as given, or ValueError naming the range."""
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_STREAMS:
        raise ValueError(f"streams_per_partition: expected 1 to {MAX_STREAMS}, got {count!r}")
    return count


class FlightGet:
    """``get`` of a flightpart ``__partitioned__``: one handle or a sequence of them. It carries the client's
    :class:`~flightpart.io.access.Access`, which pickles without the private key."""

    def __init__(self, host: str | None = None, access: Access | None = None, idle_timeout: float = IDLE_TIMEOUT,
                 compression: str = "auto", streams_per_partition: int = 1, columns: CatalogColumns | None = None):
        self.host = host
        self.access = access or Access()
        self.idle_timeout = idle_timeout
        self.compression = check_mode(compression)
        self.streams_per_partition = check_streams(streams_per_partition)
        # what nodes send is checked against the catalog's columns, here and in the Dask and Ray tasks it is
        # pickled into (the columns travel as the schema's IPC bytes, restored once per process)
        self.expected_columns = columns

    def __reduce__(self):
        return (FlightGet, (self.host, self.access, self.idle_timeout, self.compression, self.streams_per_partition,
                            self.expected_columns))

    def _key(self) -> tuple:
        return (self.host, self.access, self.compression, self.streams_per_partition)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FlightGet) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash((FlightGet, *self._key()))

    def __repr__(self) -> str:
        return f"FlightGet(host={self.host!r})"

    def pool(self) -> ConnectionPool:
        return shared_pool(self.access)

    def __call__(self, handles: Any) -> Any:
        single = not isinstance(handles, (list, tuple))
        refs = [handles] if single else list(handles)
        for k, ref in enumerate(refs):
            if not isinstance(ref, PartitionRef):
                raise PartitionedError(f"get: handle {k} is a {type(ref).__qualname__}, expected a "
                                       "flightpart PartitionRef")
        tables = read_partitions(refs, host=self.host, pool=self.pool(), idle_timeout=self.idle_timeout,
                                 compression=self.compression, expected_columns=self.expected_columns)
        return tables[0] if single else tables


def read_partitions(refs: Sequence[PartitionRef], *, host: str | None, pool: ConnectionPool,
                    idle_timeout: float = IDLE_TIMEOUT, compression: str = "auto",
                    expected_columns: CatalogColumns | None = None) -> list[pa.Table]:
    """Tables of ``refs`` in order: local ones mapped, remote ones streamed in parallel (small ones several to a
    stream, :func:`shared_streams`).

    Remote streams start first, so nodes send while this process maps the local ones; a local partition that
    cannot be read here is streamed after. The first read of rows decides the allocator tuning
    (:func:`~flightpart.io.allocator.keep_freed_memory`). What arrives must have ``expected_columns``
    (:mod:`flightpart.query.catalog_columns`).
    """
    if any(ref.aggregate is None and ref.top is None for ref in refs):
        keep_freed_memory()
    local = host_addresses(host)
    tables: list[pa.Table | None] = [None] * len(refs)
    nearby = [k for k, ref in enumerate(refs) if _may_be_local(ref, local)]
    skip = set(nearby)
    far = shared_streams([(k, ref) for k, ref in enumerate(refs) if k not in skip])

    def fetch(group: list[int], quick_bytes: int = SMALL_READ_BYTES) -> list[pa.Table]:
        if len(group) == 1:
            return [read_remote(refs[group[0]], pool, idle_timeout, compression=compression, here=local,
                                expected_columns=expected_columns, quick_bytes=quick_bytes)]
        first = refs[group[0]]
        ticket = replace(first.spec, more=tuple(refs[k].position for k in group[1:]))
        what = f"{len(group)} partitions of {first.dataset!r} v{first.version} from {first.position} on"
        try:
            expected = _several_expected([refs[k] for k in group], expected_columns)
            how = ReadOptions(idle_timeout, compression, local)
            got = read_several(pool, ticket, first.replicas, what, expected, how)
            if all(refs[k].known_rows in (None, table.num_rows) for k, table in zip(group, got)):
                return got
        except RequestRejected:  # a node that cannot share a stream for them: one stream each, as before
            pass
        # or a node that sent other rows than the catalog's: each read alone, checked, from the next replica on
        return [read_remote(refs[k], pool, idle_timeout, compression=compression, here=local,
                            expected_columns=expected_columns) for k in group]

    def place(group: list[int], got: list[pa.Table]) -> None:
        for k, table in zip(group, got):
            tables[k] = table

    if not nearby and len(far) == 1:  # one stream: read in this thread, which outlives it (quick up to LONE_READ_BYTES)
        place(far[0], fetch(far[0], LONE_READ_BYTES))
        return tables  # type: ignore[return-value]
    with ThreadPoolExecutor(max_workers=MAX_STREAMS, thread_name_prefix="flightpart-get") as ex:
        started = [(group, ex.submit(fetch, group)) for group in far]
        if len(nearby) > 1:
            vouch_local([refs[k] for k in nearby], local, pool)
        for k in nearby:
            tables[k] = read_local(refs[k], local, pool, expected_columns)
        missed = shared_streams([(k, refs[k]) for k in nearby if tables[k] is None])
        started += [(group, ex.submit(fetch, group)) for group in missed]
        for group, future in started:
            place(group, future.result())
    return tables  # type: ignore[return-value]


def _several_expected(refs: Sequence[PartitionRef], columns: CatalogColumns | None) -> Expected:
    """What one stream of ``refs`` may hold: the sum of what each may."""
    most = [ref.known_rows if ref.known_rows is not None else ref.most_rows for ref in refs]
    whole = all(ref.known_rows is not None for ref in refs)
    bounds = [ref.most_bytes for ref in refs]
    return Expected(most_rows=None if None in most else sum(most),  # type: ignore[arg-type]
                    bytes=sum(ref.shareable_bytes for ref in refs) if whole else 0,
                    most_bytes=0 if whole or 0 in bounds else sum(bounds), columns=columns)


def _may_be_local(ref: PartitionRef, local: frozenset[str]) -> bool:
    """Whether a replica of ``ref`` may be read without the network."""
    return any(ip in local or inprocess.opener(uri) is not None for uri, ip, _pid in ref.replicas)


SMALL_BYTES = 1 << 20
"""A partition at most this large is read together with others of the same holders (a stream costs a round trip)."""
SHARED_STREAM_BYTES = 32 << 20
"""At most about this many bytes of small partitions share one read stream."""
ANSWERS_PER_STREAM = 16
"""At most this many partitions' aggregates or first rows share one read stream: a node works through a stream's
partitions one after another, so a node of many partitions is asked in several streams at once."""


def shared_streams(indexed: Sequence[tuple[int, PartitionRef]]) -> list[list[int]]:
    """The reads to make, each a list of indexes into ``indexed``'s handles, of the same version, group, selection and
    replicas: small whole partitions (:data:`SMALL_BYTES`) share a read up to
    :data:`~flightpart.wire.MAX_PARTS_PER_STREAM` and :data:`SHARED_STREAM_BYTES`; aggregates, and first rows of
    partitions sent as stored (``stored_bytes``: no dictionary column), whatever their partitions' size, up to
    :data:`ANSWERS_PER_STREAM` (their answers are small); every other handle is a read of its own."""
    reads: list[list[int]] = []
    open_groups: dict[tuple, tuple[list[int], list[int]]] = {}  # key -> (indexes, [bytes])
    for k, ref in indexed:
        answers = ref.aggregate is not None or (ref.top is not None and ref.stored_bytes > 0)
        size = 0 if answers else ref.shareable_bytes
        most = ANSWERS_PER_STREAM if answers else MAX_PARTS_PER_STREAM
        if ref.rows is not None or ref.matched is not None or ref.row_numbers or not answers and (
                not 0 < size <= SMALL_BYTES or ref.filter is not None or ref.top is not None):
            reads.append([k])
            continue
        key = (ref.dataset, ref.version, ref.position[1], ref.columns, ref.filter, ref.aggregate, ref.top,
               ref.replicas)
        group = open_groups.get(key)
        if group is None or len(group[0]) >= most or group[1][0] + size > SHARED_STREAM_BYTES:
            group = open_groups[key] = ([], [0])
            reads.append(group[0])
        group[0].append(k)
        group[1][0] += size
    return reads


_node_info: dict[tuple[str, int], NodeInfo] = {}


def node_info(uri: str, pool: ConnectionPool) -> NodeInfo:
    """A node's ``node-info`` (id, data directory), asked once per pool."""
    key = (uri, id(pool))
    info = _node_info.get(key)
    if info is None:
        info = _node_info[key] = pool.action(uri, GetNodeInfo(), timeout=5)
    return info


def read_local(ref: PartitionRef, local: frozenset[str], pool: ConnectionPool,
               expected_columns: CatalogColumns | None = None) -> pa.Table | None:
    """The partition without network transfer, or None if no replica here holds what the catalog registered."""
    for uri, ip, _pid in ref.replicas:
        opener = inprocess.opener(uri)
        if opener is not None:
            try:
                whole = opener(ref.dataset, ref.version, ref.position)
                table = ref.apply(whole)
                if not _as_registered(ref, table, expected_columns):
                    continue
                TRAFFIC.add(bytes_mapped=mapped_bytes(whole, table))
                return table
            except FlightpartError:
                continue
        if ip not in local:
            continue
        try:
            path = _local_path(uri, ref, pool)
            if path is None:
                continue  # the directory is not that node's (another host with the same path)
            _vouch(uri, path, PartPlace(ref.dataset, ref.version, ref.position), pool)
            whole = _mapped(path)
            table = ref.apply(whole)
            if not _as_registered(ref, table, expected_columns):
                # a file with other rows or columns than its node registered: stream it, checked, from a replica
                continue
            TRAFFIC.add(bytes_mapped=mapped_bytes(whole, table))
            return table
        except (OSError, ValueError, KeyError, pa.ArrowException, FlightpartError):
            continue  # not readable here after all: stream it instead
    return None


def _as_registered(ref: PartitionRef, table: pa.Table, expected_columns: CatalogColumns | None = None) -> bool:
    """Whether a partition read here has the rows and columns the catalog registered (a local node is not taken at
    its word)."""
    return (ref.known_rows is None or table.num_rows == ref.known_rows) and \
        (ref.most_rows is None or table.num_rows <= ref.most_rows) and \
        (expected_columns is None or expected_columns.mislabelled(table.schema, ref.spec) is None)


def _local_path(uri: str, ref: PartitionRef, pool: ConnectionPool) -> Path | None:
    """Where the node at ``uri`` keeps ``ref``'s file, or None when its data directory is not here."""
    info = node_info(uri, pool)
    if info.data_dir is None or not _is_that_nodes_dir(Path(info.data_dir), info.node_id):
        return None
    return Path(info.data_dir) / layout.partition_relpath(ref.dataset, ref.version, ref.position)


def vouch_local(refs: Sequence[PartitionRef], local: frozenset[str], pool: ConnectionPool) -> int:
    """Have the nodes on this host vouch for the files of ``refs``, many per call (``check-parts``), before
    :func:`read_local` maps them; returns the calls made. A file that failed is left unvouched, so its own check
    then fails and the read moves to the next replica."""
    wanted: dict[tuple[str, str, int], list[tuple[tuple[int, int], Path, tuple[int, int, int]]]] = {}
    for ref in refs:
        for uri, ip, _pid in ref.replicas:
            if ip not in local or inprocess.opener(uri) is not None:
                continue
            try:
                path = _local_path(uri, ref, pool)
                if path is None:
                    continue
                st = os.stat(path)
            except (OSError, FlightpartError):
                continue
            identity = (st.st_ino, st.st_mtime_ns, st.st_size)
            if _vouched.get(path) != identity:
                wanted.setdefault((uri, ref.dataset, ref.version), []).append((ref.position, path, identity))
            break
    calls = 0
    for (uri, dataset, version), items in wanted.items():
        if len(items) < 2:
            continue  # one file: its own check, as before
        for first in range(0, len(items), MAX_PARTS_PER_CHECK):
            page = items[first:first + MAX_PARTS_PER_CHECK]
            try:
                reply = pool.action(uri, CheckParts(dataset, version, tuple(part for part, _path, _id in page)),
                                    timeout=60 + len(page) / 1000)
            except FlightpartError:
                break  # a node that cannot (or does not know how to) answer: each file is checked on its own
            calls += 1
            failed = set(reply.failed)
            for part, path, identity in page:
                if part not in failed:
                    _remember_vouched(path, identity)
    return calls


MAPS = MappedFiles()
"""This process's maps of local partitions: bounded, and let go when their files are dropped."""
_markers: dict[Path, tuple[tuple[int, int], str | None]] = {}


_vouched: dict[Path, tuple[int, int, int]] = {}
VOUCHED_KEPT = 100_000


def _vouch(uri: str, path: Path, place: PartPlace, pool: ConnectionPool) -> None:
    """Have the node vouch for a file's checksum before this process maps it, once per (inode, mtime, size). A damaged
    file is never mapped (PARTITION_DAMAGED moves to the next replica); rot after that is the node's scrub's to find."""
    st = os.stat(path)
    identity = (st.st_ino, st.st_mtime_ns, st.st_size)
    if _vouched.get(path) == identity:
        return
    pool.action(uri, place, timeout=60)
    _remember_vouched(path, identity)


def _remember_vouched(path: Path, identity: tuple[int, int, int]) -> None:
    if len(_vouched) >= VOUCHED_KEPT:
        _vouched.clear()  # bounded: past this many files, they are asked for again
    _vouched[path] = identity


def _mapped(path: Path) -> pa.Table:
    MAPS.prune()
    return MAPS.get(path)


def _is_that_nodes_dir(root: Path, node_id: str) -> bool:
    st = os.stat(root / layout.NODE_MARKER)
    key = (st.st_ino, st.st_mtime_ns)
    cached = _markers.get(root)
    if cached is None or cached[0] != key:
        cached = _markers[root] = (key, layout.read_node_id(root))
    return cached[1] == node_id


def read_remote(ref: PartitionRef, pool: ConnectionPool, idle_timeout: float = IDLE_TIMEOUT, *,
                compression: str = "auto", here: frozenset[str] | None = None,
                expected_columns: CatalogColumns | None = None, quick_bytes: int = SMALL_READ_BYTES) -> pa.Table:
    """Stream the partition from the first replica that answers (:func:`flightpart.io.pull.read_replicas`;
    ``quick_bytes``: see there)."""
    return read_replicas(pool, ref.spec, ref.replicas, f"partition {ref.position} of {ref.dataset!r} v{ref.version}",
                         Expected(ref.known_rows, ref.most_rows, ref.shareable_bytes, ref.most_bytes, expected_columns),
                         ReadOptions(idle_timeout, compression, host_addresses() if here is None else here,
                                     quick_bytes=quick_bytes))
