"""The picklable ``get``: partitions on this host by memory map, others over Flight.

A :class:`PartitionRef` is the ``data`` handle of a flightpart partition,
like a Ray ObjectRef: small, picklable, meaningful in any process. A
:class:`FlightGet` turns handles into tables. Locality is decided where
``get`` runs, so a pickled ``__partitioned__`` sent to another process or
host reads locally there.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import FlightpartError, NodeUnavailable, PartitionedError, ServerBusy
from flightpart.io import inprocess, layout
from flightpart.io.access import Access
from flightpart.io.connections import ConnectionPool, shared_pool
from flightpart.io.errors import translate
from flightpart.io.hosts import host_addresses
from flightpart.io.maps import MappedFiles
from flightpart.io.transfer import chunks, project
from flightpart.wire import Aggregate, Replica, Ticket, error_message

MAX_STREAMS = 8
IDLE_TIMEOUT = 2.0
"""Seconds a stream may send nothing before the next replica is asked."""
BUSY_PATIENCE = 30.0
"""Seconds to keep retrying when every replica answers busy."""
STREAM_DEADLINE = 3600.0
"""Deadline of one read stream: what ends a call stuck on a frozen server."""


@dataclass(frozen=True)
class PartitionRef:
    """Handle of one partition (optionally projected and row-sliced)."""

    dataset: str
    version: int
    position: tuple[int, int]
    replicas: tuple[Replica, ...]
    columns: tuple[str, ...] | None = None
    rows: tuple[int, int] | None = None
    filter: bytes | None = None  # Substrait (flightpart.filters): the node sends only the rows it keeps
    matched: tuple[int, int] | None = None
    aggregate: Aggregate | None = None  # a partial aggregate instead of rows (flightpart.aggregates)

    def __reduce__(self):  # a plain tuple: compact, and nothing but data when unpickled
        return (PartitionRef, (self.dataset, self.version, self.position, self.replicas, self.columns, self.rows,
                               self.filter, self.matched, self.aggregate))

    def __dask_tokenize__(self) -> tuple:
        """Plain values for Dask's token: walking the dataclass field by field costs seconds at 50,000 handles."""
        return ("flightpart.PartitionRef", self.dataset, self.version, self.position, self.replicas, self.columns, self.rows,
                self.filter, self.matched, self.aggregate.encode() if self.aggregate is not None else None)

    def ticket(self) -> flight.Ticket:
        return flight.Ticket(Ticket(self.dataset, self.version, self.position, self.columns, self.rows, self.filter,
                                    self.matched, self.aggregate).encode())

    def apply(self, table: pa.Table) -> pa.Table:
        """What this handle asks of its partition, done here (on a local map)."""
        return project(table, self.columns, self.rows, self.filter, self.matched, self.aggregate)


class FlightGet:
    """``get`` of a flightpart ``__partitioned__``: one handle or a sequence of them.

    It carries the client's :class:`~flightpart.io.access.Access`, whose
    pickled form holds what a reader needs and no private key.
    """

    def __init__(self, host: str | None = None, access: Access | None = None, idle_timeout: float = IDLE_TIMEOUT):
        self.host = host
        self.access = access or Access()
        self.idle_timeout = idle_timeout

    def __reduce__(self):
        return (FlightGet, (self.host, self.access, self.idle_timeout))

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
        tables = read_partitions(refs, host=self.host, pool=self.pool(), idle_timeout=self.idle_timeout)
        return tables[0] if single else tables


def read_partitions(refs: Sequence[PartitionRef], *, host: str | None, pool: ConnectionPool,
                    idle_timeout: float = IDLE_TIMEOUT) -> list[pa.Table]:
    """Tables of ``refs`` in order: local ones mapped, remote ones streamed in parallel."""
    local = host_addresses(host)
    tables: list[pa.Table | None] = [read_local(ref, local, pool) for ref in refs]
    remote = [k for k, t in enumerate(tables) if t is None]
    if len(remote) == 1:
        tables[remote[0]] = read_remote(refs[remote[0]], pool, idle_timeout)
    elif remote:
        with ThreadPoolExecutor(max_workers=min(MAX_STREAMS, len(remote)), thread_name_prefix="flightpart-get") as ex:
            for k, table in zip(remote, ex.map(lambda k: read_remote(refs[k], pool, idle_timeout), remote)):
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
                return ref.apply(opener(ref.dataset, ref.version, ref.position))
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
            return ref.apply(table)
        except (OSError, ValueError, KeyError, pa.ArrowException, FlightpartError):
            continue  # not readable here after all: stream it instead
    return None


MAPS = MappedFiles()
"""This process's maps of local partitions: bounded, and let go when their files are dropped."""
_markers: dict[Path, tuple[tuple[int, int], str | None]] = {}


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


class Stalled(Exception):
    """A stream that sent nothing for the idle timeout."""


def read_remote(ref: PartitionRef, pool: ConnectionPool, idle_timeout: float = IDLE_TIMEOUT) -> pa.Table:
    """Stream the partition from the first replica that answers.

    A replica that is unreachable, stalls (no batch for ``idle_timeout``
    seconds), does not hold the partition or fails hands over to the next;
    when replicas are only busy, the round is tried again after a jittered
    backoff, for up to :data:`BUSY_PATIENCE` seconds. Any other refusal is
    raised at once.
    """
    failures: list[str] = []
    give_up = time.monotonic() + BUSY_PATIENCE
    delay = 0.05
    while True:
        busy = False
        for uri, _ip, _pid in ref.replicas:
            try:
                return stream(pool, uri, ref.ticket(), idle_timeout)
            except Stalled:
                pool.discard(uri)
                failures.append(f"{uri}: sent nothing for {idle_timeout:g} s")
            except (pa.ArrowException, ConnectionError, OSError) as exc:
                error = translate(exc)
                if not error.retryable:
                    raise error from exc
                if isinstance(error, ServerBusy):
                    busy = True
                elif isinstance(error, NodeUnavailable):
                    pool.discard(uri)
                failures.append(f"{uri}: {error_message(exc)}")
        if not busy or time.monotonic() + delay > give_up:
            break
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 1.0)
    raise NodeUnavailable(
        f"partition {ref.position} of {ref.dataset!r} v{ref.version}: no replica could serve it "
        f"({'; '.join(failures[-len(ref.replicas):]) or 'no replicas are known'})"
    )


def stream(pool: ConnectionPool, uri: str, ticket: flight.Ticket, idle_timeout: float) -> pa.Table:
    """One ``do_get``, read in a worker thread and cancelled when it sends nothing for ``idle_timeout`` seconds.

    A frozen server blocks a gRPC read without end; the worker holds the
    call and this thread watches it, so the caller moves on in bounded time.
    (A worker stuck before the first message ends at the call's deadline.)
    """
    progress = {"last": time.monotonic(), "reader": None, "abandoned": False}
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            reader = pool.client(uri).do_get(ticket, options=pool.options(STREAM_DEADLINE))
            progress["reader"] = reader
            if progress["abandoned"]:
                reader.cancel()
                return
            progress["last"] = time.monotonic()
            batches = []
            for chunk in chunks(reader):
                if chunk.data is not None:
                    batches.append(chunk.data)
                progress["last"] = time.monotonic()
            outcome["table"] = pa.Table.from_batches(batches, reader.schema)
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="flightpart-stream", daemon=True).start()
    tick = min(0.25, idle_timeout / 4)
    while not done.wait(tick):
        if time.monotonic() - progress["last"] > idle_timeout:
            progress["abandoned"] = True
            if progress["reader"] is not None:
                progress["reader"].cancel()
            raise Stalled(uri)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["table"]
