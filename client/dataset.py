"""``Dataset``: one version of a dataset as a user holds it.

It is a view (all of it, a column projection, a row range, a filter) over
the catalog's partition grid. Views fetch only the partitions and rows they
need: slices and filters are applied on the node that holds the data (or on
the local memory map), and a filter skips the row blocks whose statistics
say it cannot match before any stream opens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from flightpart import frames
from flightpart.errors import PartitionedError
from flightpart.io.hosts import host_addresses
from flightpart.query import aggregates, filters
from flightpart.query.filters import Filter
from flightpart.query.pruning import Pruner
from flightpart.tiling import halo_sources
from flightpart.wire import Aggregate, PartInfo, VersionInfo

from .fetch import SPLIT_BYTES, FlightGet, PartitionRef, split_rows
from .plugins import runtime
from .view import View

COUNT = Aggregate((("", "count_all"),), ())


@dataclass(frozen=True)
class Halo:
    """Rows each local partition of an SPMD view comes with: ``left`` before, ``right`` after, wrapping if periodic."""

    left: int
    right: int
    periodic: bool


class HaloParts(NamedTuple):
    """The Dist RFC's parts of one local partition: left halo, locally owned rows, right halo."""

    left: pa.Table
    local: pa.Table
    right: pa.Table


@dataclass(frozen=True)
class _Block:
    """One row block of a view: which stored row block, which of its rows, how many the view gets."""

    i: int
    rows: tuple[int, int] | None  # rows of the partition, before the filter (None: all)
    size: int | None  # rows this block gives the view (None: not counted yet)
    matched: tuple[int, int] | None = None  # the range of the filter's rows it gives (None: all)


class Dataset:
    """A committed, immutable version of a dataset, or a view of it."""

    def __init__(self, name: str, version: int, schema: pa.Schema, shape: tuple[int, int], grid: tuple[int, int],
                 parts: Sequence[PartInfo], nbytes: int, get: FlightGet, *, columns: dict[int, tuple[str, ...]] | None = None,
                 rows: tuple[int, int] | None = None, spmd: tuple[int, int] | None = None,
                 order: Sequence[str] | None = None, filter: Filter | None = None, matched: tuple[int, int] | None = None,
                 shared: dict | None = None, halo: Halo | None = None):
        self.name = name
        self.version = version
        self._schema = schema
        self._shape = shape
        self._grid = grid
        self._parts = parts if isinstance(parts, dict) else {p.position: p for p in parts}
        self._nbytes = nbytes
        self._get = get
        self._columns = columns  # column group -> selected columns (None: all)
        self._rows = rows  # rows of the dataset, before the filter
        self._spmd = spmd
        self._order = list(order) if order is not None else None  # the user's column order after select()
        self._filter = filter
        self._matched = matched  # a range of the rows the filter keeps
        self._shared = shared if shared is not None else {}  # per version: the pruner
        self._sized: list[_Block] | None = None
        self._halo = halo  # SPMD views: the neighbour rows each local partition comes with

    @classmethod
    def from_version(cls, v: VersionInfo, get: FlightGet) -> "Dataset":
        """The whole of one version as the catalog describes it."""
        return cls(v.dataset, v.version, v.schema, v.shape, v.grid, v.parts, v.nbytes, get)

    @property
    def view(self) -> View:
        """What this dataset selects of its version, as one immutable value."""
        order = tuple(self._order) if self._order is not None else None
        return View(columns=self._columns, rows=self._rows, spmd=self._spmd, order=order, filter=self._filter,
                    matched=self._matched, halo=self._halo)

    def with_view(self, view: View) -> "Dataset":
        """The same version seen through ``view`` (shares the per-version pruner)."""
        return Dataset(self.name, self.version, self._schema, self._shape, self._grid, self._parts, self._nbytes,
                       self._get, columns=view.columns, rows=view.rows, spmd=view.spmd, order=view.order,
                       filter=view.filter, matched=view.matched, shared=self._shared, halo=view.halo)

    def _derive(self, **changes: Any) -> "Dataset":
        return self.with_view(self.view.replace(**changes))

    # ------------------------------------------------------------------ views

    @property
    def rank(self) -> int | None:
        """This process's rank in an SPMD view (``client.open(name, rank=r, nranks=n)``), else None."""
        return self._spmd[0] if self._spmd is not None else None

    @property
    def nranks(self) -> int | None:
        """How many ranks share an SPMD view, else None."""
        return self._spmd[1] if self._spmd is not None else None

    def global_view(self) -> "Dataset":
        """This view (its columns, rows and filter) as every rank sees it: without the SPMD rank and halos."""
        return self.with_view(self.view.replace(spmd=None, halo=None))

    def select(self, columns: Sequence[str]) -> "Dataset":
        """A view with only ``columns``; other column groups are never fetched."""
        names = self._data_names()
        data_cols = [n for n in self._schema.names if n in names]
        if isinstance(columns, str):
            columns = [columns]
        unknown = [c for c in columns if c not in data_cols]
        if unknown:
            raise KeyError(f"dataset {self.name!r} has no column {unknown[0]!r}; its columns are {data_cols}")
        index_cols = [c for c in self._schema.names if c not in data_cols]
        groups = frames.column_groups(data_cols, self._grid[1])
        chosen = {j: tuple([c for c in columns if c in group] + index_cols) for j, group in enumerate(groups)}
        chosen = {j: cols for j, cols in chosen.items() if len(cols) > len(index_cols)}
        return self._derive(columns=chosen, order=list(columns))

    def filter(self, expression: pc.Expression | str) -> "Dataset":
        """A view of the rows where ``expression`` is true (``pc.field("x") > 0``, or text like ``"x > 0 and y == 'a'"``).

        Nodes evaluate the filter next to the data and send only matching
        rows; partitions on this host are filtered on their memory map; row
        blocks whose statistics rule the filter out are never asked for.
        The filter may read columns the view does not select. Filters
        compose (``and``); a row slice before a filter takes rows of the
        dataset, a slice after it takes rows of the result.
        """
        if self._matched is not None:
            raise PartitionedError("filter after a slice of a filtered view: filter first, then slice "
                                   "(ds.filter(a & b)[i:j]), or read the slice and filter it")
        if isinstance(expression, str):
            expression = filters.parse_where(expression, self._schema)
        if self._filter is not None:
            expression = self._filter.expression & expression
        return self._derive(filter=Filter.compile(expression, self._schema))

    def __getitem__(self, key: slice) -> "Dataset":
        if isinstance(key, str) or (isinstance(key, (list, tuple)) and key and all(isinstance(k, str) for k in key)):
            names = [key] if isinstance(key, str) else list(key)
            raise TypeError(f"ds[{key!r}]: a dataset is indexed by rows (ds[a:b]); for columns use ds.select({names!r}), "
                            f"or ds.to_pandas()[{key!r}] once it is read")
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("datasets slice rows with ds[a:b] (step 1)")
        lo, hi, _ = key.indices(self.shape[0])
        if self._filter is not None:
            base = self._matched[0] if self._matched else 0
            return self._derive(matched=(base + lo, base + max(lo, hi)))
        base = self._rows[0] if self._rows else 0
        return self._derive(rows=(base + lo, base + max(lo, hi)))

    def head(self, n: int = 5) -> pa.Table:
        """The first ``n`` rows of the view: ``self[:n]``, so the nodes send those rows and no others (reading
        whole row blocks and cutting them here moved hundreds of megabytes for five rows)."""
        if n < 0:
            raise ValueError(f"head: n must be >= 0, got {n}")
        return self[:n].to_arrow()

    def spmd(self, rank: int, nranks: int, *, halo: tuple[int, int] | None = None, periodic: bool = False) -> "Dataset":
        """The SPMD view of rank ``rank``: ``locals`` set, others' data ``None``.

        With ``halo=(left, right)`` each local partition comes with ``left``
        rows before it and ``right`` rows after it from its neighbours, as
        the Dist RFC defines halos (:meth:`parts_of`); ``periodic`` wraps
        them around the first and last rows.
        """
        if not (isinstance(rank, int) and isinstance(nranks, int) and 0 <= rank < nranks):
            raise ValueError(f"rank must be in [0, nranks), got rank={rank!r}, nranks={nranks!r}")
        if halo is not None:
            widths = tuple(halo)
            if len(widths) != 2 or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in widths):
                raise ValueError(f"halo must be (left, right) rows, integers >= 0, got {halo!r}")
            if self._rows is not None or self._filter is not None:
                raise PartitionedError("halos are rows of the stored grid's neighbours: open the dataset with halo= "
                                       "before slicing or filtering it")
            if max(widths) > self._shape[0]:
                raise ValueError(f"halo {widths}: wider than the dataset's {self._shape[0]} rows")
            halo = Halo(widths[0], widths[1], bool(periodic))
        return self._derive(spmd=(rank, nranks), halo=halo)

    def parts_of(self) -> dict[tuple[int, int], HaloParts]:
        """SPMD: each local partition as the Dist RFC's three parts (left halo, local data, right halo).

        The halo rows are row slices of the neighbouring row blocks in the
        same column group (fetched with sliced tickets: a neighbour on this
        host is mapped, not streamed). At the first and last rows a halo is
        shorter unless the view is periodic; a halo wider than its
        neighbour reaches further ones. Without ``halo=`` the halos are
        empty.
        """
        if self._spmd is None:
            raise PartitionedError("parts_of needs the SPMD view: client.open(name, rank=r, nranks=n, halo=(left, right))")
        if self._rows is not None or self._filter is not None:
            raise PartitionedError("parts_of works on the stored grid: slice or filter the parts it returns instead")
        d = self.__partitioned__
        halo = self._halo or Halo(0, 0, False)
        sizes = [self._parts[(i, 0)].shape[0] for i in range(self._grid[0])]
        sources = halo_sources(sizes, halo.left, halo.right, periodic=halo.periodic)
        refs, layout = [], []
        for pos in d["locals"]:
            i, vj = pos
            j = self._groups()[vj]
            sides = {"left": [], "right": []}
            for piece in sources[i]:
                sides[piece.side].append(len(refs))
                refs.append(self._ref(_Block(piece.owner, (piece.start, piece.stop), None), j, self._columns_of(j)))
            sides["local"] = [len(refs)]
            refs.append(d["partitions"][pos]["data"])
            layout.append((pos, sides))
        tables = self._get(refs)
        out = {}
        for pos, sides in layout:
            parts = [self._joined([tables[k] for k in sides[side]], tables[sides["local"][0]].schema)
                     for side in ("left", "local", "right")]
            out[pos] = HaloParts(*parts)
        return out

    @staticmethod
    def _joined(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
        return pa.concat_tables(tables) if tables else schema.empty_table()

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, columns); the rows of a filtered view are counted on the nodes (from statistics where they tell)."""
        if self._filter is not None:
            rows = sum(b.size or 0 for b in self._blocks(counted=True))
        else:
            rows = self._rows[1] - self._rows[0] if self._rows else self._shape[0]
        cols = sum(1 for cols in self._columns.values() for c in cols if c in self._data_names()) if self._columns is not None else self._shape[1]
        return (rows, cols)

    def count_rows(self, filter: pc.Expression | str | None = None) -> int:
        """Rows of the view (where ``filter`` is true): from statistics when they decide, else counted on the nodes."""
        return (self if filter is None else self.filter(filter)).shape[0]

    def _data_names(self) -> set[str]:
        meta = self._schema.pandas_metadata or {}
        stored = {c for c in meta.get("index_columns", []) if isinstance(c, str)}
        return {n for n in self._schema.names if n not in stored}

    @property
    def schema(self) -> pa.Schema:
        if self._columns is None:
            return self._schema
        keep = [n for cols in self._columns.values() for n in cols]
        return pa.schema([self._schema.field(n) for n in dict.fromkeys(keep)], metadata=self._schema.metadata)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored partitions this view covers: exact for whole partitions (their file sizes),
        in proportion to the rows and columns taken for a part of one."""
        if self._columns is None and self._rows is None and self._filter is None:
            return self._nbytes
        return sum(self.partition_nbytes().values())

    def partition_nbytes(self) -> dict[tuple[int, int], int]:
        """Bytes of each partition of this view, by view position (see :attr:`nbytes`)."""
        _grid, cells = self._view_grid()
        out = {}
        for pos, info, _start, shape, _ref in cells:
            share = (shape[0] / info.shape[0] if info.shape[0] else 1.0) * (shape[1] / info.shape[1] if info.shape[1] else 1.0)
            out[pos] = round(info.nbytes * share)
        return out

    @property
    def partition_tiling(self) -> tuple[int, int]:
        return self._view_grid()[0]

    # ------------------------------------------------------------------ planning

    def _groups(self) -> list[int]:
        """The column groups this view reads."""
        return sorted(self._columns) if self._columns is not None else list(range(self._grid[1]))

    def _stored(self, j: int) -> set[str]:
        """The columns partitions of column group ``j`` hold (pandas index columns are in every group)."""
        stored = self._shared.get("stored")
        if stored is None:  # once per version, shared by its views
            names = self._data_names()
            data_cols = [n for n in self._schema.names if n in names]
            index = set(self._schema.names) - names
            stored = self._shared["stored"] = [set(g) | index for g in frames.column_groups(data_cols, self._grid[1])]
        return stored[j]

    def _group_with(self, columns: Sequence[str]) -> int | None:
        """A column group that holds every one of ``columns`` (a node can then work on one partition alone)."""
        return next((j for j in range(self._grid[1]) if set(columns) <= self._stored(j)), None)

    def _pushable(self) -> bool:
        """Whether each partition the view reads can apply the filter itself."""
        return self._filter is None or all(set(self._filter.columns) <= self._stored(j) for j in self._groups())

    def _pruner(self) -> Pruner:
        pruner = self._shared.get("pruner")
        if pruner is None:
            p, q = self._grid
            blocks = {i: (self._parts[(i, 0)].shape[0], [self._parts[(i, j)].stats for j in range(q)]) for i in range(p)}
            pruner = self._shared["pruner"] = Pruner(self._schema, blocks)
        return pruner

    def _base_blocks(self) -> list[_Block]:
        out = []
        for i in range(self._grid[0]):
            info = self._parts[(i, 0)]
            s0, n = info.start[0], info.shape[0]
            if self._rows is None:
                out.append(_Block(i, None, n))
                continue
            lo, hi = max(self._rows[0], s0), min(self._rows[1], s0 + n)
            if lo < hi:
                out.append(_Block(i, (lo - s0, hi - s0), hi - lo))
        return out

    def _blocks(self, *, counted: bool) -> list[_Block]:
        """The row blocks the view reads, in order; with ``counted``, each with the rows it gives."""
        blocks = self._base_blocks()
        if self._filter is None:
            return blocks
        if self._sized is not None:
            return self._sized
        pruner = self._pruner()
        expression = self._filter.expression
        dead = pruner.cannot_match(expression)
        blocks = [replace(b, size=None) for b in blocks if b.i not in dead]
        if not counted and self._matched is None:
            return blocks
        everything = pruner.all_match(expression)
        counts = self._count([b for b in blocks if b.i not in everything])
        sized = [replace(b, size=counts.get(b.i, self._rows_of(b))) for b in blocks]
        if self._matched is not None:
            lo, hi = self._matched
            narrowed, seen = [], 0
            for b in sized:
                a, z = max(lo - seen, 0), min(hi - seen, b.size or 0)
                seen += b.size or 0
                if a < z:
                    narrowed.append(replace(b, size=z - a, matched=(a, z)))
            sized = narrowed
        self._sized = [b for b in sized if b.size]
        return self._sized

    def _rows_of(self, b: _Block) -> int:
        return b.rows[1] - b.rows[0] if b.rows is not None else self._parts[(b.i, 0)].shape[0]

    def _count(self, blocks: list[_Block]) -> dict[int, int]:
        """Rows the filter keeps in each block, counted where the data is (one small reply per block)."""
        assert self._filter is not None
        j = self._group_with(self._filter.columns)
        if j is None:  # the filter reads several column groups: read its columns, filtered here
            view = self._reading(self._filter.columns)
            return {b.i: view._read_block(replace(b, matched=None)).num_rows for b in blocks}
        refs = [self._ref(b, j, None, aggregate=COUNT) for b in blocks]
        return {b.i: int(t.column("p0")[0].as_py()) if t.num_rows else 0 for b, t in zip(blocks, self._get(refs))}

    def _reading(self, columns: Sequence[str]) -> "Dataset":
        """This view narrowed to ``columns`` (index columns come along; with none named, one column to count rows on)."""
        names = self._data_names()
        return self.select([c for c in columns if c in names] or [next(c for c in self.schema.names if c in names)])

    def _ref(self, b: _Block, j: int, columns: tuple[str, ...] | None, *, pushed: bool = True,
             aggregate: Aggregate | None = None) -> PartitionRef:
        """The handle of partition (b.i, j) for this block; ``pushed``: the node applies the view's filter."""
        info = self._parts[(b.i, j)]
        f = self._filter.substrait if (pushed and self._filter is not None) else None
        return PartitionRef(self.name, self.version, info.position, info.replicas, columns, b.rows, f,
                            b.matched if f is not None else None, aggregate)

    def _columns_of(self, j: int) -> tuple[str, ...] | None:
        return self._columns[j] if self._columns is not None else None

    def _view_grid(self) -> tuple[tuple[int, int], list]:
        """(grid, [(view position, original PartInfo, start, shape, handle)])."""
        groups = self._groups()
        widths = [self._group_width(j) for j in groups]
        blocks = self._blocks(counted=True) or [_Block(0, (0, 0), 0)]
        cells = []
        row_start = 0
        for vi, b in enumerate(blocks):
            col_start = 0
            size = b.size if b.size is not None else self._rows_of(b)
            for vj, (j, width) in enumerate(zip(groups, widths)):
                cells.append(((vi, vj), self._parts[(b.i, j)], (row_start, col_start), (size, width),
                              self._ref(b, j, self._columns_of(j))))
                col_start += width
            row_start += size
        return (len(blocks), len(groups)), cells

    def _group_width(self, j: int) -> int:
        if self._columns is None:
            return self._parts[(0, j)].shape[1]
        names = self._data_names()
        return sum(1 for c in self._columns[j] if c in names)

    # ------------------------------------------------------------------ protocol

    @property
    def __partitioned__(self) -> dict:
        if not self._pushable():
            raise PartitionedError(
                f"filter {self._filter.expression} reads columns of another column group than the ones this view reads, "  # type: ignore[union-attr]
                "so no partition can be filtered on its own: to_arrow(), to_batches() and aggregate() work; for "
                "__partitioned__ (Dask, Ray), select the filter's columns too or put the dataset with one column group")
        grid, cells = self._view_grid()
        local = None
        if self._spmd is not None:
            rank, nranks = self._spmd
            local = [pos for pos, *_ in cells if pos[0] % nranks == rank]
        locations: dict[tuple, list] = {}
        parts = {}
        for pos, info, start, shape, ref in cells:
            loc = locations.setdefault(info.replicas, [(ip, pid) for _uri, ip, pid in info.replicas])
            parts[pos] = {
                "start": start,
                "shape": shape,
                "data": ref if local is None or pos in local else None,
                "location": loc,
            }
        rows = sum(shape[0] for pos, _info, _start, shape, _ref in cells if pos[1] == 0)
        d = {"shape": (rows, self.shape[1]), "partition_tiling": grid, "partitions": parts, "get": self._get}
        if local is not None:
            d["locals"] = local
        return d

    # ------------------------------------------------------------------ reads

    def _check_readable(self) -> None:
        """A view that can be read whole (not another rank's SPMD view)."""
        if self._spmd is None:
            return
        d = self.__partitioned__
        missing = [p for p in sorted(d["partitions"]) if d["partitions"][p]["data"] is None]
        if missing:
            raise PartitionedError(
                f"partitions[{missing[0]}]: not local to rank {self._spmd[0]}; an SPMD view reads its locals only "
                "(use read_locals(), or open the dataset without rank=)"
            )

    def _in_order(self, table: pa.Table) -> pa.Table:
        if self._order is None:
            return table
        return table.select(self._order + [c for c in table.column_names if c not in self._order])

    def _read_block(self, b: _Block) -> pa.Table:
        """One row block of the view as a table (the filter applied on the nodes, or here when it spans groups)."""
        groups = self._groups()
        if self._pushable():
            tables = self._get_split([(b, j) for j in groups])
            return self._in_order(frames.assemble({(0, k): t for k, t in enumerate(tables)}, (1, len(tables))))
        wanted = set(self._filter.columns)
        reads = [j for j in range(self._grid[1]) if j in groups or wanted & self._stored(j)]
        refs = []
        for j in reads:
            base = list(self._columns_of(j) or sorted(self._stored(j))) if j in groups else []
            extra = [c for c in self._schema.names if c in self._stored(j) and (c in wanted or c not in self._data_names())]
            refs.append(self._ref(replace(b, matched=None), j, tuple(dict.fromkeys(base + extra)), pushed=False))
        tables = self._get(refs)
        table = filters.apply(frames.assemble({(0, k): t for k, t in enumerate(tables)}, (1, len(tables))), self._filter.substrait)
        if b.matched is not None:
            table = table.slice(b.matched[0], b.matched[1] - b.matched[0])
        return self._in_order(table.select(self.schema.names))

    def _get_split(self, cells: list[tuple[_Block, int]]) -> list[pa.Table]:
        """Tables of row blocks ``(b, j)``, a large remote one read as row ranges over several streams at once.

        With ``streams_per_partition`` above 1 (see :func:`flightpart.connect`),
        a partition of at least :data:`~flightpart.client.fetch.SPLIT_BYTES`
        that no replica holds on this host is read as up to that many row
        ranges in parallel, each from the next replica in turn.
        """
        streams = getattr(self._get, "streams_per_partition", 1)
        refs = [self._ref(b, j, self._columns_of(j)) for b, j in cells]
        if streams <= 1 or self._filter is not None:
            return self._get(refs)
        here = host_addresses(self._get.host)
        pieces = []
        for (b, j), ref in zip(cells, refs):
            rows = b.rows or (0, self._parts[(b.i, j)].shape[0])
            info = self._parts[(b.i, j)]
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

    def to_arrow(self) -> pa.Table:
        """The whole view as one table: local parts mapped, others streamed (in parallel)."""
        self._check_readable()
        if not self._pushable():
            tables = [self._read_block(b) for b in self._blocks(counted=False)]
            return pa.concat_tables(tables) if tables else self._in_order(self.schema.empty_table())
        blocks = self._blocks(counted=self._matched is not None)
        if not blocks:
            return self._in_order(self.schema.empty_table())
        groups = self._groups()
        tables = self._get_split([(b, j) for b in blocks for j in groups])
        q = len(groups)
        parts = {(k // q, k % q): t for k, t in enumerate(tables)}
        return self._in_order(frames.assemble(parts, (len(blocks), q)))

    def _row_blocks(self, prefetch: int) -> Iterator[pa.Table]:
        """Each row block as a table, in order; the next ``prefetch`` blocks are read ahead, no more."""
        self._check_readable()
        blocks = self._blocks(counted=self._matched is not None)
        if prefetch < 1:
            for b in blocks:
                yield self._read_block(b)
            return
        with ThreadPoolExecutor(max_workers=prefetch, thread_name_prefix="flightpart-prefetch") as pool:
            pending = deque(pool.submit(self._read_block, b) for b in blocks[:prefetch])
            following = len(pending)
            while pending:
                table = pending.popleft().result()
                if following < len(blocks):
                    pending.append(pool.submit(self._read_block, blocks[following]))
                    following += 1
                yield table

    def to_batches(self, *, prefetch: int = 2) -> Iterator[pa.RecordBatch]:
        """The view's record batches in partition order, holding only a few partitions at a time.

        Partitions on this host are mapped zero-copy; remote ones are streamed
        ``prefetch`` row blocks ahead of the one being consumed, so memory is
        bounded by that window, not by the dataset.
        """
        for table in self._row_blocks(prefetch):
            yield from table.to_batches()

    def to_reader(self, *, prefetch: int = 2) -> pa.RecordBatchReader:
        """A ``pyarrow.RecordBatchReader`` over :meth:`to_batches` (what DuckDB, Polars and ``pa.table`` consume).

        Nothing is read until the first batch is asked for: a consumer that
        only looks at the schema (DuckDB binding a query) costs no transfer.
        """
        self._check_readable()
        schema = self._in_order(self.schema.empty_table()).schema

        def batches() -> Iterator[pa.RecordBatch]:
            for batch in self.to_batches(prefetch=prefetch):
                yield batch if batch.schema.equals(schema) else pa.RecordBatch.from_arrays(batch.columns, schema=schema)

        return pa.RecordBatchReader.from_batches(schema, batches())

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The Arrow PyCapsule stream interface: ``pa.table(ds)``, ``pl.DataFrame(ds)``, DuckDB's scans read a Dataset directly."""
        return self.to_reader().__arrow_c_stream__(requested_schema)

    def aggregate(self, aggregations: Sequence[tuple[str, str]], by: Sequence[str] | str = ()) -> pa.Table:
        """``pyarrow``'s ``group_by(by).aggregate(aggregations)`` over the view, computed next to the data.

        Functions: sum, min, max, count, count_all (column ignored), mean.
        Each node aggregates its partitions (after the view's filter) and
        sends a few rows; the results are combined here. Columns named as
        pyarrow names them: ``{column}_{function}``, ``count_all``.
        """
        self._check_readable()
        agg = aggregates.spec(aggregations, by, self.schema.names)
        reads = aggregates.columns_read(agg) + list(self._filter.columns if self._filter else ())
        blocks = self._blocks(counted=self._matched is not None)
        j = self._group_with(reads)
        if j is not None:
            partials = self._get([self._ref(b, j, None, aggregate=agg) for b in blocks]) if blocks else []
        else:
            view = self._reading(aggregates.columns_read(agg))
            partials = [aggregates.partial(view._read_block(b), agg) for b in blocks]
        return aggregates.combine(partials, agg, self._schema)

    def read_locals(self) -> dict[tuple[int, int], pa.Table]:
        """SPMD: this rank's partitions, by grid position."""
        d = self.__partitioned__
        positions = d.get("locals", sorted(d["partitions"]))
        return dict(zip(positions, self._get([d["partitions"][p]["data"] for p in positions])))

    def to_pandas(self) -> Any:
        return frames.to_pandas(self.to_arrow())

    def to_polars(self, *, lazy: bool = False) -> Any:
        """A Polars DataFrame, or with ``lazy=True`` a ``LazyFrame`` whose projections, predicates and row
        limits reach the nodes (Polars' IO-plugin interface)."""
        if lazy:
            from .polars_source import lazy_frame

            return lazy_frame(self)
        return frames.to_polars(self.to_arrow())

    def to_duckdb(self, connection: Any = None) -> Any:
        """A DuckDB relation over the view (on ``connection``, or DuckDB's default one) that reads, for each query,
        only the columns it uses and, where DuckDB pushes them, only the rows its filters keep (comparisons with
        constants, IS NULL, BETWEEN; see :mod:`flightpart.client.duckdb_source`). It can be queried again and
        again; ``con.register("name", ds.duckdb_scan())`` gives SQL the same under a name."""
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
        ddf = runtime("dask").from_partitioned(self, schema=self._schema if self._columns is None else self.schema)
        return ddf[self._order] if self._order is not None else ddf

    def dask_graph(self, name: str | None = None) -> dict:
        """A raw Dask graph ``{(name, i): (read, block)}`` (the Dask graph spec)."""
        return runtime("dask").dask_graph(self, name or f"flightpart-{self.name}-v{self.version}")

    def to_ray(self) -> Any:
        """A ``ray.data.Dataset``, each block read on the Ray node of its partition's host."""
        return runtime("ray").from_partitioned(self, schema=self._schema if self._columns is None else self.schema)

    def as_partitioned(self, frames: str = "arrow", location: str = "spec", ip_of: Any = None, *,
                       one_per_rank: bool = False, categories: dict[str, list] | None = None, codes: bool = False) -> Any:
        """This view's ``__partitioned__`` in the form a consumer expects (:class:`~flightpart.client.views.PartitionedView`).

        ``frames``: what ``get`` returns, ``"arrow"``, ``"pandas"`` or
        ``"numpy"``; ``location``: ``"spec"``, ``"ip"`` (IP strings, mapped by
        ``ip_of``) or ``"rank"`` (SPMD views: the owner rank). With
        ``one_per_rank=True`` (SPMD views, ``location="rank"``) the grid is
        regrouped into one partition per rank over all columns, as heat's
        ``from_partitioned`` requires. ``categories`` (pandas) makes those
        text columns categoricals with one list of categories for every
        part (with ``codes``, their integer codes). For xgboost_ray:
        ``fp.ray.for_consumers(ds)``.
        """
        from .views import PartitionedView

        return PartitionedView(self, frames, location, ip_of, one_per_rank=one_per_rank, categories=categories,
                               codes=codes)

    def distinct(self, column: str) -> list:
        """The distinct values of ``column``, sorted, computed on the nodes (a grouped count per partition)."""
        counted = self.aggregate([("", "count_all")], by=[column])
        return sorted(v for v in counted.column(column).to_pylist() if v is not None)

    def __distarray__(self, version: str = "0.10.0") -> dict:
        """SPMD view only: this rank's rows as a Distributed Array Protocol dict (``version`` 0.10.0 or 0.9.0)."""
        from flightpart.distarray import export_local

        if self._spmd is None:
            raise PartitionedError("__distarray__ needs the SPMD view: client.open(name, rank=r, nranks=n)")
        d = self.__partitioned__
        blocks = sorted({pos[0] for pos in d["locals"]})
        if blocks and blocks != list(range(blocks[0], blocks[-1] + 1)):
            raise PartitionedError(f"rank {self._spmd[0]} holds row blocks {blocks}, which are not contiguous; "
                                   "__distarray__ describes one block per rank")
        halos = self.parts_of() if self._halo is not None else None
        local = {pos: p.local for pos, p in halos.items()} if halos is not None else self.read_locals()
        padding, periodic = (0, 0), False
        if blocks:
            q = d["partition_tiling"][1]

            def row(i: int, side: str = "local") -> pa.Table:
                tables = {(0, j): getattr(halos[(i, j)], side) if side != "local" else local[(i, j)] for j in range(q)}
                return frames.assemble(tables, (1, q))

            rows = [row(i) for i in blocks]
            if halos is not None:
                left, right = row(blocks[0], "left"), row(blocks[-1], "right")
                periodic = self._halo.periodic and ((blocks[0] == 0 and left.num_rows > 0)
                                                    or (blocks[-1] == self._grid[0] - 1 and right.num_rows > 0))
                if periodic and not version.startswith("0.9."):
                    raise PartitionedError(f"rank {self._spmd[0]}'s periodic halo wraps around the first or last row, which "
                                           "DAP 0.10 cannot describe (its start and stop include the padding); ask for "
                                           "__distarray__(version='0.9.0'), or read the halos with parts_of()")
                rows = [left, *rows, right]
                padding = (left.num_rows, right.num_rows)
            table = pa.concat_tables(rows) if len(rows) > 1 else rows[0]
            start = d["partitions"][(blocks[0], 0)]["start"][0]
        else:
            table = self.schema.empty_table()
            start = self.shape[0]
        return export_local(table, rank=self._spmd[0], nranks=self._spmd[1], start=start, global_rows=self.shape[0],
                            padding=padding, periodic=periodic, version=version)

    def __repr__(self) -> str:
        if self._filter is not None:  # its shape is counted on the nodes: not something a repr should do
            return f"Dataset({self.name!r}, version={self.version}, filter={self._filter.expression})"
        return f"Dataset({self.name!r}, version={self.version}, shape={self.shape}, partition_tiling={self.partition_tiling})"
