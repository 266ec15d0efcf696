"""A node's Flight server: stores partitions, serves them, reports to its catalog.

Each method does one thing and hands Arrow objects to Arrow: ``do_get``
returns a ``RecordBatchStream`` over a memory-mapped table (projection and
row ranges are zero-copy slices), so no Python runs per batch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import RequestRejected, SchemaMismatch
from flightpart.io import inprocess
from flightpart.io.access import Access
from flightpart.io.connections import ConnectionPool
from flightpart.io.hosts import advertised_ip
from flightpart.io.layout import default_data_dir
from flightpart.io.transfer import BATCH_BYTES, project, send_partition, split_batch
from flightpart.version import __version__
from flightpart.wire import (
    CopyTo,
    Drop,
    Empty,
    Heartbeat,
    HeartbeatReply,
    Held,
    HeldReply,
    PutTrailer,
    RegisterNode,
    RegisterReply,
    Ticket,
    parse_partition_path,
)

from .base import Action, ServiceBase, boundary
from .store import PartitionStore

log = logging.getLogger("flightpart.node")


class NodeStats:
    """Counters reported by the ``stats`` action; thread-safe."""

    FIELDS = ("bytes_sent", "batches_sent", "partitions_served", "bytes_received", "partitions_stored", "errors")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.FIELDS, 0)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for key, delta in deltas.items():
                self._values[key] += delta

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


class NodeServer(ServiceBase):
    """One node of a flightpart cluster."""

    log = log

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
        token: str | None = None,
        pool: ConnectionPool | None = None,
        **server_kwargs: Any,
    ):
        super().__init__(host, port, token=token, max_streams=max_streams, advertise=advertise, **server_kwargs)
        if advertise_ip is None and advertise:
            advertise_ip = socket.gethostbyname(advertise)
        self.ip = advertise_ip or (host if host not in ("0.0.0.0", "::", "") else advertised_ip())
        self.store = PartitionStore(data_dir or default_data_dir(), max_partition_bytes=max_partition_bytes)
        self.node_id = self.store.node_id
        self.pid = os.getpid()
        self.counters = NodeStats()
        self.catalog_uri = catalog
        self.heartbeat_interval = heartbeat_interval
        self.pool = pool or ConnectionPool(Access(token=token))
        self._stopping = threading.Event()
        self.registered = threading.Event()
        inprocess.register(self.uri, self.store.open)
        if catalog:
            threading.Thread(target=self._report_loop, name="flightpart-heartbeat", daemon=True).start()

    # ------------------------------------------------------------------ catalog

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
        """Tell the catalog who we are and everything our directory holds."""
        held = tuple(self.store.scan())
        body = RegisterNode(self.node_id, self.uri, self.ip, self.pid, str(self.store.root), __version__, held)
        reply = RegisterReply.from_json(self.pool.action(self.catalog_uri, RegisterNode.ACTION, body), "register-node reply")
        for orphan in reply.orphans:
            self.store.drop(orphan.dataset, orphan.version)  # an aborted put or a drop missed while down
        self.registered.set()

    def _report_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                if not self.registered.is_set():
                    self.register()
                else:
                    raw = self.pool.action(self.catalog_uri, Heartbeat.ACTION, Heartbeat(self.node_id), timeout=5)
                    if not HeartbeatReply.from_json(raw, "heartbeat reply").known:
                        self.registered.clear()
                        continue
            except Exception as exc:  # catalog down: keep serving, keep trying
                log.debug("catalog %s unreachable: %s", self.catalog_uri, exc)
                self.pool.discard(self.catalog_uri)
                self.registered.clear()
            self._stopping.wait(self.heartbeat_interval)

    def shutdown(self) -> None:
        self._stopping.set()
        inprocess.unregister(self.uri)
        super().shutdown()

    def healthy(self) -> bool:
        """SERVING while the data directory is there and writable."""
        return self.store.root.is_dir() and os.access(self.store.root, os.W_OK)

    def stats(self) -> dict:
        """Counters for the ``stats`` action and the metrics endpoint."""
        return {**self.counters.snapshot(), "partitions_held": self.store.count(),
                "open_streams": self.guard.open_streams, "refused_calls": self.guard.refused}

    # ------------------------------------------------------------------ data

    def do_put(self, context: Any, descriptor: flight.FlightDescriptor, reader: Any, writer: Any) -> None:
        with boundary(log, "do_put"), self._counting_errors():
            name, version, part = parse_partition_path(descriptor)
            schema = reader.schema
            expected = self.store.group_schema(name, version, part[1])
            if expected is not None and not expected.equals(schema):
                raise SchemaMismatch(
                    f"schema of {name} v{version} {part} differs from the partitions of its column group already stored: "
                    f"got {schema}, expected {expected}", field="schema",
                )
            received = [0]
            declared: list[int] = []

            def batches() -> Iterator[pa.RecordBatch]:
                while True:
                    try:
                        chunk = reader.read_chunk()
                    except StopIteration:
                        return
                    if chunk.app_metadata is not None:
                        declared.append(PutTrailer.decode(chunk.app_metadata.to_pybytes(), "put trailer").rows)
                    if chunk.data is not None:
                        received[0] += chunk.data.nbytes
                        yield from split_batch(chunk.data, BATCH_BYTES)

            def check_complete(rows: int) -> None:
                if context.is_cancelled():
                    raise RequestRejected(f"the put of {name} v{version} {part} was cancelled after {rows} rows; "
                                          "nothing was stored", field="stream")
                if declared and declared[-1] != rows:
                    raise RequestRejected(f"the put of {name} v{version} {part} ended after {rows} rows, "
                                          f"the sender declared {declared[-1]}", field="put trailer")

            stored = self.store.write(name, version, part, schema, batches(), check_complete)
            self.counters.add(bytes_received=received[0], partitions_stored=1)
            writer.write(pa.py_buffer(stored.encode()))

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        with boundary(log, "do_get"), self._counting_errors():
            spec = Ticket.decode(ticket.ticket)
            table = project(self.store.open(spec.dataset, spec.version, spec.part), spec.columns, spec.rows)
        # a partition's columns share chunk boundaries (one IPC file), so the stream
        # sends one batch per chunk: counted without touching the batches
        batches = table.column(0).num_chunks if table.num_columns else 0
        self.counters.add(bytes_sent=table.nbytes, batches_sent=batches, partitions_served=1)
        return flight.RecordBatchStream(table)

    @contextlib.contextmanager
    def _counting_errors(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.counters.add(errors=1)
            raise

    # ------------------------------------------------------------------ actions

    def _node_info(self, raw: bytes) -> dict:
        Empty.decode(raw, "node-info")
        return self.info()

    def _stats(self, raw: bytes) -> dict:
        Empty.decode(raw, "stats")
        return self.stats()

    def _held(self, raw: bytes) -> dict:
        body = Held.decode(raw)
        return HeldReply(tuple(self.store.held(body.dataset, body.version))).to_json()

    def _drop(self, raw: bytes) -> dict:
        body = Drop.decode(raw)
        return {"removed": self.store.drop(body.dataset, body.version)}

    def _copy_to(self, raw: bytes) -> dict:
        body = CopyTo.decode(raw)
        table = self.store.open(body.dataset, body.version, body.part)
        send_partition(self.pool, body.target, body.dataset, body.version, body.part, table)
        return {"copied": table.nbytes}

    actions = {
        "node-info": Action(_node_info, "who this node is: id, uri, ip, pid, data dir, version", changes_state=False),
        "stats": Action(_stats, "bytes and batches served, partitions stored and held", changes_state=False),
        "held": Action(_held, "partitions of one dataset version on this node", changes_state=False),
        "drop": Action(_drop, "remove a dataset version's files"),
        "copy-to": Action(_copy_to, "send a partition to another node (replication)"),
    }
