"""``Dataset``: one version of a dataset as a user holds it.

It is a view (all of it, a column projection, a row range) over the
catalog's partition grid. Views fetch only the partitions and rows they
need, sliced on the server.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from flightpart import frames
from flightpart.errors import PartitionedError
from flightpart.wire import PartInfo, VersionInfo

from .fetch import FlightGet, PartitionRef
from .plugins import runtime


class Dataset:
    """A committed, immutable version of a dataset, or a view of it."""

    def __init__(self, name: str, version: int, schema: pa.Schema, shape: tuple[int, int], grid: tuple[int, int],
                 parts: Sequence[PartInfo], nbytes: int, get: FlightGet, *, columns: dict[int, tuple[str, ...]] | None = None,
                 rows: tuple[int, int] | None = None, spmd: tuple[int, int] | None = None,
                 order: Sequence[str] | None = None):
        self.name = name
        self.version = version
        self._schema = schema
        self._shape = shape
        self._grid = grid
        self._parts = {p.position: p for p in parts}
        self._nbytes = nbytes
        self._get = get
        self._columns = columns  # column group -> selected columns (None: all)
        self._rows = rows
        self._spmd = spmd
        self._order = list(order) if order is not None else None  # the user's column order after select()

    @classmethod
    def from_version(cls, v: VersionInfo, get: FlightGet) -> "Dataset":
        """The whole of one version as the catalog describes it."""
        return cls(v.dataset, v.version, v.schema, v.shape, v.grid, v.parts, v.nbytes, get)

    def _derive(self, **changes: Any) -> "Dataset":
        kwargs = {"columns": self._columns, "rows": self._rows, "spmd": self._spmd, "order": self._order, **changes}
        return Dataset(self.name, self.version, self._schema, self._shape, self._grid, list(self._parts.values()),
                       self._nbytes, self._get, **kwargs)

    # ------------------------------------------------------------------ views

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

    def __getitem__(self, key: slice) -> "Dataset":
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("datasets slice rows with ds[a:b] (step 1)")
        lo, hi, _ = key.indices(self.shape[0])
        base = self._rows[0] if self._rows else 0
        return self._derive(rows=(base + lo, base + max(lo, hi)))

    def spmd(self, rank: int, nranks: int) -> "Dataset":
        """The SPMD view of rank ``rank``: ``locals`` set, others' data ``None``."""
        if not (isinstance(rank, int) and isinstance(nranks, int) and 0 <= rank < nranks):
            raise ValueError(f"rank must be in [0, nranks), got rank={rank!r}, nranks={nranks!r}")
        return self._derive(spmd=(rank, nranks))

    # ------------------------------------------------------------------ shape

    @property
    def shape(self) -> tuple[int, int]:
        rows = self._rows[1] - self._rows[0] if self._rows else self._shape[0]
        cols = sum(1 for cols in self._columns.values() for c in cols if c in self._data_names()) if self._columns is not None else self._shape[1]
        return (rows, cols)

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
        if self._columns is None and self._rows is None:
            return self._nbytes
        return sum(self.partition_nbytes().values())

    def partition_nbytes(self) -> dict[tuple[int, int], int]:
        """Bytes of each partition of this view, by view position (see :attr:`nbytes`)."""
        _grid, cells = self._view_grid()
        out = {}
        for pos, info, _start, shape, _cols, _rows in cells:
            share = (shape[0] / info.shape[0] if info.shape[0] else 1.0) * (shape[1] / info.shape[1] if info.shape[1] else 1.0)
            out[pos] = round(info.nbytes * share)
        return out

    @property
    def partition_tiling(self) -> tuple[int, int]:
        return self._view_grid()[0]

    # ------------------------------------------------------------------ protocol

    def _view_grid(self):
        """(grid, [(view position, original PartInfo, start, shape, columns, rows)])."""
        col_groups = sorted(self._columns) if self._columns is not None else list(range(self._grid[1]))
        starts_j = {}
        col_start = 0
        for j in col_groups:
            width = self._group_width(j)
            starts_j[j] = (col_start, width)
            col_start += width
        row_blocks = []
        for i in range(self._grid[0]):
            info = self._parts[(i, 0)]
            s0, n = info.start[0], info.shape[0]
            if self._rows is None:
                row_blocks.append((i, s0, n, None))
                continue
            lo, hi = max(self._rows[0], s0), min(self._rows[1], s0 + n)
            if lo < hi:
                row_blocks.append((i, lo - self._rows[0], hi - lo, (lo - s0, hi - s0)))
        if not row_blocks:  # an empty slice still has one (empty) block
            row_blocks = [(0, 0, 0, (0, 0))]
        cells = []
        for vi, (i, rstart, rn, rows) in enumerate(row_blocks):
            for vj, j in enumerate(col_groups):
                cstart, width = starts_j[j]
                cols = self._columns[j] if self._columns is not None else None
                cells.append(((vi, vj), self._parts[(i, j)], (rstart, cstart), (rn, width), cols, rows))
        return (len(row_blocks), len(col_groups)), cells

    def _group_width(self, j: int) -> int:
        if self._columns is None:
            return self._parts[(0, j)].shape[1]
        names = self._data_names()
        return sum(1 for c in self._columns[j] if c in names)

    @property
    def __partitioned__(self) -> dict:
        grid, cells = self._view_grid()
        local = None
        if self._spmd is not None:
            rank, nranks = self._spmd
            local = [pos for pos, *_ in cells if pos[0] % nranks == rank]
        locations: dict[tuple, list] = {}
        parts = {}
        for pos, info, start, shape, cols, rows in cells:
            loc = locations.setdefault(info.replicas, [(ip, pid) for _uri, ip, pid in info.replicas])
            ref = PartitionRef(self.name, self.version, info.position, info.replicas, cols, rows)
            parts[pos] = {
                "start": start,
                "shape": shape,
                "data": ref if local is None or pos in local else None,
                "location": loc,
            }
        d = {"shape": self.shape, "partition_tiling": grid, "partitions": parts, "get": self._get}
        if local is not None:
            d["locals"] = local
        return d

    # ------------------------------------------------------------------ reads

    def _readable(self) -> dict:
        """The ``__partitioned__`` of a view that can be read whole (not another rank's SPMD view)."""
        d = self.__partitioned__
        missing = [p for p in sorted(d["partitions"]) if d["partitions"][p]["data"] is None]
        if missing:
            raise PartitionedError(
                f"partitions[{missing[0]}]: not local to rank {self._spmd[0]}; an SPMD view reads its locals only "
                "(use read_locals(), or open the dataset without rank=)"
            )
        return d

    def _in_order(self, table: pa.Table) -> pa.Table:
        if self._order is None:
            return table
        return table.select(self._order + [c for c in table.column_names if c not in self._order])

    def to_arrow(self) -> pa.Table:
        """The whole view as one table: local parts mapped, others streamed."""
        d = self._readable()
        positions = sorted(d["partitions"])
        tables = self._get([d["partitions"][p]["data"] for p in positions])
        return self._in_order(frames.assemble(dict(zip(positions, tables)), d["partition_tiling"]))

    def _row_blocks(self, prefetch: int) -> Iterator[pa.Table]:
        """Each row block as a table, in order; the next ``prefetch`` blocks are read ahead, no more."""
        d = self._readable()
        p, q = d["partition_tiling"]
        handles = [[d["partitions"][(i, j)]["data"] for j in range(q)] for i in range(p)]

        def read(i: int) -> pa.Table:
            return self._in_order(frames.assemble({(0, j): t for j, t in enumerate(self._get(handles[i]))}, (1, q)))

        if prefetch < 1:
            for i in range(p):
                yield read(i)
            return
        with ThreadPoolExecutor(max_workers=prefetch, thread_name_prefix="flightpart-prefetch") as pool:
            pending = deque(pool.submit(read, i) for i in range(min(prefetch, p)))
            following = len(pending)
            while pending:
                table = pending.popleft().result()
                if following < p:
                    pending.append(pool.submit(read, following))
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
        self._readable()
        schema = self._in_order(self.schema.empty_table()).schema

        def batches() -> Iterator[pa.RecordBatch]:
            for batch in self.to_batches(prefetch=prefetch):
                yield batch if batch.schema.equals(schema) else pa.RecordBatch.from_arrays(batch.columns, schema=schema)

        return pa.RecordBatchReader.from_batches(schema, batches())

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The Arrow PyCapsule stream interface: ``pa.table(ds)``, ``pl.DataFrame(ds)``, DuckDB's scans read a Dataset directly."""
        return self.to_reader().__arrow_c_stream__(requested_schema)

    def read_locals(self) -> dict[tuple[int, int], pa.Table]:
        """SPMD: this rank's partitions, by grid position."""
        d = self.__partitioned__
        positions = d.get("locals", sorted(d["partitions"]))
        return dict(zip(positions, self._get([d["partitions"][p]["data"] for p in positions])))

    def to_pandas(self) -> Any:
        return frames.to_pandas(self.to_arrow())

    def to_polars(self) -> Any:
        return frames.to_polars(self.to_arrow())

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

    def __distarray__(self) -> dict:
        """SPMD view only: this rank's rows as a Distributed Array Protocol dict."""
        from flightpart.distarray import export_local

        if self._spmd is None:
            raise PartitionedError("__distarray__ needs the SPMD view: client.open(name, rank=r, nranks=n)")
        d = self.__partitioned__
        blocks = sorted({pos[0] for pos in d["locals"]})
        if blocks and blocks != list(range(blocks[0], blocks[-1] + 1)):
            raise PartitionedError(f"rank {self._spmd[0]} holds row blocks {blocks}, which are not contiguous; "
                                   "__distarray__ describes one block per rank")
        local = self.read_locals()
        if blocks:
            q = d["partition_tiling"][1]
            rows = [frames.assemble({(0, j): local[(i, j)] for j in range(q)}, (1, q)) for i in blocks]
            table = pa.concat_tables(rows) if len(rows) > 1 else rows[0]
            start = d["partitions"][(blocks[0], 0)]["start"][0]
        else:
            table = self.schema.empty_table()
            start = self.shape[0]
        return export_local(table, rank=self._spmd[0], nranks=self._spmd[1], start=start, global_rows=self.shape[0])

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, version={self.version}, shape={self.shape}, partition_tiling={self.partition_tiling})"
