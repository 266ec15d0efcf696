"""Per-partition column statistics, and the guarantee they give a filter.

A node computes them from the batches it validated while storing (so a writer cannot make them lie); a reader
turns them into a *guarantee* (an expression every row satisfies) for Arrow's simplification. Only what is
exact is recorded: min and max of columns without nulls (or NaN), every column's null count. JSON carries the
values (text up to :data:`MAX_TEXT` characters, temporal values as their integer storage).
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from .joined import conjunction

MAX_TEXT = 256
"""Longer text values are not recorded: a truncated maximum would not bound the column."""


def _storage(t: pa.DataType) -> pa.DataType | None:
    """The integer type a temporal column's values are stored as, or None for other types."""
    if pat.is_date32(t) or pat.is_time32(t):
        return pa.int32()
    if pat.is_date64(t) or pat.is_time64(t) or pat.is_timestamp(t) or pat.is_duration(t):
        return pa.int64()
    return None


def _ordered(t: pa.DataType) -> bool:
    """Whether a column's min and max bound what a filter compares it with (not float16, which Arrow compares with
    nothing)."""
    return (pat.is_integer(t) or (pat.is_floating(t) and not pat.is_float16(t)) or pat.is_boolean(t)
            or pat.is_string(t) or pat.is_large_string(t) or _storage(t) is not None)


class StatsBuilder:
    """Accumulates min, max and null counts over the batches of one partition."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self._nulls = [0] * len(schema)
        self._min: list[Any] = [None] * len(schema)
        self._max: list[Any] = [None] * len(schema)
        self._exact = [_ordered(f.type) for f in schema]

    def add(self, batch: pa.RecordBatch) -> None:
        """Fold one batch in, with one NumPy pass each for min and max (it runs on the put path)."""
        for k, field in enumerate(self.schema):
            column = batch.column(k)
            self._nulls[k] += column.null_count
            if not self._exact[k] or len(column) == 0:
                continue
            if column.null_count:
                self._exact[k] = False  # min/max are recorded only for columns without nulls
                continue
            storage = _storage(field.type)
            if storage is not None:
                column = column.view(storage)
            if pat.is_integer(column.type) or pat.is_floating(column.type):
                values = column.to_numpy(zero_copy_only=True)
                lo, hi = values.min().item(), values.max().item()
            else:
                lo, hi = (v.as_py() for v in pc.min_max(column).values())
            if isinstance(lo, float) and not (math.isfinite(lo) and math.isfinite(hi)):
                self._exact[k] = False  # NaN compares false to everything and JSON has no infinity: no bound
                continue
            if isinstance(lo, str) and (len(lo) > MAX_TEXT or len(hi) > MAX_TEXT):
                self._exact[k] = False
                continue
            self._min[k] = lo if self._min[k] is None else min(self._min[k], lo)
            self._max[k] = hi if self._max[k] is None else max(self._max[k], hi)

    def result(self) -> dict[str, dict[str, Any]]:
        """``{column: {"nulls": n, "min": v, "max": v}}``; min/max only where they bound every row."""
        out: dict[str, dict[str, Any]] = {}
        for k, field in enumerate(self.schema):
            entry: dict[str, Any] = {"nulls": self._nulls[k]}
            if self._exact[k] and self._nulls[k] == 0 and self._min[k] is not None:
                entry["min"], entry["max"] = self._min[k], self._max[k]
            out[field.name] = entry
        return out


def scalar_of(value: Any, t: pa.DataType) -> pa.Scalar:
    """A recorded value as a scalar of its column's type (temporal values are recorded as their storage)."""
    storage = _storage(t)
    if storage is not None:
        return pa.array([value], storage).view(t)[0]
    return pa.scalar(value, t)


def guarantee(stats: dict[str, dict[str, Any]], schema: pa.Schema, rows: int) -> pc.Expression | None:
    """An expression every row of a partition with these statistics satisfies (None: nothing is known). A column with
    some nulls gives no term (Arrow reads ``x >= lo`` as implying ``x`` is valid); an all-null one gives
    ``is_null(x)``."""
    terms = []
    for name, entry in stats.items():
        if name not in schema.names or not isinstance(entry, dict):
            continue
        t = schema.field(name).type
        if rows and entry.get("nulls") == rows:
            terms.append(pc.field(name).is_null())
        elif entry.get("nulls") == 0 and "min" in entry and "max" in entry and _ordered(t):
            try:
                lo, hi = scalar_of(entry["min"], t), scalar_of(entry["max"], t)
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                continue  # statistics this reader cannot type: no pruning on that column
            terms.append((pc.field(name) >= lo) & (pc.field(name) <= hi))
    return conjunction(terms)
