"""A node's Flight server: stores partitions, serves them, reports to its catalog.

Each method does one thing and hands Arrow objects to Arrow: ``do_get``
returns a ``RecordBatchStream`` over a memory-mapped table (projection and
row ranges are zero-copy slices), so no Python runs per batch.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import __version__
from flightpart.connections import ConnectionPool
from flightpart import inprocess
from flightpart.transfer import project, send_partition, split_batch, BATCH_BYTES
from flightpart.hosts import advertised_ip
from flightpart.wire import Ticket, WireError, action_body, dumps, parse_partition_path, schema_to_text

from .auth import GuardFactory
from .paths import default_data_dir
from .store import PartitionStore, PartitionTooLarge

log = logging.getLogger("flightpart.node")
class NodeStats:
    """Counters reported by the ``stats`` action; thread-safe."""

    FIELDS = ("bytes_sent", "batches_sent", "partitions_served", "bytes_received", "partitions_stored", "errors")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.FIELDS, 0)
        self.open_streams = 0

    def add(self, **deltas: int) -> None:
        with self._lock:
            for key, delta in deltas.items():
                self._values[key] += delta

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


def _invalid(message: str) -> pa.ArrowInvalid:
    return pa.ArrowInvalid(message)


def _declared_rows(metadata: pa.Buffer) -> int:
    """The sender's trailer ``{"rows": n}`` that closes a complete put."""
    body = action_body(metadata.to_pybytes(), "put trailer", {"rows": int})
    return body["rows"]


class NodeServer(flight.FlightServerBase):
    """One node of a flightpart cluster."""

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
        scheme = "grpc+tls" if server_kwargs.get("tls_certificates") else "grpc"
        self.guard = GuardFactory(token, max_streams)
        super().__init__(f"{scheme}://{host}:{port}", middleware={"guard": self.guard}, **server_kwargs)
        self.uri = f"{scheme}://{advertise or host}:{self.port}"
        if advertise_ip is None and advertise:
            advertise_ip = socket.gethostbyname(advertise)
        self.ip = advertise_ip or (host if host not in ("0.0.0.0", "::", "") else advertised_ip())
        self.store = PartitionStore(data_dir or default_data_dir(), max_partition_bytes=max_partition_bytes)
        self.node_id = self.store.node_id
        self.pid = os.getpid()
        self.stats = NodeStats()
        self.catalog_uri = catalog
        self.heartbeat_interval = heartbeat_interval
        self.pool = pool or ConnectionPool(token=token)
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
        body = {**self.info(), "partitions": [p.as_json() for p in self.store.scan()]}
        reply = self.pool.action(self.catalog_uri, "register-node", body)
        for dataset, version in (reply or {}).get("orphans", []):
            self.store.drop(dataset, version)  # an aborted put or a drop missed while down
        self.registered.set()

    def _report_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                if not self.registered.is_set():
                    self.register()
                else:
                    reply = self.pool.action(self.catalog_uri, "heartbeat", {"node_id": self.node_id}, timeout=5)
                    if not reply.get("known", False):
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

    # ------------------------------------------------------------------ data

    def do_put(self, context, descriptor, reader, writer):
        if descriptor.descriptor_type != flight.DescriptorType.PATH:
            raise _invalid("descriptor: expected a path [name, version, i, j]")
        try:
            name, version, part = parse_partition_path(descriptor.path)
        except WireError as exc:
            raise _invalid(str(exc)) from None
        schema = reader.schema
        expected = self.store.group_schema(name, version, part[1])
        if expected is not None and not expected.equals(schema):
            raise _invalid(
                f"schema of {name} v{version} {part} differs from the partitions of its column group already stored: "
                f"got {schema}, expected {expected}"
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
                    declared.append(_declared_rows(chunk.app_metadata))
                if chunk.data is not None:
                    received[0] += chunk.data.nbytes
                    yield from split_batch(chunk.data, BATCH_BYTES)

        def check_complete(rows: int) -> None:
            if context.is_cancelled():
                raise ValueError(f"the put of {name} v{version} {part} was cancelled after {rows} rows; nothing was stored")
            if declared and declared[-1] != rows:
                raise ValueError(f"the put of {name} v{version} {part} ended after {rows} rows, the sender declared {declared[-1]}")

        try:
            stored = self.store.write(name, version, part, schema, batches(), check_complete)
        except (PartitionTooLarge, ValueError) as exc:
            self.stats.add(errors=1)
            raise _invalid(str(exc)) from None
        self.stats.add(bytes_received=received[0], partitions_stored=1)
        writer.write(pa.py_buffer(dumps(stored.as_json())))

    def do_get(self, context, ticket):
        try:
            spec = Ticket.decode(ticket.ticket)
        except WireError as exc:
            self.stats.add(errors=1)
            raise _invalid(str(exc)) from None
        try:
            table = self.store.open(spec.dataset, spec.version, spec.part)
        except KeyError as exc:
            self.stats.add(errors=1)
            raise KeyError(exc.args[0]) from None
        try:
            table = project(table, spec.columns, spec.rows)
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        # a partition's columns share chunk boundaries (one IPC file), so the stream
        # sends one batch per chunk: counted without touching the batches
        batches = table.column(0).num_chunks if table.num_columns else 0
        self.stats.add(bytes_sent=table.nbytes, batches_sent=batches, partitions_served=1)
        return flight.RecordBatchStream(table)

    # ------------------------------------------------------------------ actions

    def list_actions(self, context):
        return [
            ("node-info", "who this node is: id, uri, ip, pid, data dir, version"),
            ("stats", "bytes and batches served, partitions stored and held"),
            ("held", "partitions of one dataset version on this node"),
            ("drop", "remove a dataset version's files"),
            ("copy-to", "send a partition to another node (replication)"),
        ]

    def do_action(self, context, action):
        handler = self._actions.get(action.type)
        if handler is None:
            raise _invalid(f"unknown action {action.type!r:.60}; this node knows {sorted(self._actions)}")
        try:
            result = handler(self, action.body.to_pybytes() if action.body is not None else b"")
        except WireError as exc:
            raise _invalid(str(exc)) from None
        yield flight.Result(pa.py_buffer(dumps(result)))

    def _node_info(self, raw: bytes) -> dict:
        return self.info()

    def healthy(self) -> bool:
        """SERVING while the data directory is there and writable."""
        return self.store.root.is_dir() and os.access(self.store.root, os.W_OK)

    def _stats(self, raw: bytes = b"") -> dict:
        return {**self.stats.snapshot(), "partitions_held": self.store.count(),
                "open_streams": self.guard.open_streams, "refused_calls": self.guard.refused}

    def _held(self, raw: bytes) -> list:
        body = action_body(raw, "held", {"dataset": str, "version": int})
        return [{**p.as_json(), "schema": schema_to_text(p.schema)} for p in self.store.held(body["dataset"], body["version"])]

    def _drop(self, raw: bytes) -> dict:
        body = action_body(raw, "drop", {"dataset": str}, {"version": (int, type(None))})
        return {"removed": self.store.drop(body["dataset"], body.get("version"))}

    def _copy_to(self, raw: bytes) -> dict:
        body = action_body(raw, "copy-to", {"dataset": str, "version": int, "part": list, "target": str})
        part = tuple(body["part"])
        if len(part) != 2 or not all(isinstance(k, int) for k in part):
            raise WireError("copy-to.part: expected [i, j]")
        try:
            table = self.store.open(body["dataset"], body["version"], part)
        except KeyError as exc:
            raise KeyError(exc.args[0]) from None
        send_partition(self.pool, body["target"], body["dataset"], body["version"], part, table)
        return {"copied": table.nbytes}

    _actions = {"node-info": _node_info, "stats": _stats, "held": _held, "drop": _drop, "copy-to": _copy_to}
