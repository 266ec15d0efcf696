"""Dask as producer and consumer of ``__partitioned__``, with locality kept.

- :func:`partitioned`: a persisted dask DataFrame whose ``data`` are ``distributed.Future`` s on their workers.
- :func:`from_partitioned` / ``Dataset.to_dask()``: one ``dd.from_map`` task per row block, known divisions,
  columns and row filters pushed into the read, each read placed on its partition's host (:class:`LocalityPlugin`).
- :func:`put`: each worker sends its partitions to the node on its own host, not through the driver.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightpart import frames, protocol
from flightpart.client.fetch import FlightGet, PartitionRef
from flightpart.io.transfer import SentPart
from flightpart.protocol import StatelessGet
from flightpart.query.filters import Filter
from flightpart.runtimes.dask_cluster import start, stop
from flightpart.runtimes.dask_pushdown import PUSHDOWN_AVAILABLE, FlightpartRead, compiled
from flightpart.runtimes.tasks import (
    BlockReader,
    RowBlock,
    divisions_for,
    global_range_index,
    group_columns_of,
    host_of,
    node_for,
    row_blocks,
    send_from_worker,
    stored_range,
)
from flightpart.wire import ROW_NUMBER, NodeRow

__all__ = ["DaskGather", "LocalityPlugin", "dask_graph", "from_partitioned", "owns", "partitioned", "put", "start",
           "stop"]


class DaskGather(StatelessGet):
    """Picklable ``get`` for ``distributed.Future`` handles: gathers them with the calling context's client."""

    def fetch(self, handles: list) -> list:
        from distributed import get_client

        return get_client().gather(handles)


# --------------------------------------------------------------------------- producer


class DaskPartitioned:
    """A persisted dask DataFrame seen through ``__partitioned__``."""

    def __init__(self, persisted: Any, futures: list, lengths: list[int], holders: list[list[str]],
                 pids: dict[str, int]):
        self.collection = persisted  # keeps the futures alive
        self.futures = futures
        self.lengths = lengths
        self.holders = holders
        self._pids = pids
        self._ncols = len(persisted.columns)

    @property
    def __partitioned__(self) -> dict:
        locations = [[(host_of(w), self._pids.get(w, 0)) for w in holders] for holders in self.holders]
        return protocol.row_blocks_dict(self.futures, self.lengths, self._ncols, locations, DaskGather())


def partitioned(ddf: Any, client: Any = None) -> DaskPartitioned:
    """Persist ``ddf`` and expose it as ``__partitioned__``; futures are matched through the persisted
    collection's keys, since persisting renames them."""
    from distributed import default_client, futures_of, wait

    client = client or default_client()
    persisted = client.persist(ddf)
    wait(persisted)
    by_key = {f.key: f for f in futures_of(persisted)}
    graph = persisted.__dask_graph__()
    futures = [by_key[_resolve_alias(graph, k, by_key)] for k in persisted.__dask_keys__()]
    lengths = client.gather(client.map(len, futures, pure=False))
    who = client.who_has(futures)
    holders = [sorted(who[f.key]) for f in futures]
    pids = client.run(os.getpid)
    return DaskPartitioned(persisted, futures, lengths, holders, pids)


def _resolve_alias(graph: Any, key: Any, futures: dict) -> Any:
    """The future's key behind one output key of a persisted collection."""
    seen = 0
    while key not in futures and seen < 16:
        node = graph[key]
        target = getattr(node, "target", None)
        key = target.key if hasattr(target, "key") else target
        seen += 1
    return key


# --------------------------------------------------------------------------- consumer


def _worker_host() -> str | None:
    try:
        from distributed import get_worker

        return host_of(get_worker().address)
    except (ImportError, ValueError):
        return None


class ReadBlock:
    """``dd.from_map`` function: one row block as pandas, with the columns (``columns=``) and row filter
    (:meth:`filtered`) Dask pushes into it sent in the tickets. ``schema``: the dataset's when its handles can
    carry a filter, else None."""

    def __init__(self, reader: BlockReader, range_index: bool, schema: pa.Schema | None = None,
                 filter: Filter | None = None, widened: dict[str, Any] | None = None,
                 index_range: tuple[int, int, Any] = (0, 1, None)):
        self.reader = reader
        self.range_index = range_index
        self.index_range = index_range  # the frame's RangeIndex (start, step, name) row positions map to
        self.schema = schema
        self.filter = filter
        self.widened = widened  # columns with a null somewhere, and the dtype the whole frame gives them

    def filtered(self, expression: pc.Expression | None) -> ReadBlock | None:
        """This read with ``expression`` and its own filter applied on the nodes, or None when not exact there."""
        if expression is None or self.schema is None:
            return None
        if self.filter is not None:
            expression = self.filter.expression & expression
        bound = compiled(expression, self.schema)
        return None if bound is None else ReadBlock(self.reader, self.range_index, self.schema, bound, self.widened,
                                                    self.index_range)

    def __call__(self, block: RowBlock, columns: Sequence[str] | None = None) -> Any:
        import pandas as pd

        reader = self.reader.project(list(columns)) if columns is not None else self.reader
        if self.filter is not None:
            reader = reader.filtered(self.filter.substrait, self.range_index)
        table = reader.read(block)
        positions = None
        if self.filter is not None and self.range_index:  # each kept row's place in the unfiltered block
            first = block.handles[0].rows[0] if block.handles[0].rows else 0
            positions = table.column(ROW_NUMBER).to_numpy() - first + block.start
            table = table.drop_columns([ROW_NUMBER])
        df = self._widen(frames.to_pandas(table))
        start, step, name = self.index_range
        if positions is not None:
            df.index = pd.Index(start + positions * step, name=name)
        elif self.range_index:
            df.index = pd.RangeIndex(start + block.start * step, start + (block.start + len(df)) * step, step,
                                     name=name)
        return df


    def _widen(self, df: Any) -> Any:
        """``df`` with the whole frame's dtypes, whichever rows it holds (decision 0016)."""
        wanted = {c: t for c, t in (self.widened or {}).items() if c in df.columns and df[c].dtype != t}
        return df.astype(wanted) if wanted else df


def _meta(d: dict, reader: BlockReader, schema: pa.Schema | None, range_index: bool, index_name: Any = None) -> Any:
    import pandas as pd

    if schema is not None:
        meta = frames.to_pandas(frames.empty_table(schema))
    else:
        meta = ReadBlock(reader, False)(row_blocks(d)[0]).iloc[:0]
    if range_index:
        meta.index = pd.RangeIndex(0, 0, name=index_name)
    return meta


def from_partitioned(obj: Any, *, columns: Sequence[str] | None = None, schema: pa.Schema | None = None) -> Any:
    """Any conforming object as a dask DataFrame: one task per row block."""
    import dask.dataframe as dd

    d = protocol.validate(obj, require_pickle=True)
    if len(d["shape"]) != 2:
        raise protocol.PartitionedError(f"shape: a dask DataFrame needs 2-D data, got {d['shape']}")
    protocol.check_host_locations(d)
    blocks = row_blocks(d)
    groups = group_columns_of(schema, d["partition_tiling"][1]) if schema is not None else None
    reader = BlockReader(d["get"], None, groups, _worker_host)
    range_index = global_range_index(schema)
    view = getattr(obj, "view", None)
    whole = view is None or (getattr(view, "rows", None) is None and getattr(view, "filter", None) is None)
    # a row range or a filter of the rows reads as positions, as to_pandas() gives
    index_range = stored_range(schema, d["shape"][0]) if whole else (0, 1, None)
    meta = _meta(d, reader, schema, range_index, index_range[2])
    widened = _widened(obj, schema, meta)
    if widened:
        meta = meta.astype({c: t for c, t in widened.items() if c in meta.columns})
    _ensure_locality_plugin()
    divisions = divisions_for(blocks, *index_range[:2]) if range_index else None
    read = ReadBlock(reader, range_index, schema, widened=widened, index_range=index_range)
    if (PUSHDOWN_AVAILABLE and widened is not None and view is not None and whole and filters_reach_the_nodes(d)):
        ddf = _read_with_pushdown(read, blocks, meta, divisions)
    else:
        ddf = dd.from_map(read, blocks, meta=meta, divisions=divisions, label="flightpart-read", enforce_metadata=False)
    return ddf[list(columns)] if columns is not None else ddf


def _widened(obj: Any, schema: pa.Schema | None, meta: Any) -> dict[str, Any] | None:
    """The columns the dataset's statistics say hold a null and whose NumPy dtype in ``meta`` pandas widens
    where a null is, with the widened dtype (integer to float64, bool to object); None when the nulls are not
    known (decision 0016)."""
    plan = getattr(obj, "plan", None)
    if plan is None or schema is None:
        return None
    nullable: set[str] = set()
    for info in plan.parts.values():
        if info.stats is None:
            return None
        nullable |= {c for c, s in info.stats.items() if s.get("nulls") and c in schema.names}
    widened: dict[str, Any] = {}
    for c in sorted(nullable):
        if c not in meta.columns or not isinstance(meta[c].dtype, np.dtype):
            continue
        if meta[c].dtype.kind in "iu":
            widened[c] = np.dtype(np.float64)
        elif meta[c].dtype.kind == "b":
            widened[c] = np.dtype(object)
    return widened


def filters_reach_the_nodes(d: dict) -> bool:
    """Whether a pushed row filter can ride in the tickets: flightpart handles of one column group, unfiltered."""
    return (isinstance(d["get"], FlightGet) and d["partition_tiling"][1:] in ((), (1,))
            and all(isinstance(p["data"], PartitionRef) and p["data"].filter is None for p in d["partitions"].values()))


def _read_with_pushdown(read: ReadBlock, blocks: list[RowBlock], meta: Any, divisions: tuple | None) -> Any:
    """What ``dd.from_map`` builds, as a :class:`FlightpartRead` (accepts Dask's row filters)."""
    from dask.dataframe.dask_expr import new_collection
    from dask.dataframe.dask_expr._expr import ArrowStringConversion
    from dask.dataframe.utils import pyarrow_strings_enabled

    result = new_collection(FlightpartRead(read, [blocks], None, [], {}, False, meta, False, divisions,
                                           "flightpart-read"))
    return new_collection(ArrowStringConversion(result)) if pyarrow_strings_enabled() else result


def dask_graph(obj: Any, name: str = "flightpart") -> dict:
    """A raw graph ``{(name, i): (read, block)}`` per the Dask graph spec."""
    d = protocol.validate(obj, require_pickle=True)
    reader = BlockReader(d["get"], host_of_task=_worker_host)
    read = ReadBlock(reader, global_range_index(None))
    return {(name, b.index): (read, b) for b in row_blocks(d)}


# --------------------------------------------------------------------------- locality


def _refs_in(node: Any, depth: int = 0) -> list:
    """Every flightpart PartitionRef or RowBlock inside a task spec."""
    if depth > 12:
        return []
    if isinstance(node, (RowBlock, PartitionRef)):
        return [node]
    if isinstance(node, (list, tuple, set, frozenset)):
        return [r for item in node for r in _refs_in(item, depth + 1)]
    if isinstance(node, dict):
        return [r for item in node.values() for r in _refs_in(item, depth + 1)]
    found = []
    for attr in ("args", "kwargs", "value", "func"):
        if hasattr(node, attr) and type(node).__module__.startswith("dask"):
            found.extend(_refs_in(getattr(node, attr), depth + 1))
    return found


try:
    from distributed.diagnostics.plugin import SchedulerPlugin as _SchedulerPlugin
except Exception:  # pragma: no cover
    _SchedulerPlugin = object


class LocalityPlugin(_SchedulerPlugin):
    """Restricts tasks that read flightpart partitions to the partitions' hosts, loosely: with no worker on
    the host a task runs anywhere and streams."""

    name = "flightpart-locality"

    def update_graph(self, scheduler: Any, *, tasks: Sequence = (), **kwargs: Any) -> None:
        worker_hosts = {ws.host for ws in scheduler.workers.values()}
        for key in tasks:
            ts = scheduler.tasks.get(key)
            if ts is None or ts.run_spec is None or ts.state not in ("released", "waiting"):
                continue
            hosts = set()
            for ref in _refs_in(ts.run_spec):
                hosts.update(ref.hosts if isinstance(ref, RowBlock) else (r[1] for r in ref.replicas))
            hosts &= worker_hosts
            if hosts:
                ts.host_restrictions = set(hosts)
                ts.loose_restrictions = True


def _ensure_locality_plugin() -> None:
    try:
        from distributed import default_client
    except ImportError:
        return
    try:
        client = default_client()
    except ValueError:
        return  # no distributed cluster: the local scheduler has no hosts to choose
    if not client.run_on_scheduler(_has_plugin):
        client.register_plugin(LocalityPlugin())


def _has_plugin(dask_scheduler: Any = None) -> bool:
    return LocalityPlugin.name in dask_scheduler.plugins


# --------------------------------------------------------------------------- put


def owns(obj: Any) -> bool:
    """Whether ``obj`` is a Dask DataFrame (what ``client.put`` sends from the workers)."""
    return type(obj).__module__.startswith("dask.dataframe") and hasattr(obj, "npartitions")


def put(client: Any, name: str, ddf: Any, nodes: list[NodeRow],
        version: int) -> tuple[list[SentPart], list[tuple[str, NodeRow]]]:
    """Send every partition from the worker holding it to the node on its host; returns what each worker sent
    and the (worker, node) chosen per partition."""
    p = partitioned(ddf)
    dclient = p.futures[0].client if p.futures else None
    placement, tasks = [], []
    for k, (fut, holders) in enumerate(zip(p.futures, p.holders)):
        node = node_for([host_of(w) for w in holders], nodes, k)
        worker = next((w for w in holders if host_of(w) == node.ip), holders[0])
        placement.append((worker, node))
        tasks.append(dclient.submit(send_from_worker, fut, node.uri, client.access, name, version, (k, 0),
                                    client.grant_for(name, version), workers=[worker], allow_other_workers=False,
                                    pure=False))
    return (dclient.gather(tasks) if tasks else []), placement
