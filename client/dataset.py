"""``Dataset``: one version of a dataset as a user holds it.

A view (columns, a row range, a filter) over the catalog's partition grid. Views fetch only what they need:
slices and filters run where the data is (a node, or the local memory map), and row blocks whose statistics
rule a filter out are skipped before any stream opens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from flightpart import frames
from flightpart.errors import LimitExceeded, PartitionedError
from flightpart.io.allocator import keep_freed_memory
from flightpart.io.hosts import host_addresses
from flightpart.io.transfer import batches_of
from flightpart.kept import Kept
from flightpart.query import aggregates, filters
from flightpart.query import top as first_rows
from flightpart.query.filters import Filter
from flightpart.query.from_statistics import partial_from_statistics
from flightpart.query.functions import ROW_COUNT
from flightpart.wire import Aggregate, VersionInfo

from . import spmd as spmd_views
from .fetch import SPLIT_BYTES, FlightGet, split_rows
from .plan import Block, Plan
from .plugins import runtime
from .progress import Progress, reporter
from .spmd import HaloParts
from .view import View

COUNT = Aggregate((("", ROW_COUNT),), ())
READ_WINDOW = 128 << 20
"""Bytes a streamed read (``to_batches``, ``to_reader``, DuckDB, Polars, ``flightpart get``) holds ahead of its
consumer, at most (``window=`` changes it per read)."""
READS_IN_FLIGHT = 2
"""Threads a streamed read reads ahead on."""


AGGREGATE_SLICE = 256
"""Partitions whose partial aggregates are asked for at a time when ``aggregate(max_bytes=)`` bounds them (the bound
is checked after each slice: it may be passed by at most one slice's partials)."""
KEPT_TEXT_FILTERS = 64
"""Text filters a version's views keep compiled (:meth:`Dataset.filter`)."""


class _Taken:
    """Bytes of partial results taken in so far, against a bound (None: none)."""

    def __init__(self, most: int | None):
        self.most, self.bytes = most, 0

    def add(self, tables: list[pa.Table]) -> list[pa.Table]:
        self.bytes += sum(frames.size_of(t) for t in tables)
        if self.most is not None and self.bytes > self.most:
            raise LimitExceeded(f"aggregate: the partial results reached {self.bytes:,} bytes, more than max_bytes="
                                f"{self.most:,}; group by a key with fewer values, or read the rows", field="max_bytes")
        return tables


class Dataset:
    """A committed, immutable version of a dataset, or a view of it."""

    def __init__(self, version: VersionInfo, get: FlightGet, view: View | None = None, *, shared: dict | None = None):
        self.name = version.dataset
        self.version = version.version
        self._info = version
        self._get = get
        self._plan = Plan(version, view if view is not None else View(), shared)

    @classmethod
    def from_version(cls, v: VersionInfo, get: FlightGet) -> "Dataset":
        """The whole of one version as the catalog describes it."""
        return cls(v, get)

    @property
    def view(self) -> View:
        """What this dataset selects of its version, as one immutable value."""
        return self._plan.view

    @property
    def plan(self) -> Plan:
        """What this view reads, worked out from the version's metadata."""
        return self._plan

    def with_view(self, view: View) -> "Dataset":
        """The same version seen through ``view`` (shares the per-version pruner)."""
        return Dataset(self._info, self._get, view, shared=self._plan.shared)

    def _derive(self, **changes: Any) -> "Dataset":
        return self.with_view(self.view.replace(**changes))

    # ------------------------------------------------------------------ views

    @property
    def rank(self) -> int | None:
        """This process's rank in an SPMD view (``client.open(name, rank=r, nranks=n)``), else None."""
        return self.view.rank

    @property
    def nranks(self) -> int | None:
        """How many ranks share an SPMD view, else None."""
        return self.view.nranks

    def global_view(self) -> "Dataset":
        """This view as every rank sees it: without the SPMD rank and halos."""
        return self.with_view(self.view.replace(spmd=None, halo=None))

    def select(self, columns: Sequence[str]) -> "Dataset":
        """A view with only ``columns``; other column groups are never fetched."""
        names = self._plan.data_names()
        schema = self._info.schema
        data_cols = [n for n in schema.names if n in names]
        if isinstance(columns, str):
            columns = [columns]
        unknown = [c for c in columns if c not in data_cols]
        if unknown:
            raise KeyError(f"dataset {self.name!r} has no column {unknown[0]!r}; its columns are {data_cols}")
        index_cols = [c for c in schema.names if c not in data_cols]
        groups = frames.column_groups(data_cols, self._info.grid[1])
        chosen = {j: tuple([c for c in columns if c in group] + index_cols) for j, group in enumerate(groups)}
        chosen = {j: cols for j, cols in chosen.items() if len(cols) > len(index_cols)}
        return self._derive(columns=chosen, order=list(columns))

    def reading(self, columns: Sequence[str]) -> "Dataset":
        """A view that reads at least ``columns``, which may name pandas index columns (unlike :meth:`select`); index
        columns alone come with one data column."""
        data = self._plan.data_names()
        chosen = [c for c in columns if c in data]
        if not chosen and len(columns) > 0:
            chosen = [c for c in self.schema.names if c in data][:1]
        return self.select(chosen)

    def filter(self, expression: pc.Expression | str) -> "Dataset":
        """A view of the rows where ``expression`` is true (``pc.field("x") > 0``, or text like
        ``"x > 0 and y == 'a'"``).

        Nodes filter next to the data; local partitions are filtered on their map; row blocks ruled out by statistics
        are never asked for. The filter may read columns the view does not select. Filters compose (``and``); a row
        slice before a filter takes rows of the dataset, one after it rows of the result.
        """
        if self.view.matched is not None:
            raise PartitionedError("filter after a slice of a filtered view: filter first, then slice "
                                   "(ds.filter(a & b)[i:j]), or read the slice and filter it")
        if isinstance(expression, str) and self.view.filter is None:
            return self._derive(filter=self._text_filter(expression))
        if isinstance(expression, str):
            expression = filters.parse_where(expression, self._info.schema)
        if self.view.filter is not None:
            expression = self.view.filter.expression & expression
        return self._derive(filter=Filter.compile(expression, self._info.schema))

    def _text_filter(self, text: str) -> Filter:
        """``text`` as a filter over this version, kept for the version's views (the last :data:`KEPT_TEXT_FILTERS`
        texts of at most 8 KiB): a service asked the same query again parses it once."""
        kept = self._plan.shared.get("text filters")
        if kept is None:
            kept = self._plan.shared.setdefault("text filters", Kept(KEPT_TEXT_FILTERS))
        found = kept.get(text)
        if found is None:
            found = Filter.compile(filters.parse_where(text, self._info.schema), self._info.schema, translated=True)
            if len(text) <= 8 << 10:
                kept.put(text, found)
        return found

    def __getitem__(self, key: slice) -> "Dataset":
        if isinstance(key, str) or (isinstance(key, (list, tuple)) and key and all(isinstance(k, str) for k in key)):
            names = [key] if isinstance(key, str) else list(key)
            raise TypeError(f"ds[{key!r}]: a dataset is indexed by rows (ds[a:b]); for columns use "
                            f"ds.select({names!r}), or ds.to_pandas()[{key!r}] once it is read")
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("datasets slice rows with ds[a:b] (step 1)")
        lo, hi, _ = key.indices(self.shape[0])
        view = self.view
        if view.filter is not None:
            base = view.matched[0] if view.matched else 0
            return self._derive(matched=(base + lo, base + max(lo, hi)))
        base = view.rows[0] if view.rows else 0
        return self._derive(rows=(base + lo, base + max(lo, hi)))

    def head(self, n: int = 5) -> pa.Table:
        """The first ``n`` rows of the view (``self[:n]``): the nodes send only those rows."""
        if n < 0:
            raise ValueError(f"head: n must be >= 0, got {n}")
        return self[:n].to_arrow()

    def spmd(self, rank: int | None, nranks: int | None, *, halo: tuple[int, int] | None = None,
             periodic: bool = False) -> "Dataset":
        """The SPMD view of rank ``rank``: ``locals`` set, others' data ``None``. ``halo=(left, right)`` adds that many
        neighbouring rows around each local partition (:meth:`parts_of`); ``periodic`` wraps them."""
        rank, nranks = spmd_views.check_rank(rank, nranks)
        return self._derive(spmd=(rank, nranks), halo=spmd_views.halo_of(self, halo, periodic))

    def parts_of(self) -> dict[tuple[int, int], HaloParts]:
        """SPMD: each local partition as the Dist RFC's three parts (left halo, local data, right halo).

        Halos are row slices of the neighbouring row blocks in the same column group, shorter at the ends unless the
        view is periodic, reaching further blocks when wider than a neighbour; empty without ``halo=``.
        """
        return spmd_views.parts_of(self)

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, columns); a filtered view's rows are counted on the nodes (or from statistics)."""
        view = self.view
        if view.filter is not None:
            rows = sum(b.size or 0 for b in self._blocks(counted=True))
        else:
            rows = view.rows[1] - view.rows[0] if view.rows else self._info.shape[0]
        return (rows, self._plan.width())

    def count_rows(self, filter: pc.Expression | str | None = None) -> int:
        """Rows of the view (where ``filter`` is true): from statistics when they decide, else counted on the nodes."""
        return (self if filter is None else self.filter(filter)).shape[0]

    @property
    def schema(self) -> pa.Schema:
        return self._plan.schema()

    @property
    def nbytes(self) -> int:
        """Bytes of the stored partitions this view covers: exact for whole partitions, in proportion to the rows and
        columns taken of a part."""
        view = self.view
        if view.columns is None and view.rows is None and view.filter is None:
            return self._info.nbytes
        return sum(self.partition_nbytes().values())

    def partition_nbytes(self) -> dict[tuple[int, int], int]:
        """Bytes of each partition of this view, by view position (see :attr:`nbytes`)."""
        _grid, cells = self._cells()
        out = {}
        for c in cells:
            rows, cols = c.info.shape
            share = (c.shape[0] / rows if rows else 1.0) * (c.shape[1] / cols if cols else 1.0)
            out[c.position] = round(c.info.nbytes * share)
        return out

    @property
    def partition_tiling(self) -> tuple[int, int]:
        return self._cells()[0]

    # ------------------------------------------------------------------ planning (the arithmetic is in plan.py)

    def _blocks(self, *, counted: bool) -> list[Block]:
        return self._plan.blocks(self._count, counted=counted)

    def _cells(self) -> tuple[tuple[int, int], list]:
        return self._plan.cells(self._count)

    def _count(self, blocks: list[Block]) -> dict[int, int]:
        """Rows the filter keeps in each block, counted where the data is."""
        f = self.view.filter
        assert f is not None
        j = self._plan.group_with(f.columns)
        if j is None:  # the filter reads several column groups: read its columns, filtered here
            view = self._reading(f.columns)
            return {b.i: view._read_block(replace(b, matched=None)).num_rows for b in blocks}
        refs = [self._plan.ref(b, j, None, aggregate=COUNT) for b in blocks]
        return {b.i: int(t.column("p0")[0].as_py()) if t.num_rows else 0 for b, t in zip(blocks, self._get(refs))}

    def _reading(self, columns: Sequence[str]) -> "Dataset":
        """This view narrowed to ``columns`` (index columns along; with none named, one column to count on)."""
        names = self._plan.data_names()
        return self.select([c for c in columns if c in names] or [next(c for c in self.schema.names if c in names)])

    # ------------------------------------------------------------------ protocol

    @property
    def __partitioned__(self) -> dict:
        if not self._plan.pushable():
            raise PartitionedError(
                f"filter {self.view.filter.expression} reads columns of another "  # type: ignore[union-attr]
                "column group than the ones this view reads, so no partition can be filtered on its own: to_arrow(), "
                "to_batches() and aggregate() work; for __partitioned__ (Dask, Ray), select the filter's columns too "
                "or put the dataset with one column group")
        grid, cells = self._cells()
        local = None
        if self.view.spmd is not None:
            rank, nranks = self.view.spmd
            local = [c.position for c in cells if c.position[0] % nranks == rank]
        locations: dict[tuple, list] = {}
        parts = {}
        for c in cells:
            loc = locations.setdefault(c.info.replicas, [(ip, pid) for _uri, ip, pid in c.info.replicas])
            parts[c.position] = {
                "start": c.start,
                "shape": c.shape,
                "data": c.ref if local is None or c.position in local else None,
                "location": loc,
            }
        rows = sum(c.shape[0] for c in cells if c.position[1] == 0)
        d = {"shape": (rows, self.shape[1]), "partition_tiling": grid, "partitions": parts, "get": self._get}
        if local is not None:
            d["locals"] = local
        return d

    # ------------------------------------------------------------------ reads

    def _check_readable(self) -> None:
        """A view that can be read whole (not another rank's SPMD view)."""
        if self.view.spmd is None:
            return
        d = self.__partitioned__
        missing = [p for p in sorted(d["partitions"]) if d["partitions"][p]["data"] is None]
        if missing:
            raise PartitionedError(
                f"partitions[{missing[0]}]: not local to rank {self.view.spmd[0]}; an SPMD view reads its locals only "
                "(use read_locals(), or open the dataset without rank=)"
            )

    def _in_order(self, table: pa.Table) -> pa.Table:
        order = self.view.order
        if order is None:
            return table
        return table.select(list(order) + [c for c in table.column_names if c not in order])

    def _assembled(self, parts: dict[tuple[int, int], pa.Table], grid: tuple[int, int]) -> pa.Table:
        """The view's rows from its partitions' tables, its columns in its order."""
        table = frames.assemble(parts, grid)
        if table.column_names != self.schema.names:
            table = table.select(self.schema.names)
        return self._in_order(table)

    def _read_block(self, b: Block) -> pa.Table:
        """One row block of the view as a table (filtered on the nodes, or here when it spans groups)."""
        groups = self._plan.groups()
        if self._plan.pushable():
            tables = self._get_split([(b, j) for j in groups])
            return self._assembled({(0, k): t for k, t in enumerate(tables)}, (1, len(tables)))
        wanted = set(self.view.filter.columns)
        reads = [j for j in range(self._info.grid[1]) if j in groups or wanted & self._plan.stored(j)]
        refs = []
        for j in reads:
            base = list(self._plan.columns_of(j) or sorted(self._plan.stored(j))) if j in groups else []
            extra = [c for c in self._info.schema.names if c in self._plan.stored(j)
                     and (c in wanted or c not in self._plan.data_names())]
            refs.append(self._plan.ref(replace(b, matched=None), j, tuple(dict.fromkeys(base + extra)), pushed=False))
        tables = self._get(refs)
        table = filters.apply(frames.assemble({(0, k): t for k, t in enumerate(tables)}, (1, len(tables))),
                              self.view.filter.substrait)
        if b.matched is not None:
            table = table.slice(b.matched[0], b.matched[1] - b.matched[0])
        return self._in_order(table.select(self.schema.names))

    def _get_split(self, cells: list[tuple[Block, int]]) -> list[pa.Table]:
        """Tables of row blocks ``(b, j)``; with ``streams_per_partition`` above 1, a remote partition of at least
        :data:`~flightpart.client.fetch.SPLIT_BYTES` is read as that many row ranges in parallel, over its replicas."""
        streams = getattr(self._get, "streams_per_partition", 1)
        refs = [self._plan.ref(b, j, self._plan.columns_of(j)) for b, j in cells]
        if streams <= 1 or self.view.filter is not None:
            return self._get(refs)
        here = host_addresses(self._get.host)
        pieces = []
        for (b, j), ref in zip(cells, refs):
            rows = b.rows or (0, self._plan.parts[(b.i, j)].shape[0])
            info = self._plan.parts[(b.i, j)]
            nbytes = info.nbytes * (rows[1] - rows[0]) / max(info.shape[0], 1)
            local = any(ip in here for _uri, ip, _pid in ref.replicas)
            pieces.append([ref] if local else split_rows(ref, rows, min(streams, int(nbytes // SPLIT_BYTES))))
        tables = self._get([r for group in pieces for r in group])
        out, k = [], 0
        for group in pieces:
            part = tables[k:k + len(group)]
            k += len(group)
            out.append(part[0] if len(part) == 1 else pa.concat_tables(part))
        return out

    def to_arrow(self, *, progress: Progress | Any | None = None) -> pa.Table:
        """The whole view as one table: local parts mapped, others streamed in parallel. ``progress``: see
        :mod:`flightpart.client.progress`."""
        self._check_readable()
        if progress is not None:
            tables = list(self._row_blocks(READS_IN_FLIGHT, None, progress))
            return pa.concat_tables(tables) if tables else self._in_order(frames.empty_table(self.schema))
        if not self._plan.pushable():
            tables = [self._read_block(b) for b in self._blocks(counted=False)]
            return pa.concat_tables(tables) if tables else self._in_order(frames.empty_table(self.schema))
        blocks = self._blocks(counted=self.view.matched is not None)
        if not blocks:
            return self._in_order(frames.empty_table(self.schema))
        groups = self._plan.groups()
        tables = self._get_split([(b, j) for b in blocks for j in groups])
        q = len(groups)
        parts = {(k // q, k % q): t for k, t in enumerate(tables)}
        return self._assembled(parts, (len(blocks), q))

    def _row_blocks(self, prefetch: int, window: int | None,
                    progress: Progress | Any | None = None) -> Iterator[pa.Table]:
        """The view's rows in order, as ranges of about a quarter of ``window`` bytes, read ahead on ``prefetch``
        threads while what they hold stays within ``window`` (None: no bound; at least one range)."""
        self._check_readable()
        if window is not None:
            keep_freed_memory(declined="the first read streams under a window")
        blocks = self._blocks(counted=self.view.matched is not None)
        plan = self._plan
        pieces = [p for b in blocks for p in plan.pieces(b, window // 4)] if window else blocks
        sizes = [plan.estimated_bytes(p) for p in pieces]
        known = self.view.filter is None  # a filtered view's bytes are known once read
        report = reporter(progress, sum(sizes) if known else 0)

        def read(k: int) -> pa.Table:
            table = self._read_block(pieces[k])
            if report is not None:  # in the units of the total, so a bar ends at 100 %
                report.add(sizes[k] if known else table.get_total_buffer_size())
            return table

        if prefetch < 1:
            yield from (read(k) for k in range(len(pieces)))
            return
        pending: deque = deque()
        ahead = following = 0
        with ThreadPoolExecutor(max_workers=prefetch, thread_name_prefix="flightpart-prefetch") as pool:

            def admit() -> None:
                nonlocal ahead, following
                while following < len(pieces) and (not pending or window is None or ahead + sizes[following] <= window):
                    pending.append((sizes[following], pool.submit(read, following)))
                    ahead += sizes[following]
                    following += 1

            admit()
            while pending:
                size, future = pending.popleft()
                table = future.result()
                ahead -= size
                admit()  # the next reads start before this one is consumed
                yield table

    def to_batches(self, *, prefetch: int = READS_IN_FLIGHT, window: int = READ_WINDOW,
                   progress: Progress | Any | None = None) -> Iterator[pa.RecordBatch]:
        """The view's record batches in partition order, in bounded memory: local partitions mapped, remote ones read
        ahead as ranges while held bytes stay within ``window`` (default :data:`READ_WINDOW`), so the reader grows by at
        most the window plus the range being consumed. ``progress`` as in :meth:`to_arrow`."""
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"window: expected a positive number of bytes, got {window!r}")
        last, any_rows = None, False
        for table in self._row_blocks(prefetch, window, progress):
            batches = table.to_batches()
            any_rows = any_rows or bool(batches)
            yield from batches
            last = table
        if not any_rows and last is not None:  # no rows: one batch of none, carrying dictionaries (their categories)
            yield from batches_of(last)

    def to_reader(self, *, prefetch: int = READS_IN_FLIGHT, window: int = READ_WINDOW,
                  progress: Progress | Any | None = None) -> pa.RecordBatchReader:
        """A ``pyarrow.RecordBatchReader`` over :meth:`to_batches`; nothing is read until the first batch is asked
        for."""
        self._check_readable()
        schema = self._in_order(frames.empty_table(self.schema)).schema

        def batches() -> Iterator[pa.RecordBatch]:
            for batch in self.to_batches(prefetch=prefetch, window=window, progress=progress):
                if not batch.schema.equals(schema):
                    if batch.schema.names != schema.names:  # by name, never by position
                        batch = batch.select(schema.names)
                    batch = pa.RecordBatch.from_arrays(batch.columns, schema=schema)
                yield batch

        return pa.RecordBatchReader.from_batches(schema, batches())

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The Arrow PyCapsule stream interface: ``pa.table(ds)``, ``pl.DataFrame(ds)``, DuckDB's scans read a Dataset
        directly."""
        return self.to_reader().__arrow_c_stream__(requested_schema)

    def aggregate(self, aggregations: Sequence[tuple[str, str]], by: Sequence[str] | str = (),
                  computed: Mapping[str, str] | None = None, *, max_bytes: int | None = None) -> pa.Table:
        """``pyarrow``'s ``group_by(by).aggregate(aggregations)`` over the view, computed next to the data.

        Functions: sum, min, max, count, count_all, mean, exact_sum (integers summed as decimal128(38, 0), never
        wrapping). Nodes aggregate their partitions after the view's filter and the results combine here; columns are
        named as pyarrow names them. ``computed``: columns the nodes compute first from SQL expressions, by name
        (``{"cents": "fare * 100"}``), as DuckDB computes them, or InvalidExpression
        (:func:`flightpart.query.predicates.parse_sql_value`). ``max_bytes``: the most partial results taken in before
        LimitExceeded (None: no bound).
        """
        self._check_readable()
        schema = self.schema
        agg = aggregates.spec(aggregations, by, schema, computed)
        read = aggregates.columns_read(agg, schema)
        reads = read + list(self.view.filter.columns if self.view.filter else ())
        blocks = self._blocks(counted=self.view.matched is not None)
        j = self._plan.group_with(reads)
        taken = _Taken(max_bytes)
        if j is not None:
            expected, rows = aggregates.partial_schema(agg, self._info.schema), self._info.shape[0]
            known = [self._partial_from_statistics(b, agg, expected) for b in blocks]
            refs = [self._plan.ref(b, j, None, aggregate=agg) for b, t in zip(blocks, known) if t is None]
            step = AGGREGATE_SLICE if max_bytes is not None else max(len(refs), 1)
            partials = [t for t in known if t is not None] + [
                t for k in range(0, len(refs), step)
                for t in aggregates.checked_partials(taken.add(self._get(refs[k:k + step])), agg, expected, rows)]
        else:
            view = self._reading(read)
            partials = [t for b in blocks for t in taken.add([aggregates.partial(view._read_block(b), agg)])]
        return aggregates.combine(partials, agg, self._info.schema)

    def _partial_from_statistics(self, b: Block, agg: Aggregate, expected: pa.Schema) -> pa.Table | None:
        """Block ``b``'s partial of ``agg`` from its statistics, when they answer it
        (:mod:`flightpart.query.from_statistics`)."""
        kept = self._plan.kept_by_statistics(b)
        if kept is None:
            return None
        whole = b.rows is None
        return partial_from_statistics(agg, expected, kept, self._plan.rows_of(b),
                                       lambda column: self._plan.statistics_of(b, column) if whole else None)

    def top(self, limit: int, by: Any) -> pa.Table:
        """The view's first ``limit`` rows by ``by``, as ``to_arrow().sort_by(by)[:limit]`` gives them (ties in any
        order); each partition sends at most ``limit`` rows. ``by``: pyarrow's sort keys, one or a list."""
        want = first_rows.spec(limit, by, self.schema)
        return first_rows.first(self.top_candidates(limit, by), want)

    def top_candidates(self, limit: int, by: Any) -> pa.Table:
        """Each partition's first ``limit`` rows by ``by`` (and its NaN-keyed rows), computed on the nodes: they hold
        the view's first ``limit`` rows under pyarrow's and DuckDB's ordering alike."""
        self._check_readable()
        want = first_rows.spec(limit, by, self.schema)
        names = tuple(self.schema.names)
        blocks = self._blocks(counted=self.view.matched is not None)
        j = self._plan.group_with(list(names) + list(self.view.filter.columns if self.view.filter else ()))
        if j is not None:
            parts = self._get([self._plan.ref(b, j, names, top=want) for b in blocks]) if blocks else []
            return first_rows.checked_candidates(parts, self.schema)
        # the view spans column groups: each block is read whole and cut here
        parts = [first_rows.candidates(self._read_block(b), want) for b in blocks]
        return pa.concat_tables(parts) if parts else frames.empty_table(self.schema)

    def read_locals(self) -> dict[tuple[int, int], pa.Table]:
        """SPMD: this rank's partitions, by grid position."""
        d = self.__partitioned__
        positions = d.get("locals", sorted(d["partitions"]))
        return dict(zip(positions, self._get([d["partitions"][p]["data"] for p in positions])))

    def to_pandas(self) -> Any:
        return frames.to_pandas(self.to_arrow())

    def to_polars(self, *, lazy: bool = False) -> Any:
        """A Polars DataFrame, or with ``lazy=True`` a ``LazyFrame`` whose projections, predicates and limits reach the
        nodes."""
        if lazy:
            from .polars_source import lazy_frame

            return lazy_frame(self)
        frames.check_polars_reads(self.schema)  # before anything is read
        return frames.to_polars(self.to_arrow())

    def to_duckdb(self, connection: Any = None) -> Any:
        """A DuckDB relation over the view (on ``connection`` or DuckDB's default) reading, per query, only the columns
        it uses and the rows its pushed filters keep (:mod:`flightpart.client.duckdb_source`)."""
        import duckdb

        con = connection if connection is not None else duckdb.default_connection()
        return con.from_arrow(self.duckdb_scan())

    def duckdb_scan(self) -> Any:
        """This view as DuckDB's pushdown target (a ``pyarrow.dataset.Dataset`` for DuckDB only)."""
        from .duckdb_source import DuckDBScan

        return DuckDBScan(self)

    # ------------------------------------------------------------------ runtimes

    def to_dask(self) -> Any:
        """A dask DataFrame, one task per row block, reads placed on the partitions' hosts."""
        ddf = runtime("dask").from_partitioned(self,
                                               schema=self._info.schema if self.view.columns is None else self.schema)
        return ddf[list(self.view.order)] if self.view.order is not None else ddf

    def dask_graph(self, name: str | None = None) -> dict:
        """A raw Dask graph ``{(name, i): (read, block)}`` (the Dask graph spec)."""
        return runtime("dask").dask_graph(self, name or f"flightpart-{self.name}-v{self.version}")

    def to_ray(self) -> Any:
        """A ``ray.data.Dataset``, each block read on the Ray node of its partition's host."""
        return runtime("ray").from_partitioned(self,
                                               schema=self._info.schema if self.view.columns is None else self.schema)

    def as_partitioned(self, frames: str = "arrow", location: str = "spec", ip_of: Any = None, *,
                       one_per_rank: bool = False, categories: dict[str, list] | None = None,
                       codes: bool = False) -> Any:
        """This view's ``__partitioned__`` (:class:`~flightpart.client.views.PartitionedView`).

        ``frames``: ``"arrow"``, ``"pandas"`` or ``"numpy"``; ``location``: ``"spec"``, ``"ip"`` (mapped by ``ip_of``)
        or ``"rank"``. ``one_per_rank``: one partition per rank over all columns (as heat requires). ``categories``:
        text columns as pandas categoricals sharing one list of categories (``codes``: their integer codes).
        """
        from .views import PartitionedView

        return PartitionedView(self, frames, location, ip_of, one_per_rank=one_per_rank, categories=categories,
                               codes=codes)

    def distinct(self, column: str) -> list:
        """The distinct values of ``column``, sorted, computed on the nodes."""
        counted = self.aggregate([("", ROW_COUNT)], by=[column])
        return sorted(v for v in counted.column(column).to_pylist() if v is not None)

    def __distarray__(self, version: str = "0.10.0") -> dict:
        """SPMD view only: this rank's rows as a Distributed Array Protocol dict (``version`` 0.10.0 or 0.9.0)."""
        return spmd_views.distarray(self, version)

    def __repr__(self) -> str:
        if self.view.filter is not None:  # its shape is counted on the nodes: not something a repr should do
            return f"Dataset({self.name!r}, version={self.version}, filter={self.view.filter.expression})"
        return (f"Dataset({self.name!r}, version={self.version}, shape={self.shape}, "
                f"partition_tiling={self.partition_tiling})")
