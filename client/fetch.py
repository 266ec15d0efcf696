"""The picklable ``get``: partitions on this host by memory map, others over Flight.

A :class:`PartitionRef` is the ``data`` handle of a flightpart partition,
like a Ray ObjectRef: small, picklable, meaningful in any process. A
:class:`FlightGet` turns handles into tables. Locality is decided where
``get`` runs, so a pickled ``__partitioned__`` sent to another process or
host reads locally there.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import FlightpartError, NodeUnavailable, PartitionedError
from flightpart.io import inprocess, layout
from flightpart.io.access import Access
from flightpart.io.connections import ConnectionPool, shared_pool
from flightpart.io.hosts import host_addresses
from flightpart.io.transfer import open_mapped, project
from flightpart.wire import Replica, Ticket, error_message

from .errors import translate

MAX_STREAMS = 8


@dataclass(frozen=True)
class PartitionRef:
    """Handle of one partition (optionally projected and row-sliced)."""

    dataset: str
    version: int
    position: tuple[int, int]
    replicas: tuple[Replica, ...]
    columns: tuple[str, ...] | None = None
    rows: tuple[int, int] | None = None

    def __reduce__(self):  # a plain tuple: compact, and nothing but data when unpickled
        return (PartitionRef, (self.dataset, self.version, self.position, self.replicas, self.columns, self.rows))

    def ticket(self) -> flight.Ticket:
        return flight.Ticket(Ticket(self.dataset, self.version, self.position, self.columns, self.rows).encode())


class FlightGet:
    """``get`` of a flightpart ``__partitioned__``: one handle or a sequence of them.

    It carries the client's :class:`~flightpart.io.access.Access`, whose
    pickled form holds what a reader needs and no private key.
    """

    def __init__(self, host: str | None = None, access: Access | None = None):
        self.host = host
        self.access = access or Access()

    def __reduce__(self):
        return (FlightGet, (self.host, self.access))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FlightGet) and (self.host, self.access) == (other.host, other.access)

    def __hash__(self) -> int:
        return hash((FlightGet, self.host, self.access))

    def __repr__(self) -> str:
        return f"FlightGet(host={self.host!r})"

    def pool(self) -> ConnectionPool:
        return shared_pool(self.access)

    def __call__(self, handles: Any) -> Any:
        single = not isinstance(handles, (list, tuple))
        refs = [handles] if single else list(handles)
        for k, ref in enumerate(refs):
            if not isinstance(ref, PartitionRef):
                raise PartitionedError(f"get: handle {k} is a {type(ref).__qualname__}, expected a flightpart PartitionRef")
        tables = read_partitions(refs, host=self.host, pool=self.pool())
        return tables[0] if single else tables


def read_partitions(refs: Sequence[PartitionRef], *, host: str | None, pool: ConnectionPool) -> list[pa.Table]:
    """Tables of ``refs`` in order: local ones mapped, remote ones streamed in parallel."""
    local = host_addresses(host)
    tables: list[pa.Table | None] = [read_local(ref, local, pool) for ref in refs]
    remote = [k for k, t in enumerate(tables) if t is None]
    if len(remote) == 1:
        tables[remote[0]] = read_remote(refs[remote[0]], pool)
    elif remote:
        with ThreadPoolExecutor(max_workers=min(MAX_STREAMS, len(remote)), thread_name_prefix="flightpart-get") as ex:
            for k, table in zip(remote, ex.map(lambda k: read_remote(refs[k], pool), remote)):
                tables[k] = table
    return tables  # type: ignore[return-value]


_node_info: dict[tuple[str, int], dict] = {}


def node_info(uri: str, pool: ConnectionPool) -> dict:
    """A node's ``node-info`` (id, data directory), asked once per pool."""
    key = (uri, id(pool))
    info = _node_info.get(key)
    if info is None:
        info = _node_info[key] = pool.action(uri, "node-info", timeout=5)
    return info


def read_local(ref: PartitionRef, local: frozenset[str], pool: ConnectionPool) -> pa.Table | None:
    """The partition without any network transfer, or None if no replica is on this host."""
    for uri, ip, _pid in ref.replicas:
        opener = inprocess.opener(uri)
        if opener is not None:
            try:
                return project(opener(ref.dataset, ref.version, ref.position), ref.columns, ref.rows)
            except FlightpartError:
                continue
        if ip not in local:
            continue
        try:
            info = node_info(uri, pool)
            root = Path(info["data_dir"])
            if not _is_that_nodes_dir(root, info["node_id"]):
                continue  # the directory is not that node's (another host with the same path)
            table = _mapped(root / layout.partition_relpath(ref.dataset, ref.version, ref.position))
            return project(table, ref.columns, ref.rows)
        except (OSError, ValueError, KeyError, pa.ArrowException, FlightpartError):
            continue  # not readable here after all: stream it instead
    return None


MAX_MAPPED = 256
_maps: "OrderedDict[Path, tuple[tuple[int, int, int], pa.Table]]" = OrderedDict()
_maps_lock = threading.Lock()
_markers: dict[Path, tuple[tuple[int, int], str | None]] = {}


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _mapped(path: Path) -> pa.Table:
    """The memory-mapped table of a partition file, reused while the file is the same.

    A ``stat`` per call checks that the file still exists and is the same
    file: a dropped partition fails here instead of being served from a
    stale map, and its map is let go so the node's disk space is freed. At
    most :data:`MAX_MAPPED` maps are kept, the least recently used dropped first.
    """
    try:
        identity = _identity(os.stat(path))
    except FileNotFoundError:
        with _maps_lock:
            _maps.pop(path, None)
        raise
    with _maps_lock:
        cached = _maps.get(path)
        if cached is not None and cached[0] == identity:
            _maps.move_to_end(path)
            return cached[1]
    table = open_mapped(path)
    with _maps_lock:
        _maps[path] = (identity, table)
        while len(_maps) > MAX_MAPPED:
            _maps.popitem(last=False)
    return table


def _is_that_nodes_dir(root: Path, node_id: str) -> bool:
    st = os.stat(root / layout.NODE_MARKER)
    key = (st.st_ino, st.st_mtime_ns)
    cached = _markers.get(root)
    if cached is None or cached[0] != key:
        cached = _markers[root] = (key, layout.read_node_id(root))
    return cached[1] == node_id


def read_remote(ref: PartitionRef, pool: ConnectionPool) -> pa.Table:
    """Stream the partition from the first replica that answers.

    A replica that is unreachable, busy or does not hold the partition
    (codes whose error class is ``retryable``) hands over to the next; any
    other refusal is raised at once.
    """
    failures = []
    for uri, _ip, _pid in ref.replicas:
        try:
            return pool.client(uri).do_get(ref.ticket(), options=pool.options(None)).read_all()
        except (pa.ArrowException, ConnectionError, OSError) as exc:
            error = translate(exc)
            if not error.retryable:
                raise error from exc
            if isinstance(error, NodeUnavailable):
                pool.discard(uri)
            failures.append(f"{uri}: {error_message(exc)}")
    raise NodeUnavailable(
        f"partition {ref.position} of {ref.dataset!r} v{ref.version}: no replica could serve it "
        f"({'; '.join(failures) or 'no replicas are known'})"
    )
