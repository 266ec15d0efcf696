"""The catalog's Flight server: one ``FlightInfo`` per dataset, built from SQLite state.

``get_flight_info(for_path(name))`` answers in the form any Flight client
understands: the schema, one endpoint per partition in row-major grid order
with the replicas' node URIs as locations, and JSON ``app_metadata`` that
carries the ``__partitioned__`` geometry.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.connections import ConnectionPool
from flightpart.errors import DatasetNotFound, InvalidName, SchemaMismatch
from flightpart.wire import Ticket, WireError, action_body, check_name, dumps, schema_from_text

from .auth import GuardFactory
from .catalog_state import CatalogState, NodeRecord, PartRecord, VersionRecord

log = logging.getLogger("flightpart.catalog")


def flight_info(record: VersionRecord, *, with_endpoints: bool = True) -> flight.FlightInfo:
    """The FlightInfo of one committed version (DESIGN's wire format)."""
    schema = pa.ipc.read_schema(pa.py_buffer(record.schema))
    endpoints = []
    if with_endpoints:
        for p in record.parts:
            meta = dumps({
                "position": list(p.part),
                "start": list(p.start),
                "shape": list(p.shape),
                "location": [[n.ip, n.pid] for n in p.nodes],
            })
            ticket = Ticket(record.dataset, record.version, p.part).encode()
            endpoints.append(flight.FlightEndpoint(ticket, [n.uri for n in p.nodes], app_metadata=meta))
    nodes = {n.node_id: n for p in record.parts for n in p.nodes}
    order = sorted(nodes)
    index = {node_id: k for k, node_id in enumerate(order)}
    rows = [p.shape[0] for p in record.parts if p.part[1] == 0]
    cols = [p.shape[1] for p in record.parts if p.part[0] == 0]
    meta = dumps({
        "shape": list(record.shape), "partition_tiling": list(record.grid), "version": record.version,
        # compact geometry for clients that would rather not parse every endpoint
        "row_sizes": rows, "col_sizes": cols,
        "nodes": [[nodes[k].uri, nodes[k].ip, nodes[k].pid] for k in order],
        "replicas": [[index[n.node_id] for n in p.nodes] for p in record.parts],
    })
    return flight.FlightInfo(
        schema,
        flight.FlightDescriptor.for_path(record.dataset),
        endpoints,
        total_records=record.shape[0],
        total_bytes=record.nbytes,
        ordered=True,
        app_metadata=meta,
    )


def _decode_schema(text: str, what: str) -> bytes:
    """The IPC bytes of a schema from a JSON body, checked."""
    return schema_from_text(text, what).serialize().to_pybytes()


def _pair(value: Any, what: str) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise WireError(f"{what}: expected [a, b] of non-negative integers, got {value!r:.60}")
    return (value[0], value[1])


class CatalogServer(flight.FlightServerBase):
    """Aggregates the nodes' partitions into datasets."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, state_path: str = ":memory:",
                 dead_after: float = 10.0, token: str | None = None, pool: ConnectionPool | None = None,
                 **server_kwargs: Any):
        scheme = "grpc+tls" if server_kwargs.get("tls_certificates") else "grpc"
        self.guard = GuardFactory(token)
        super().__init__(f"{scheme}://{host}:{port}", middleware={"guard": self.guard}, **server_kwargs)
        self.uri = f"{scheme}://{host}:{self.port}"
        self.state = CatalogState(state_path, dead_after=dead_after)
        self.pool = pool or ConnectionPool(token=token)
        self._infos: dict[tuple[str, int], tuple] = {}

    def shutdown(self) -> None:
        super().shutdown()
        self.state.close()

    # ------------------------------------------------------------------ reads

    def get_flight_info(self, context, descriptor):
        path = [p.decode("utf-8", "replace") if isinstance(p, bytes) else p for p in (descriptor.path or [])]
        if descriptor.descriptor_type != flight.DescriptorType.PATH or len(path) not in (1, 2):
            raise pa.ArrowInvalid("descriptor: expected a path [name] or [name, version]")
        version = None
        if len(path) == 2:
            if not path[1].isdigit():
                raise pa.ArrowInvalid(f"descriptor: version must be a number, got {path[1][:40]!r}")
            version = int(path[1])
        with _errors():
            name = check_name(path[0])
            version = self.state.latest(name) if version is None else version
            return self._cached_info(name, version)

    def _cached_info(self, name: str, version: int) -> flight.FlightInfo:
        """Versions are immutable: their FlightInfo is built once per state of the nodes."""
        nodes = tuple((n.node_id, n.uri, n.alive) for n in self.state.nodes())
        cached = self._infos.get((name, version))
        if cached is not None and cached[0] == nodes:
            return cached[1]
        info = flight_info(self.state.version(name, version))
        self._infos[(name, version)] = (nodes, info)
        return info

    def list_flights(self, context, criteria):
        for record in self.state.datasets():
            yield flight_info(record, with_endpoints=False)

    # ------------------------------------------------------------------ actions

    def list_actions(self, context):
        return [(name, doc) for name, (_, doc) in sorted(self._actions.items())]

    def do_action(self, context, action):
        entry = self._actions.get(action.type)
        if entry is None:
            raise pa.ArrowInvalid(f"unknown action {action.type!r:.60}; the catalog knows {sorted(self._actions)}")
        with _errors():
            result = entry[0](self, action.body.to_pybytes() if action.body is not None else b"")
        if action.type not in self._read_only:
            self._infos.clear()  # replicas, versions or nodes may have changed
        yield flight.Result(pa.py_buffer(dumps(result)))

    def _register_node(self, raw: bytes) -> dict:
        b = action_body(raw, "register-node", {"node_id": str, "uri": str, "ip": str, "pid": int},
                        {"data_dir": str, "version": str, "partitions": list})
        held = []
        for p in b.get("partitions", []):
            if isinstance(p, dict) and isinstance(p.get("dataset"), str) and isinstance(p.get("version"), int):
                held.append({"dataset": p["dataset"], "version": p["version"], "part": _pair(p.get("part"), "partitions.part")})
        orphans = self.state.register_node(b["node_id"], b["uri"], b["ip"], b["pid"], b.get("data_dir"), held)
        return {"registered": b["node_id"], "orphans": [list(o) for o in orphans]}

    def _heartbeat(self, raw: bytes) -> dict:
        b = action_body(raw, "heartbeat", {"node_id": str})
        return {"known": self.state.heartbeat(b["node_id"])}

    def _stats(self, raw: bytes = b"") -> dict:
        nodes = self.state.nodes()
        return {"datasets": len(self.state.datasets()), "nodes_alive": sum(n.alive for n in nodes),
                "nodes_dead": sum(not n.alive for n in nodes), "refused_calls": self.guard.refused}

    def _nodes(self, raw: bytes) -> list:
        return [n.as_json() for n in self.state.nodes()]

    def _begin(self, raw: bytes) -> dict:
        b = action_body(raw, "begin", {"dataset": str})
        return {"version": self.state.begin(check_name(b["dataset"]))}

    def _commit(self, raw: bytes) -> dict:
        b = action_body(raw, "commit", {"dataset": str, "version": int, "schema": str, "shape": list, "tiling": list, "partitions": list},
                        {"replicas": int})
        name = check_name(b["dataset"])
        schema = _decode_schema(b["schema"], "commit.schema")
        nodes = {n.node_id: n for n in self.state.nodes()}
        parts = []
        for k, p in enumerate(b["partitions"]):
            if not isinstance(p, dict):
                raise WireError(f"commit.partitions[{k}]: expected an object")
            holders = p.get("nodes")
            if not isinstance(holders, list) or not holders or not all(h in nodes for h in holders):
                raise WireError(f"commit.partitions[{k}].nodes: expected ids of registered nodes, got {holders!r:.80}")
            parts.append(PartRecord(_pair(p.get("part"), f"commit.partitions[{k}].part"), _pair(p.get("start"), f"commit.partitions[{k}].start"),
                                    _pair(p.get("shape"), f"commit.partitions[{k}].shape"), 0, [nodes[h] for h in holders]))
        shape, grid = _pair(b["shape"], "commit.shape"), _pair(b["tiling"], "commit.tiling")
        self._check_geometry(shape, grid, parts)
        self._verify_on_nodes(name, b["version"], schema, parts)
        self.state.commit(name, b["version"], schema, shape, grid, parts, replicas=max(1, b.get("replicas", 1)))
        return {"dataset": name, "version": b["version"]}

    def _check_geometry(self, shape, grid, parts: list[PartRecord]) -> None:
        from flightpart import protocol

        d = {
            "shape": shape, "partition_tiling": grid, "get": protocol.IdentityGet(),
            "partitions": {p.part: {"start": p.start, "shape": p.shape, "data": 0, "location": [(n.ip, n.pid) for n in p.nodes]} for p in parts},
        }
        try:
            protocol.validate(d)
        except ValueError as exc:
            raise WireError(f"commit: the partitions do not tile the dataset: {exc}") from None

    def _verify_on_nodes(self, name: str, version: int, schema: bytes, parts: list[PartRecord]) -> None:
        """Publish only what every claimed node really holds, with the right schema and rows."""
        expected = pa.ipc.read_schema(pa.py_buffer(schema))
        by_node: dict[str, NodeRecord] = {n.node_id: n for p in parts for n in p.nodes}
        held: dict[str, dict[tuple[int, int], dict]] = {}
        for node_id, node in by_node.items():
            try:
                reply = self.pool.action(node.uri, "held", {"dataset": name, "version": version})
            except flight.FlightError as exc:
                self.pool.discard(node.uri)
                raise flight.FlightUnavailableError(f"node {node.uri} did not answer while committing {name} v{version}: {exc}") from None
            held[node_id] = {tuple(h["part"]): h for h in reply}
        for p in parts:
            for node in p.nodes:
                h = held[node.node_id].get(p.part)
                if h is None:
                    raise SchemaMismatch(f"partition {p.part} of {name} v{version} is not stored on node {node.uri}")
                if h["rows"] != p.shape[0]:
                    raise SchemaMismatch(f"partition {p.part} of {name} v{version} on {node.uri} has {h['rows']} rows, expected {p.shape[0]}")
                got = schema_from_text(h["schema"], f"held reply of {node.uri}")
                if not got.equals(_group_schema(expected, got)):
                    raise SchemaMismatch(f"partition {p.part} of {name} v{version} on {node.uri} has schema {got}, which does not fit {expected}")
                p.nbytes = max(p.nbytes, h["nbytes"])

    def _abort(self, raw: bytes) -> dict:
        b = action_body(raw, "abort", {"dataset": str, "version": int})
        nodes = self.state.abort(check_name(b["dataset"]), b["version"])
        self._drop_files(b["dataset"], b["version"], nodes)
        return {"aborted": b["version"]}

    def _drop(self, raw: bytes) -> dict:
        b = action_body(raw, "drop", {"dataset": str}, {"version": (int, type(None))})
        name = check_name(b["dataset"])
        nodes = self.state.drop(name, b.get("version"))
        return {"dataset": name, "version": b.get("version"), "nodes_cleaned": self._drop_files(name, b.get("version"), nodes)}

    def _drop_files(self, name: str, version: int | None, nodes: list[NodeRecord]) -> int:
        cleaned = 0
        for node in nodes:
            try:
                self.pool.action(node.uri, "drop", {"dataset": name, "version": version}, timeout=10)
                cleaned += 1
            except flight.FlightError:
                self.pool.discard(node.uri)  # a dead node drops its files when it comes back and is told again
        return cleaned

    def _repair(self, raw: bytes) -> dict:
        """Copy every under-replicated partition from a live holder to a live node without it."""
        action_body(raw, "repair", {})
        live = [n for n in self.state.nodes() if n.alive]
        copies, missing = [], []
        load = {n.node_id: 0 for n in live}
        for record in self.state.all_versions():
            for p in record.parts:
                for n in p.nodes:
                    if n.node_id in load:
                        load[n.node_id] += 1
        for record in self.state.all_versions():
            for p in record.parts:
                holders = [n for n in p.nodes if n.alive]
                if not holders:
                    missing.append({"dataset": record.dataset, "version": record.version, "part": list(p.part)})
                    continue
                held_by = {n.node_id for n in p.nodes}
                while len(holders) < record.replicas:
                    spare = sorted((n for n in live if n.node_id not in held_by), key=lambda n: load[n.node_id])
                    if not spare:
                        break
                    target = spare[0]
                    self.pool.action(holders[0].uri, "copy-to", {"dataset": record.dataset, "version": record.version,
                                                                 "part": list(p.part), "target": target.uri}, timeout=None)
                    self._verify_on_nodes(record.dataset, record.version, record.schema, [PartRecord(p.part, p.start, p.shape, 0, [target])])
                    self.state.add_replica(record.dataset, record.version, p.part, target.node_id)
                    held_by.add(target.node_id)
                    holders.append(target)
                    load[target.node_id] += 1
                    copies.append({"dataset": record.dataset, "version": record.version, "part": list(p.part), "to": target.uri})
        return {"copied": copies, "lost": missing}

    def _versions(self, raw: bytes) -> list:
        b = action_body(raw, "versions", {"dataset": str})
        return self.state.versions_of(check_name(b["dataset"]))

    def _publish_begin(self, raw: bytes) -> dict:
        b = action_body(raw, "publish-begin", {"dataset": str, "nranks": int, "rank": int})
        name = check_name(b["dataset"])
        if not 0 <= b["rank"] < b["nranks"]:
            raise WireError(f"publish-begin: rank {b['rank']} is not in [0, {b['nranks']})")
        return {"version": self.state.join_publish(name, b["nranks"], b["rank"])}

    def _publish_part(self, raw: bytes) -> dict:
        b = action_body(raw, "publish-part", {"dataset": str, "version": int, "rank": int, "rows": int, "cols": int, "node_id": str, "schema": str})
        name, version = check_name(b["dataset"]), b["version"]
        state = self.state.version_state(name, version)
        if state is None or state[0] != "pending" or state[1] is None:
            raise WireError(f"publish-part: {name} v{version} is not an open SPMD publish")
        nranks = state[1]
        schema = schema_from_text(b["schema"], "publish-part.schema")
        first = self.state.version_schema(name, version)
        if first is not None and not pa.ipc.read_schema(pa.py_buffer(first)).equals(schema):
            raise SchemaMismatch(f"rank {b['rank']} sent schema {schema}, other ranks sent {pa.ipc.read_schema(pa.py_buffer(first))}")
        if b["node_id"] not in {n.node_id for n in self.state.nodes()}:
            raise WireError(f"publish-part: unknown node {b['node_id']!r}")
        schema_bytes = schema.serialize().to_pybytes()
        joined = self.state.add_rank_part(name, version, b["rank"], b["rows"], b["cols"], 0, b["node_id"], schema_bytes)
        if joined < nranks:
            return {"version": version, "complete": False, "joined": joined}
        # the last rank in commits; the node checks run without holding the database
        nodes = {n.node_id: n for n in self.state.nodes()}
        start, parts = 0, []
        for rank, rows, cols, node_id in self.state.rank_parts(name, version):
            parts.append(PartRecord((rank, 0), (start, 0), (rows, cols), 0, [nodes[node_id]]))
            start += rows
        self._verify_on_nodes(name, version, schema_bytes, parts)
        try:
            self.state.commit(name, version, schema_bytes, (start, parts[0].shape[1]), (nranks, 1), parts)
        except ValueError:
            if self.state.version_state(name, version) != ("committed", nranks):
                raise  # not the race with another last rank: a real failure
        return {"version": version, "complete": True, "joined": joined}

    def healthy(self) -> bool:
        """SERVING while the state database answers."""
        return self.state.ping()

    _actions = {
        "register-node": (_register_node, "a node announces itself and what its data directory holds"),
        "heartbeat": (_heartbeat, "a node is alive"),
        "nodes": (_nodes, "every known node, alive or not"),
        "stats": (_stats, "datasets and nodes alive or dead"),
        "begin": (_begin, "reserve the next version of a dataset"),
        "commit": (_commit, "publish a version once every partition is stored on its nodes"),
        "abort": (_abort, "forget a pending version and drop its files"),
        "drop": (_drop, "drop a version (or all versions) of a dataset and its files"),
        "versions": (_versions, "committed versions of a dataset"),
        "repair": (_repair, "copy under-replicated partitions to live nodes (copy-to)"),
        "publish-begin": (_publish_begin, "SPMD: join (or open) the pending publish of a dataset"),
        "publish-part": (_publish_part, "SPMD: one rank's part is stored; commits when all ranks are in"),
    }


CatalogServer._read_only = frozenset({"heartbeat", "nodes", "stats", "versions", "begin", "publish-begin"})


def _group_schema(full: pa.Schema, part: pa.Schema) -> pa.Schema:
    """The fields of ``full`` a column-group partition is expected to carry."""
    fields = [full.field(name) for name in part.names if full.get_field_index(name) >= 0]
    return pa.schema(fields, metadata=part.metadata) if len(fields) == len(part.names) else full


class _errors:
    """Map our exceptions to the Flight status a client can act on."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            return False
        if isinstance(exc, DatasetNotFound):
            raise KeyError(str(exc)) from None
        if isinstance(exc, (InvalidName, WireError, SchemaMismatch)):
            raise pa.ArrowInvalid(str(exc)) from None
        return False
