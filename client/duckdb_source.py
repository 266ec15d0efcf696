"""DuckDB over a dataset with the columns and the filters of each query sent to the nodes.

DuckDB pushes columns and simple filters only into a ``pyarrow.dataset.Dataset``, through
``type(obj).scanner(obj, columns=..., filter=...)``. :class:`DuckDBScan` is such a dataset in name: its scanner
turns them into ``select`` and ``filter`` views. A filter that cannot travel is applied as rows arrive, and
DuckDB applies every filter again, so the answer never depends on what was pushed. pyarrow's own Dataset
methods are refused with a TypeError naming what to use.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

from flightpart.errors import FlightpartError
from flightpart.frames import retyped_schema

PUSHED = {"columns": 0, "filters": 0, "kept_here": 0}
"""How many scans had columns or a filter pushed to the nodes, and how many filters stayed here (for tests)."""


class DuckDBScan(pds.Dataset):
    """A flightpart dataset (or view) as DuckDB sees a pyarrow Dataset: projections and filters reach the nodes."""

    def __init__(self, view: Any):
        self._view = view  # never calls pyarrow's constructor: there is no C++ dataset behind this object

    @property
    def schema(self) -> pa.Schema:
        return shown_to_duckdb(self._view.schema)

    def scanner(self, columns: list[str] | None = None, filter: pc.Expression | None = None,
                **_options: Any) -> pds.Scanner:
        """The rows DuckDB asked for: ``filter`` evaluated on the nodes where it can travel, ``columns`` selected."""
        view = self._view
        kept_here = None
        if filter is not None:
            try:
                view = view.filter(filter)
                PUSHED["filters"] += 1
            except (FlightpartError, TypeError, ValueError):
                kept_here = filter  # applied below as the rows arrive; DuckDB applies it again anyway
                PUSHED["kept_here"] += 1
        if columns is not None:
            needed = list(columns)
            if kept_here is not None:
                needed += [c for c in _columns_of(kept_here, view.schema) if c not in needed]
            view = view.reading(needed)
            PUSHED["columns"] += 1
        reader = view.to_reader()
        shown = shown_to_duckdb(reader.schema)
        if shown is not reader.schema:
            reader = reader.cast(shown)
        wanted = list(columns) if columns is not None else None
        if kept_here is None and (wanted is None or reader.schema.names == wanted):
            return pds.Scanner.from_batches(reader)
        # the columns DuckDB asked for, in its order, without the index columns a view adds (DuckDB refuses more)
        return pds.Scanner.from_batches(reader, filter=kept_here, columns=wanted)

    def __repr__(self) -> str:
        return f"<flightpart DuckDB scan of {self._view!r}>"


DUCKDB_DECIMAL_DIGITS = 38
"""The most digits a DuckDB DECIMAL holds."""


def shown_to_duckdb(schema: pa.Schema) -> pa.Schema:
    """``schema`` as DuckDB is shown it: the same object, unless a column at any depth has a type DuckDB cannot import
    (float16 shown as float32, decimal256 as decimal128 up to 38 digits, else float64)."""
    return retyped_schema(schema, _as_duckdb_reads)


def _as_duckdb_reads(kind: pa.DataType) -> pa.DataType | None:
    if pa.types.is_float16(kind):
        return pa.float32()
    if pa.types.is_decimal256(kind):
        return pa.decimal128(kind.precision, kind.scale) if kind.precision <= DUCKDB_DECIMAL_DIGITS else pa.float64()
    return None


def _columns_of(expression: pc.Expression, schema: pa.Schema) -> list[str]:
    from flightpart.query.filters import referenced_columns

    try:
        return list(referenced_columns(expression, schema))
    except FlightpartError:
        return list(schema.names)


def _refuse(name: str) -> Any:
    def refused(self: DuckDBScan, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{name}() is pyarrow's, and this object is a flightpart dataset shown to DuckDB as a pyarrow "
                        "Dataset: use the flightpart dataset itself (ds.to_reader(), ds.to_arrow(), ds.filter(...), "
                        "ds.count_rows())")
    refused.__name__ = name
    return refused


for _name in dir(pds.Dataset):
    if not _name.startswith("_") and _name not in ("schema", "scanner"):
        attribute = getattr(pds.Dataset, _name)
        if callable(attribute):
            setattr(DuckDBScan, _name, _refuse(_name))
        else:
            setattr(DuckDBScan, _name, property(_refuse(_name)))
for _name in ("_get_fragments", "_scanner_options", "_scan_options", "__reduce__", "__reduce_ex__"):
    if hasattr(pds.Dataset, _name):
        setattr(DuckDBScan, _name, _refuse(_name))
