"""What a view of one version reads, worked out without the network: column groups, row blocks, partition handles.

A :class:`Plan` is arithmetic on one version's metadata and statistics seen through a
:class:`~flightpart.client.view.View`; the one thing it cannot answer alone, the rows a filter keeps where
statistics do not say, it asks the ``count`` function it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from flightpart import frames
from flightpart.query.filters import Filter
from flightpart.query.pruning import Pruner
from flightpart.wire import Aggregate, PartInfo, Ticket, TopRows, VersionInfo

from .fetch import PartitionRef
from .view import View


@dataclass(frozen=True)
class Block:
    """One row block of a view: which stored row block, which of its rows, how many the view gets."""

    i: int
    rows: tuple[int, int] | None  # rows of the partition, before the filter (None: all)
    size: int | None  # rows this block gives the view (None: not counted yet)
    matched: tuple[int, int] | None = None  # the range of the filter's rows it gives (None: all)


@dataclass(frozen=True)
class Cell:
    """One partition of a view's grid: its view position, stored partition, start, shape and handle."""

    position: tuple[int, int]
    info: PartInfo
    start: tuple[int, int]
    shape: tuple[int, int]
    ref: PartitionRef


KEPT_FILTERS = 64
"""A version's views keep which blocks each of at most this many filters wholly matches."""

Count = Callable[[list[Block]], dict[int, int]]
"""Rows a filter keeps in each of the given blocks, by stored row block (asked only where statistics do not say)."""


class Plan:
    """One version seen through one view. ``shared`` (per version, across views): partitions by position, the pruner,
    each group's stored columns. A filtered view's row counts are kept once asked."""

    def __init__(self, version: VersionInfo, view: View, shared: dict | None = None):
        self.version = version
        self.view = view
        self.shared = shared if shared is not None else {}
        if "parts" not in self.shared:
            self.shared["parts"] = {p.position: p for p in version.parts}
        self.parts: Mapping[tuple[int, int], PartInfo] = self.shared["parts"]
        self._sized: list[Block] | None = None

    @property
    def grid(self) -> tuple[int, int]:
        return self.version.grid

    # ------------------------------------------------------------------ columns

    def data_names(self) -> set[str]:
        """The data columns (not the pandas index columns every group stores)."""
        schema = self.version.schema
        meta = schema.pandas_metadata or {}
        stored = {c for c in meta.get("index_columns", []) if isinstance(c, str)}
        return {n for n in schema.names if n not in stored}

    def groups(self) -> list[int]:
        """The column groups this view reads."""
        columns = self.view.columns
        return sorted(columns) if columns is not None else list(range(self.grid[1]))

    def stored(self, j: int) -> set[str]:
        """The columns partitions of column group ``j`` hold (pandas index columns are in every group)."""
        stored = self.shared.get("stored")
        if stored is None:  # once per version, shared by its views
            schema = self.version.schema
            names = self.data_names()
            data_cols = [n for n in schema.names if n in names]
            index = set(schema.names) - names
            stored = self.shared["stored"] = [set(g) | index for g in frames.column_groups(data_cols, self.grid[1])]
        return stored[j]

    def group_with(self, columns: Sequence[str]) -> int | None:
        """A column group that holds every one of ``columns``."""
        return next((j for j in range(self.grid[1]) if set(columns) <= self.stored(j)), None)

    def pushable(self) -> bool:
        """Whether each partition the view reads can apply the filter itself."""
        f = self.view.filter
        return f is None or all(set(f.columns) <= self.stored(j) for j in self.groups())

    def columns_of(self, j: int) -> tuple[str, ...] | None:
        """The columns the view selects of column group ``j`` (None: all of them)."""
        return self.view.columns[j] if self.view.columns is not None else None

    def schema(self) -> pa.Schema:
        """The view's schema: the selected columns in stored order."""
        schema = self.version.schema
        if self.view.columns is None:
            return schema
        keep = [n for cols in self.view.columns.values() for n in cols]
        return pa.schema([schema.field(n) for n in dict.fromkeys(keep)], metadata=schema.metadata)

    def width(self) -> int:
        """How many data columns the view has."""
        if self.view.columns is None:
            return self.version.shape[1]
        names = self.data_names()
        return sum(1 for cols in self.view.columns.values() for c in cols if c in names)

    def group_width(self, j: int) -> int:
        if self.view.columns is None:
            return self.parts[(0, j)].shape[1]
        names = self.data_names()
        return sum(1 for c in self.view.columns[j] if c in names)

    # ------------------------------------------------------------------ rows

    def pruner(self) -> Pruner:
        pruner = self.shared.get("pruner")
        if pruner is None:
            p, q = self.grid
            blocks = {i: (self.parts[(i, 0)].shape[0], [_decoded(self.parts[(i, j)].stats) for j in range(q)])
                      for i in range(p)}
            pruner = self.shared["pruner"] = Pruner(self.version.schema, blocks)
        return pruner

    def kept_by_statistics(self, b: Block) -> int | None:
        """The rows of block ``b`` the view keeps, when known without asking a node: all of them without a filter or
        where statistics say every row matches, the column's nulls for ``column IS NULL``, the others for
        ``IS NOT NULL`` (None: not known)."""
        f = self.view.filter
        if f is None and b.matched is None:
            return self.rows_of(b)
        if f is None or b.matched is not None:
            return None
        if b.i in self.everything_matched(f):
            return self.rows_of(b)
        if len(f.columns) == 1 and b.rows is None:
            column = f.columns[0]
            entry = self.statistics_of(b, column)
            nulls = entry.get("nulls") if entry is not None else None
            if isinstance(nulls, int) and 0 <= nulls <= self.rows_of(b):
                if f.expression.equals(pc.field(column).is_null()):
                    return nulls
                if f.expression.equals(pc.field(column).is_valid()) or f.expression.equals(~pc.field(column).is_null()):
                    return self.rows_of(b) - nulls
        return None

    def everything_matched(self, f: Filter) -> set[int]:
        """The row blocks whose every row ``f`` keeps, by statistics; kept per filter for the version's views (at most
        :data:`KEPT_FILTERS` filters)."""
        kept = self.shared.setdefault("everything matched", {})
        found = kept.get(f.substrait)
        if found is None:
            if len(kept) >= KEPT_FILTERS:
                kept.clear()
            found = kept[f.substrait] = self.pruner().all_match(f.expression)
        return found

    def statistics_of(self, b: Block, column: str) -> dict | None:
        """What the statistics of block ``b``'s partition holding ``column`` say of it (None: nothing known, or a
        column whose nulls are not its validity's, :func:`_nulls_are_validity`)."""
        if column not in self.version.schema.names \
                or not _nulls_are_validity(self.version.schema.field(column).type):
            return None
        j = self.group_with([column])
        stats = _decoded(self.parts[(b.i, j)].stats) if j is not None else None
        entry = stats.get(column) if stats is not None else None
        return entry if isinstance(entry, dict) else None

    def base_blocks(self) -> list[Block]:
        """The row blocks the view's row range meets, before any filter."""
        rows = self.view.rows
        out = []
        for i in range(self.grid[0]):
            info = self.parts[(i, 0)]
            s0, n = info.start[0], info.shape[0]
            if rows is None:
                out.append(Block(i, None, n))
                continue
            lo, hi = max(rows[0], s0), min(rows[1], s0 + n)
            if lo < hi:
                out.append(Block(i, (lo - s0, hi - s0), hi - lo))
        return out

    def rows_of(self, b: Block) -> int:
        """The rows of block ``b`` before the filter."""
        return b.rows[1] - b.rows[0] if b.rows is not None else self.parts[(b.i, 0)].shape[0]

    def blocks(self, count: Count, *, counted: bool) -> list[Block]:
        """The row blocks the view reads, in order; with ``counted``, each with the rows it gives. Blocks ruled out by
        statistics are dropped, those statistics size (:meth:`kept_by_statistics`) sized without asking, the rest
        counted; a slice of a filtered view then narrows them."""
        blocks = self.base_blocks()
        f = self.view.filter
        if f is None:
            return blocks
        if self._sized is not None:
            return self._sized
        pruner = self.pruner()
        dead = pruner.cannot_match(f.expression)
        blocks = [replace(b, size=None) for b in blocks if b.i not in dead]
        if not counted and self.view.matched is None:
            return blocks
        known = {b.i: n for b in blocks for n in [self.kept_by_statistics(b)] if n is not None}
        counts = {**count([b for b in blocks if b.i not in known]), **known}
        sized = [replace(b, size=counts.get(b.i, self.rows_of(b))) for b in blocks]
        if self.view.matched is not None:
            sized = narrowed(sized, self.view.matched)
        self._sized = [b for b in sized if b.size]
        return self._sized

    def estimated_bytes(self, b: Block) -> int:
        """About how many bytes reading block ``b`` moves: stored bytes in proportion to the rows and columns it
        takes."""
        total = 0
        for j in self.groups():
            info = self.parts[(b.i, j)]
            n = info.shape[0]
            if not n:
                part = info.nbytes
            elif b.size is not None and self.view.filter is not None:
                part = info.nbytes * b.size // n
            else:  # floors of the running share, so consecutive row ranges add up to the partition exactly
                lo, hi = b.rows if b.rows is not None else (0, n)
                part = info.nbytes * hi // n - info.nbytes * lo // n
            columns = self.columns_of(j)
            if columns is not None:
                part = part * min(len(columns), len(self.stored(j))) // max(1, len(self.stored(j)))
            total += part
        return total

    def pieces(self, b: Block, target: int) -> list[Block]:
        """Block ``b`` as consecutive row ranges of about ``target`` bytes, in order (a block narrowed by a filtered
        slice stays whole)."""
        rows = self.rows_of(b)
        count = -(-self.estimated_bytes(b) // max(1, target))
        if b.matched is not None or count <= 1 or rows <= 1:
            return [b]
        count = min(count, rows)
        lo = b.rows[0] if b.rows is not None else 0
        cuts = [lo + rows * k // count for k in range(count + 1)]
        sized = self.view.filter is None
        return [Block(b.i, (cuts[k], cuts[k + 1]), cuts[k + 1] - cuts[k] if sized else None) for k in range(count)]

    # ------------------------------------------------------------------ handles

    def ref(self, b: Block, j: int, columns: tuple[str, ...] | None, *, pushed: bool = True,
            aggregate: Aggregate | None = None, top: TopRows | None = None) -> PartitionRef:
        """The handle of partition (b.i, j) for this block; ``pushed``: the node applies the view's filter."""
        info = self.parts[(b.i, j)]
        f = self.view.filter.substrait if (pushed and self.view.filter is not None) else None
        stored = 0 if self.sent_unlike_stored() else max(info.nbytes, 1)
        whole = b.rows is None and f is None and aggregate is None and top is None
        asked = Ticket(self.version.dataset, self.version.version, info.position, columns, b.rows, f,
                       b.matched if f is not None else None, aggregate, top=top)
        return PartitionRef(asked, info.replicas, shareable_bytes=stored if whole else 0,
                            expected_rows=self.rows_of(b), stored_bytes=stored)

    def sent_unlike_stored(self) -> bool:
        """Whether the version's rows may take more bytes in a stream than in their files (dictionary or view types):
        such partitions are read one per stream and not bounded by stored bytes."""
        found = self.shared.get("unlike stored")
        if found is None:
            found = self.shared["unlike stored"] = any(frames.sent_unlike_stored(f.type) for f in self.version.schema)
        return found

    def cells(self, count: Count) -> tuple[tuple[int, int], list[Cell]]:
        """The view's grid and its partitions, row block by row block."""
        groups = self.groups()
        widths = [self.group_width(j) for j in groups]
        blocks = self.blocks(count, counted=True) or [Block(0, (0, 0), 0)]
        cells = []
        row_start = 0
        for vi, b in enumerate(blocks):
            col_start = 0
            size = b.size if b.size is not None else self.rows_of(b)
            for vj, (j, width) in enumerate(zip(groups, widths)):
                cells.append(Cell((vi, vj), self.parts[(b.i, j)], (row_start, col_start), (size, width),
                                  self.ref(b, j, self.columns_of(j))))
                col_start += width
            row_start += size
        return (len(blocks), len(groups)), cells


def narrowed(blocks: list[Block], matched: tuple[int, int]) -> list[Block]:
    """Sized ``blocks`` cut to the rows ``[lo, hi)`` of their concatenation."""
    lo, hi = matched
    out, seen = [], 0
    for b in blocks:
        a, z = max(lo - seen, 0), min(hi - seen, b.size or 0)
        seen += b.size or 0
        if a < z:
            out.append(replace(b, size=z - a, matched=(a, z)))
    return out


def _nulls_are_validity(kind: pa.DataType) -> bool:
    """Whether a column's nulls (``IS NULL``, what ``count`` leaves out) are where the statistics counted them, its
    validity: not for a dictionary (a null may be a value), a union (its children hold the nulls) nor a run-end
    encoded column (its runs do)."""
    return not (pa.types.is_dictionary(kind) or pa.types.is_union(kind) or pa.types.is_run_end_encoded(kind))


def _decoded(stats: object) -> dict | None:
    """A partition's statistics decoded (anything else is nothing known)."""
    return stats if isinstance(stats, dict) else None
