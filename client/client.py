"""``Client``: what a user holds to talk to a flightpart cluster.

One object, an explicit lifetime (``with fp.connect(...) as client:``),
thread-safe, reusing its Flight connections, raising flightpart's own
exceptions with messages that say what to do.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import pyarrow.flight as flight

from flightpart import frames, tiling
from flightpart.tiling import grid_cells
from flightpart.connections import ConnectionPool
from flightpart.errors import NodeUnavailable
from flightpart.transfer import send_partition
from flightpart.wire import check_name, schema_to_text

from .dataset import Dataset, PartInfo
from .errors import translated
from .fetch import FlightGet

Progress = Callable[[int, int], None]  # (bytes done, bytes total)


class Client:
    """A connection to one catalog (and, through it, to every node)."""

    def __init__(self, uri: str, *, host: str | None = None, token: str | None = None,
                 tls_root_certs: bytes | None = None, cert_chain: bytes | None = None, private_key: bytes | None = None,
                 owned: Sequence[Any] = ()):
        self.uri = uri
        self.host = host
        self.token = token
        self.tls_root_certs = tls_root_certs
        self.pool = ConnectionPool(token=token, tls_root_certs=tls_root_certs, cert_chain=cert_chain, private_key=private_key)
        self._owned = list(owned)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Close connections and stop any embedded servers this client started."""
        self.pool.close()
        for server in reversed(self._owned):
            server.shutdown()
        self._owned.clear()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.uri!r})"

    def _catalog(self, action: str, body: Any = None, timeout: float | None = 60) -> Any:
        with translated():
            return self.pool.action(self.uri, action, body, timeout=timeout)

    # ------------------------------------------------------------------ cluster

    def nodes(self) -> list[dict]:
        """Every node the catalog knows: id, uri, ip, pid, last heartbeat, alive."""
        return self._catalog("nodes")

    def stats(self, uri: str) -> dict:
        """A node's counters (bytes and batches served, partitions stored and held)."""
        with translated():
            return self.pool.action(uri, "stats")

    def list(self) -> list[dict]:
        """The latest committed version of every dataset."""
        with translated():
            infos = list(self.pool.client(self.uri).list_flights(options=self.pool.options()))
        out = []
        for info in infos:
            meta = json.loads(info.app_metadata or b"{}")
            out.append({
                "name": info.descriptor.path[0].decode(),
                "version": meta.get("version"),
                "shape": tuple(meta.get("shape", ())),
                "partition_tiling": tuple(meta.get("partition_tiling", ())),
                "nbytes": info.total_bytes,
            })
        return out

    def repair(self) -> dict:
        """Copy under-replicated partitions to live nodes; returns what was copied and what is lost."""
        return self._catalog("repair", {}, timeout=None)

    def versions(self, name: str) -> list[int]:
        return self._catalog("versions", {"dataset": check_name(name)})

    def drop(self, name: str, version: int | None = None) -> None:
        """Drop one version (or every version) of a dataset; nodes free its files."""
        self._catalog("drop", {"dataset": check_name(name), "version": version})

    # ------------------------------------------------------------------ put

    def put(self, name: str, data: Any, tiling: Sequence[int] | None = None, replicas: int = 1,
            nodes: Sequence[str] | None = None, progress: Progress | None = None) -> Dataset:
        """Store a frame as the next version of ``name``; returns it opened.

        The default tiling is one row block per node (the Dist RFC's default
        partition); partitions go round-robin to nodes, replicas to distinct
        nodes, and puts to different nodes run in parallel. Nothing is
        published unless every partition is stored.
        """
        check_name(name)
        collection = _collection_kind(data)
        if collection is not None:
            return self._put_collection(name, data, collection, tiling, replicas, nodes)
        table = frames.to_arrow(data)
        targets = self._target_nodes(nodes)
        if not isinstance(replicas, int) or not 1 <= replicas <= len(targets):
            raise ValueError(f"replicas must be between 1 and the {len(targets)} usable nodes, got {replicas!r}")
        grid = _grid(tiling, len(targets))
        shape = frames.frame_shape(table)
        cells = {c.position: c for c in grid_cells(shape, grid)}
        parts = frames.split_grid(table, grid)
        placement = {pos: [targets[(k + r) % len(targets)] for r in range(replicas)] for k, pos in enumerate(sorted(parts))}
        commit = {
            "replicas": replicas,
            "schema": schema_to_text(table.schema),
            "shape": list(shape),
            "tiling": list(grid),
            "partitions": [
                {"part": list(pos), "start": list(cells[pos].start), "shape": list(cells[pos].shape),
                 "nodes": [n["node_id"] for n in placement[pos]]}
                for pos in sorted(parts)
            ],
        }
        return self._versioned(name, lambda version: (self._send(name, version, parts, placement, progress), commit)[1])

    def _versioned(self, name: str, store: Callable[[int], dict]) -> Dataset:
        """Reserve a version, store it, commit it; abort on any failure."""
        version = self._catalog("begin", {"dataset": name})["version"]
        try:
            commit = store(version)
            self._catalog("commit", {"dataset": name, "version": version, **commit})
        except BaseException:
            try:
                self._catalog("abort", {"dataset": name, "version": version}, timeout=10)
            except Exception:
                pass  # the catalog is gone too; the pending version was never published
            raise
        return self.open(name, version)

    def _put_collection(self, name: str, data: Any, kind: str, tiling: Sequence[int] | None, replicas: int,
                        nodes: Sequence[str] | None) -> Dataset:
        """A Dask DataFrame or Ray Dataset: sent by the workers that hold it."""
        from flightpart.runtimes import dask as fdask, ray as fray

        if replicas != 1:
            raise ValueError(f"replicas={replicas}: a {kind} collection is put with one replica; add more with repair")
        if tiling is not None:
            raise ValueError(f"tiling: a {kind} collection keeps its own partitions (one row block each); pass tiling=None")
        targets = self._target_nodes(nodes)
        sender = fdask.put if kind == "dask" else fray.put

        def store(version: int) -> dict:
            receipts, placement = sender(self, name, data, targets, version)
            if not receipts:
                raise ValueError(f"{name}: the {kind} collection has no partitions")
            start, parts = 0, []
            for k, (receipt, (_holder, node)) in enumerate(zip(receipts, placement)):
                parts.append({"part": [k, 0], "start": [start, 0], "shape": [receipt["rows"], receipt["cols"]],
                              "nodes": [node["node_id"]]})
                start += receipt["rows"]
            return {"schema": receipts[0]["schema"], "shape": [start, receipts[0]["cols"]], "tiling": [len(parts), 1],
                    "partitions": parts}

        return self._versioned(name, store)

    def _target_nodes(self, nodes: Sequence[str] | None) -> list[dict]:
        alive = [n for n in self.nodes() if n["alive"]]
        if nodes is not None:
            wanted = set(nodes)
            alive = [n for n in alive if wanted & {n["node_id"], n["uri"], n["ip"]}]
        if not alive:
            raise NodeUnavailable(
                "no live node to put to" + (f" among {list(nodes)}" if nodes is not None else "")
                + "; start one with `flightpart serve --catalog " + self.uri + "`"
            )
        return alive

    def _send(self, name: str, version: int, parts: dict, placement: dict, progress: Progress | None) -> None:
        by_node: dict[str, list] = {}
        for pos, holders in placement.items():
            for node in holders:
                by_node.setdefault(node["uri"], []).append(pos)
        total = sum(parts[pos].nbytes * len(h) for pos, h in placement.items())
        done = [0]
        lock = threading.Lock()

        def send_all(uri: str) -> None:
            for pos in by_node[uri]:
                with translated():
                    send_partition(self.pool, uri, name, version, pos, parts[pos])
                with lock:  # one thread per node adds to the same count
                    done[0] += parts[pos].nbytes
                    sent = done[0]
                if progress:
                    progress(sent, total)

        with ThreadPoolExecutor(max_workers=len(by_node), thread_name_prefix="flightpart-put") as ex:
            for future in [ex.submit(send_all, uri) for uri in by_node]:
                future.result()

    # ------------------------------------------------------------------ open

    def open(self, name: str, version: int | None = None, *, rank: int | None = None, nranks: int | None = None) -> Dataset:
        """The latest committed version of ``name`` (or ``version``).

        With ``rank``/``nranks`` the SPMD view: ``locals`` lists this rank's
        partitions and the others' ``data`` is ``None``.
        """
        path = [check_name(name)] + ([str(int(version))] if version is not None else [])
        with translated():
            info = self.pool.client(self.uri).get_flight_info(flight.FlightDescriptor.for_path(*path), options=self.pool.options())
        ds = dataset_from_info(name, info, FlightGet(self.host, self.token, self.tls_root_certs))
        if rank is not None or nranks is not None:
            ds = ds.spmd(rank, nranks)
        return ds


def _collection_kind(data: Any) -> str | None:
    module = type(data).__module__
    if module.startswith("dask.dataframe") and hasattr(data, "npartitions"):
        return "dask"
    if module.startswith("ray.data") and hasattr(data, "to_arrow_refs"):
        return "ray"
    return None


def _grid(value: Sequence[int] | None, nodes: int) -> tuple[int, int]:
    if value is None:
        return (nodes, 1)
    grid = tuple(value)
    if len(grid) != 2 or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in grid):
        raise ValueError(f"tiling must be (row blocks, column groups) of positive integers, got {value!r}")
    return grid  # type: ignore[return-value]


def dataset_from_info(name: str, info: flight.FlightInfo, get: FlightGet) -> Dataset:
    """A :class:`Dataset` from the catalog's FlightInfo (see the wire format).

    Our catalog adds the geometry and node table to ``FlightInfo.app_metadata``
    so that 10,000 partitions open without touching 10,000 endpoints; the
    per-endpoint metadata is the fallback.
    """
    meta = json.loads(info.app_metadata)
    grid = tuple(meta["partition_tiling"])
    if "row_sizes" in meta:
        nodes = [tuple(n) for n in meta["nodes"]]
        row_starts = tiling.starts_from_sizes(meta["row_sizes"])
        col_starts = tiling.starts_from_sizes(meta["col_sizes"])
        shared: dict[tuple, tuple] = {}
        parts = []
        for k, holders in enumerate(meta["replicas"]):
            i, j = divmod(k, grid[1])
            key = tuple(holders)
            replicas = shared.get(key)
            if replicas is None:
                replicas = shared[key] = tuple(nodes[h] for h in holders)
            parts.append(PartInfo((i, j), (row_starts[i], col_starts[j]), (meta["row_sizes"][i], meta["col_sizes"][j]), replicas))
    else:
        parts = []
        for endpoint in info.endpoints:
            em = json.loads(endpoint.app_metadata)
            uris = [loc.uri.decode() if isinstance(loc.uri, bytes) else str(loc.uri) for loc in endpoint.locations]
            replicas = tuple((u, ip, pid) for u, (ip, pid) in zip(uris, em["location"]))
            parts.append(PartInfo(tuple(em["position"]), tuple(em["start"]), tuple(em["shape"]), replicas))
    return Dataset(name, meta["version"], info.schema, tuple(meta["shape"]), grid, parts, info.total_bytes, get)
