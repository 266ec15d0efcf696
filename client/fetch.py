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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import inprocess
from flightpart.connections import ConnectionPool, shared_pool
from flightpart.errors import NodeUnavailable, PartitionedError
from flightpart.hosts import host_addresses
from flightpart.transfer import open_mapped, project, read_node_id
from flightpart.wire import NODE_MARKER, Ticket, partition_relpath

from .errors import server_message, translate

MAX_STREAMS = 8
Replica = tuple[str, str, int]  # (node URI, node IP, node PID)


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
    """``get`` of a flightpart ``__partitioned__``: one handle or a sequence of them."""

    def __init__(self, host: str | None = None, token: str | None = None, tls_root_certs: bytes | None = None):
        self.host = host
        self.token = token
        self.tls_root_certs = tls_root_certs

    def __reduce__(self):
        return (FlightGet, (self.host, self.token, self.tls_root_certs))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FlightGet) and self.__reduce__()[1] == other.__reduce__()[1]

    def __hash__(self) -> int:
        return hash((FlightGet, self.host, self.token, self.tls_root_certs))

    def pool(self) -> ConnectionPool:
        return shared_pool(self.token, self.tls_root_certs)

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


_node_info: dict[tuple[str, str | None], dict] = {}


def node_info(uri: str, pool: ConnectionPool) -> dict:
    key = (uri, pool.token, id(pool))
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
            except KeyError:
                continue
        if ip not in local:
            continue
        try:
            info = node_info(uri, pool)
            root = Path(info["data_dir"])
            if not _is_that_nodes_dir(root, info["node_id"]):
                continue  # the directory is not that node's (another host with the same path)
            table = _mapped(root / partition_relpath(ref.dataset, ref.version, ref.position))
            return project(table, ref.columns, ref.rows)
        except (OSError, ValueError, KeyError, pa.ArrowException):
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
    st = os.stat(root / NODE_MARKER)
    key = (st.st_ino, st.st_mtime_ns)
    cached = _markers.get(root)
    if cached is None or cached[0] != key:
        cached = _markers[root] = (key, read_node_id(root))
    return cached[1] == node_id


RETRYABLE = (flight.FlightUnavailableError, flight.FlightTimedOutError, flight.FlightInternalError,
             flight.FlightServerError, pa.ArrowKeyError, ConnectionError, OSError)


def read_remote(ref: PartitionRef, pool: ConnectionPool) -> pa.Table:
    """Stream the partition from the first replica that answers."""
    failures = []
    for uri, _ip, _pid in ref.replicas:
        try:
            return pool.client(uri).do_get(ref.ticket(), options=pool.options(None)).read_all()
        except (flight.FlightUnauthenticatedError, flight.FlightUnauthorizedError):
            raise
        except pa.ArrowInvalid as exc:
            raise translate(exc) from exc
        except RETRYABLE as exc:
            if isinstance(exc, (flight.FlightUnavailableError, ConnectionError)):
                pool.discard(uri)
            failures.append(f"{uri}: {server_message(exc)}")
    raise NodeUnavailable(
        f"partition {ref.position} of {ref.dataset!r} v{ref.version}: no replica could serve it "
        f"({'; '.join(failures) or 'no replicas are known'})"
    )

