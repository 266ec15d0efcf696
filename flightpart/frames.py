"""pandas, polars, pyarrow and friends in and out of ``pyarrow.Table``: Arrow is the one in-memory format, and
frames are converted at the edge, zero-copy where Arrow allows."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from . import tiling
from .errors import LimitExceeded, SchemaMismatch


def frame_kind(obj: Any) -> str | None:
    """A short name of a frame type we can read, or None."""
    if isinstance(obj, pa.Table):
        return "pyarrow"
    if isinstance(obj, pa.RecordBatch):
        return "pyarrow.RecordBatch"
    module = type(obj).__module__.split(".")[0]
    if module == "pandas" and type(obj).__name__ == "DataFrame":
        return "pandas"
    if module == "polars" and type(obj).__name__ == "DataFrame":
        return "polars"
    if isinstance(obj, np.ndarray) and obj.ndim in (1, 2):
        return "numpy"
    if hasattr(obj, "__arrow_c_stream__"):
        return "arrow-stream"
    if hasattr(obj, "__dataframe__"):
        return "interchange"
    return None


def stream_of(obj: Any) -> pa.RecordBatchReader | None:
    """A reader over ``obj`` when it is a stream (a ``RecordBatchReader``, a ``pyarrow.dataset``, anything else with
    ``__arrow_c_stream__``) rather than a pandas, polars or pyarrow frame, else None."""
    if isinstance(obj, pa.RecordBatchReader):
        return obj
    if type(obj).__module__.startswith("pyarrow._dataset") and hasattr(obj, "scanner"):
        # pyarrow's defaults (16 batches of 4 files ahead, Parquet column chunks pre-buffered) hold hundreds of MB
        # on a large dataset: read one file at a time, two batches ahead, pages as they are decoded
        import pyarrow.dataset as pds

        options = {}
        if isinstance(getattr(obj, "format", None), pds.ParquetFileFormat):
            options["fragment_scan_options"] = pds.ParquetFragmentScanOptions(pre_buffer=False)
        return obj.scanner(batch_readahead=2, fragment_readahead=1, use_threads=False, **options).to_reader()
    if frame_kind(obj) == "arrow-stream":
        return pa.RecordBatchReader.from_stream(obj)
    return None


def to_arrow(obj: Any, *, column_offset: int = 0) -> pa.Table:
    """Any supported frame as a ``pyarrow.Table``. A pandas index is kept (in metadata, or as columns) for
    :func:`to_pandas`; NumPy columns are named by global column number from ``column_offset``."""
    kind = frame_kind(obj)
    if kind == "pyarrow":
        return obj
    if kind == "pyarrow.RecordBatch":
        return pa.Table.from_batches([obj])
    if kind == "pandas":
        return _from_pandas(obj)
    if kind == "polars":
        return _from_polars(obj)
    if kind == "numpy":
        arr = obj if obj.ndim == 2 else obj.reshape(-1, 1)
        names = [str(column_offset + j) for j in range(arr.shape[1])]
        return pa.Table.from_arrays([pa.array(arr[:, j]) for j in range(arr.shape[1])], names=names)
    if kind == "arrow-stream":
        return pa.table(obj)
    if kind == "interchange":
        from pyarrow.interchange import from_dataframe

        return from_dataframe(obj)
    raise TypeError(
        f"cannot read a {type(obj).__module__}.{type(obj).__qualname__}: expected a pandas, polars or "
        "pyarrow frame, a 2-D NumPy array, or an object with __arrow_c_stream__ or __dataframe__"
    )


def _from_polars(frame: Any) -> pa.Table:
    """A Polars frame as a table; a column Arrow cannot hold (``Object``, ``Int128``) is named with what to do."""
    for name, dtype in frame.schema.items():
        kind = str(dtype)
        if kind == "Object":
            raise SchemaMismatch(f"column {name!r} holds Python objects (Polars Object), which Arrow can only store as "
                                 f"their addresses: convert them first, e.g. pl.col({name!r}).map_elements(str, "
                                 "return_dtype=pl.String)", field=f"columns.{name}")
        if kind in ("Int128", "UInt128"):
            raise SchemaMismatch(f"column {name!r} is Polars {kind}, which Arrow has no type for: cast it first, e.g. "
                                 f"pl.col({name!r}).cast(pl.Decimal(38, 0)) or .cast(pl.Int64)",
                                 field=f"columns.{name}")
    return frame.to_arrow()


def check_columns(schema: pa.Schema) -> None:
    """SchemaMismatch for columns a dataset cannot hold: none at all (no column carries no rows), or a name given
    twice (reads select columns by name)."""
    if not schema.names:
        raise SchemaMismatch("the frame has no column: a dataset holds at least one (its rows would read back as none)",
                             field="schema")
    seen: set[str] = set()
    for name in schema.names:
        if name in seen:
            raise SchemaMismatch(f"column {name!r} is named twice: rename one (a dataset's columns are read by name)",
                                 field=f"columns.{name}")
        seen.add(name)


def _from_pandas(frame: Any) -> pa.Table:
    """A pandas frame as a table; an object column of mixed Python types is named with the types it holds and the
    fix."""
    twice = sorted({str(name) for name in frame.columns[frame.columns.duplicated()]})
    if twice:  # pyarrow's own ValueError, with no code, said so
        raise SchemaMismatch(f"the frame names columns {twice} more than once; a dataset's columns have one name each: "
                             "rename them first (df.columns = [...])", field="columns")
    try:
        return pa.Table.from_pandas(frame, preserve_index=None)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        for name in frame.columns:
            try:
                pa.array(frame[name], from_pandas=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                kinds = sorted({type(v).__name__ for v in frame[name] if v is not None and v == v})
                raise SchemaMismatch(
                    f"column {name!r} holds values of several types ({', '.join(kinds)}), which one Arrow "
                    f"column cannot: make it one type first, e.g. df[{name!r}] = df[{name!r}].astype(str), or "
                    f"pd.to_numeric(df[{name!r}], errors='coerce') for numbers", field=f"columns.{name}") from None
        raise SchemaMismatch(f"the frame cannot be read as Arrow: {exc}") from None


def to_pandas(table: pa.Table) -> Any:
    """A pandas DataFrame, restoring the index the table recorded."""
    return table.to_pandas()


def to_polars(table: pa.Table) -> Any:
    """A polars DataFrame (zero-copy where polars can take Arrow buffers), without the pandas index."""
    return polars_frame(drop_pandas_index(table))


def polars_frame(data: pa.Table | pa.RecordBatch) -> Any:
    """``data`` as a polars DataFrame, every column kept."""
    import polars as pl

    table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
    shown = shown_to_polars(table.schema)
    if shown is not table.schema:
        table = table.cast(shown)
    return pl.from_arrow(_whole_fixed_lists(table))


POLARS_DECIMAL_DIGITS = 38
"""The most digits of a Polars ``Decimal``."""


@functools.lru_cache(maxsize=256)
def shown_to_polars(schema: pa.Schema) -> pa.Schema:
    """``schema`` as Polars is given it (the same object when Polars reads it as is): a decimal256 of at most 38 digits
    as a decimal128; a column Polars cannot read is SchemaMismatch (:func:`check_polars_reads`). Remembered per
    schema."""
    check_polars_reads(schema)
    return retyped_schema(schema, _as_polars_reads)


def _as_polars_reads(kind: pa.DataType) -> pa.DataType | None:
    if pa.types.is_decimal256(kind):
        return pa.decimal128(kind.precision, kind.scale)
    return None


def check_polars_reads(schema: pa.Schema) -> None:
    """SchemaMismatch naming the first column, at any depth, of a type Polars cannot read from Arrow, with what to do,
    instead of Polars' panic or unnamed error (decision 0014)."""
    for field in schema:
        why = _polars_cannot(field.type)
        if why is not None:
            raise SchemaMismatch(f"column {field.name!r} is {field.type}, which Polars cannot read "
                                 f"({why}): read it with to_arrow() or to_pandas(), or leave it out "
                                 "(ds.select([...]).to_polars())",
                                 field=f"columns.{field.name}")


def _polars_cannot(kind: pa.DataType) -> str | None:
    """Why Polars cannot read a column of ``kind`` (or a type within it), or None."""
    if pa.types.is_timestamp(kind) and kind.tz is not None and kind.tz[:1] in ("+", "-"):
        return f"Polars takes a zone by name, not the offset {kind.tz}; e.g. 'Asia/Kolkata' or 'Etc/GMT-5'"
    if pa.types.is_interval(kind):
        return "Polars has no month-day-nanosecond interval"
    if pa.types.is_decimal(kind) and kind.precision > POLARS_DECIMAL_DIGITS:
        return f"Polars decimals hold at most {POLARS_DECIMAL_DIGITS} digits"
    if pa.types.is_union(kind) or pa.types.is_run_end_encoded(kind) or pa.types.is_list_view(kind) \
            or pa.types.is_large_list_view(kind):
        return "Polars has no such type"
    return next((why for why in map(_polars_cannot, _children(kind)) if why is not None), None)


def _children(kind: pa.DataType) -> list[pa.DataType]:
    """The types a struct, map, list or dictionary type holds (none for others)."""
    if pa.types.is_struct(kind):
        return [kind.field(k).type for k in range(kind.num_fields)]
    if pa.types.is_map(kind):
        return [kind.key_type, kind.item_type]
    if any(is_kind(kind) for is_kind, _make in _LISTS) or pa.types.is_dictionary(kind):
        return [kind.value_type]
    return []


def retyped_schema(schema: pa.Schema, change: Callable[[pa.DataType], pa.DataType | None]) -> pa.Schema:
    """``schema`` with each type ``change`` gives a new type for replaced at any depth; the same object when none is."""
    shown = [retyped(field.type, change) for field in schema]
    if all(kind is None for kind in shown):
        return schema
    return pa.schema([field if kind is None else field.with_type(kind) for field, kind in zip(schema, shown)],
                     metadata=schema.metadata)


def retyped(kind: pa.DataType, change: Callable[[pa.DataType], pa.DataType | None]) -> pa.DataType | None:
    """``kind`` with the types ``change`` replaces (None keeps one) replaced at any depth; None when nothing changed."""
    changed = change(kind)
    if changed is not None:
        return changed
    if pa.types.is_struct(kind):
        fields = [kind.field(k) for k in range(kind.num_fields)]
        shown = [retyped(field.type, change) for field in fields]
        if all(child is None for child in shown):
            return None
        return pa.struct([field if child is None else field.with_type(child) for field, child in zip(fields, shown)])
    if pa.types.is_map(kind):
        key, item = retyped(kind.key_type, change), retyped(kind.item_type, change)
        if key is None and item is None:
            return None
        return pa.map_(kind.key_field.with_type(key or kind.key_type),
                       kind.item_field.with_type(item or kind.item_type), kind.keys_sorted)
    if pa.types.is_dictionary(kind):
        value = retyped(kind.value_type, change)
        return None if value is None else pa.dictionary(kind.index_type, value, kind.ordered)
    for is_kind, make in _LISTS:
        if is_kind(kind):
            value = retyped(kind.value_type, change)
            return None if value is None else make(kind, kind.value_field.with_type(value))
    return None


_LISTS: tuple[tuple[Callable[[pa.DataType], bool], Callable[[Any, pa.Field], pa.DataType]], ...] = (
    (pa.types.is_list, lambda kind, field: pa.list_(field)),
    (pa.types.is_large_list, lambda kind, field: pa.large_list(field)),
    (pa.types.is_fixed_size_list, lambda kind, field: pa.list_(field, kind.list_size)),
    (pa.types.is_list_view, lambda kind, field: pa.list_view(field)),
    (pa.types.is_large_list_view, lambda kind, field: pa.large_list_view(field)),
)
"""The list types, and how to make one of the same kind around another value field."""


def _whole_fixed_lists(table: pa.Table) -> pa.Table:
    """``table`` with each chunk of a fixed-size list column holding exactly its own values, since Polars misreads a
    chunk whose values run past its rows (decision 0014). Zero-copy at top level; a nested column is copied."""
    for k, field in enumerate(table.schema):
        if _holds_fixed_list(field.type):
            whole = [_whole_fixed_list(chunk) for chunk in table.column(k).chunks]
            table = table.set_column(k, field, pa.chunked_array(whole, field.type))
    return table


def _whole_fixed_list(chunk: pa.Array) -> pa.Array:
    """``chunk`` whose fixed-size lists' values are exactly its own."""
    if isinstance(chunk.type, pa.ExtensionType):  # a tensor: its storage made whole
        return pa.ExtensionArray.from_storage(chunk.type, _whole_fixed_list(chunk.storage))
    if not pa.types.is_fixed_size_list(chunk.type):
        return pa.concat_arrays([chunk])  # nested deeper: rebuilt from its own rows
    size = chunk.type.list_size
    if chunk.offset == 0 and len(chunk.values) == len(chunk) * size:
        return chunk
    values = chunk.values.slice(chunk.offset * size, len(chunk) * size)
    return pa.FixedSizeListArray.from_arrays(values, type=chunk.type,
                                             mask=chunk.is_null() if chunk.null_count else None)


@functools.lru_cache(maxsize=256)
def _holds_fixed_list(kind: pa.DataType) -> bool:
    return holds(kind, pa.types.is_fixed_size_list)


def drop_pandas_index(table: pa.Table) -> pa.Table:
    """The table without pandas index columns, for consumers with no index."""
    meta = table.schema.pandas_metadata
    if not meta:
        return table
    stored = {c for c in meta.get("index_columns", []) if isinstance(c, str)}
    keep = [name for name in table.column_names if name not in stored]
    return table.select(keep) if len(keep) != table.num_columns else table


def data_columns(table: pa.Table) -> list[str]:
    """The columns that count toward a frame's shape (pandas index columns do not)."""
    return drop_pandas_index(table).column_names


def frame_shape(table: pa.Table) -> tuple[int, int]:
    """(rows, columns) as a user of the frame counts them."""
    return table.num_rows, len(data_columns(table))


def column_groups(columns: Sequence[str], q: int) -> list[list[str]]:
    """Columns cut in ``q`` consecutive groups of default-partition sizes."""
    sizes = tiling.block_sizes(len(columns), q)
    starts = tiling.starts_from_sizes(sizes)
    return [list(columns[s : s + n]) for s, n in zip(starts, sizes)]


def stored_columns(schema: pa.Schema, q: int) -> list[list[str]]:
    """The columns each of ``q`` column groups stores, as :func:`split_grid` stores them: with one group the frame's
    as they are; with more, each group's data columns then the pandas index columns."""
    if q == 1:
        return [list(schema.names)]
    data = data_columns(empty_table(schema))
    in_data = set(data)
    index = [c for c in schema.names if c not in in_data]
    return [group + index for group in column_groups(data, q)]


def split_grid(table: pa.Table, grid: Sequence[int]) -> dict[tuple[int, int], pa.Table]:
    """Cut a table into a ``(p, q)`` grid of zero-copy slices; pandas index columns travel with every column group."""
    p, q = grid
    data = data_columns(table)  # once: a check per column against a fresh list was quadratic in columns
    in_data = set(data)
    index_cols = [c for c in table.column_names if c not in in_data]
    groups = column_groups(data, q)
    rows = tiling.block_sizes(table.num_rows, p)
    starts = tiling.starts_from_sizes(rows)
    parts = {}
    for i, (r0, rn) in enumerate(zip(starts, rows)):
        block = table.slice(r0, rn)
        for j, group in enumerate(groups):
            parts[(i, j)] = block.select(group + index_cols) if q > 1 else block
    return parts


def assemble(parts: Mapping[tuple[int, int], pa.Table], grid: Sequence[int]) -> pa.Table:
    """Inverse of :func:`split_grid`: one table from a 2-D grid of parts, without copying buffers."""
    if len(grid) == 1:
        grid = (grid[0], 1)
        parts = {(k[0], 0): v for k, v in parts.items()}
    p, q = grid
    blocks = []
    for i in range(p):
        row = [parts[(i, j)] for j in range(q)]
        if q == 1:
            blocks.append(row[0])
            continue
        arrays, fields, seen = [], [], set()
        for part in row:
            for field, column in zip(part.schema, part.columns):
                if field.name in seen:
                    continue
                seen.add(field.name)
                fields.append(field)
                arrays.append(column)
        schema = pa.schema(fields, metadata=row[0].schema.metadata)
        blocks.append(pa.Table.from_arrays(arrays, schema=schema))
    if not blocks:
        raise ValueError("assemble: the grid has no parts")
    if len(blocks) == 1:
        return blocks[0]
    return pa.concat_tables(blocks, promote_options="none")


def from_pieces(blocks: Sequence[Sequence[pa.Table]], schema: pa.Schema) -> pa.Table:
    """One table of ``schema`` from row blocks, each given as tables of some of its columns (no copy)."""
    out = []
    for pieces in blocks:
        by_name = {name: column for table in pieces for name, column in zip(table.column_names, table.columns)}
        out.append(pa.Table.from_arrays([by_name[name] for name in schema.names], schema=schema))
    return pa.concat_tables(out) if out else empty_table(schema)


def rechunk(table: pa.Table, target_bytes: int = 1 << 20) -> pa.Table:
    """The same data in record batches of about ``target_bytes`` each (zero-copy slices)."""
    if table.num_rows == 0:
        return table
    per_row = max(1, size_of(table) // table.num_rows)
    rows = max(1, target_bytes // per_row)
    return pa.Table.from_batches(table.to_batches(max_chunksize=rows), schema=table.schema)



_VIEWS = frozenset(t.id for t in (pa.string_view(), pa.binary_view(), pa.list_view(pa.int8()),
                                  pa.large_list_view(pa.int8())))


def sent_unlike_stored(kind: pa.DataType) -> bool:
    """Whether values of ``kind``, at any depth, may take more bytes in a stream than in a file: a dictionary, a view
    type or a dense union (decision 0013)."""
    if pa.types.is_dictionary(kind) or kind.id in _VIEWS or kind.id == _DENSE_UNION:
        return True
    if isinstance(kind, pa.ExtensionType):
        return sent_unlike_stored(kind.storage_type)
    return any(sent_unlike_stored(kind.field(k).type) for k in range(kind.num_fields))


_DENSE_UNION = pa.dense_union([]).id


def holds(kind: pa.DataType, found: Callable[[pa.DataType], bool]) -> bool:
    """Whether ``kind`` or a type it holds at any depth is ``found``."""
    if found(kind):
        return True
    if pa.types.is_dictionary(kind):
        return holds(kind.value_type, found)
    if isinstance(kind, pa.ExtensionType):
        return holds(kind.storage_type, found)
    return any(holds(kind.field(k).type, found) for k in range(kind.num_fields))


def holds_dense_union(kind: pa.DataType) -> bool:
    """Whether ``kind`` is or holds a dense union, at any depth."""
    return holds(kind, lambda t: t.id == _DENSE_UNION)


def holds_dictionary(kind: pa.DataType) -> bool:
    """Whether ``kind`` is or holds a dictionary, at any depth."""
    return holds(kind, pa.types.is_dictionary)


def size_of(data: pa.Table | pa.RecordBatch) -> int:
    """``data.nbytes`` (a slice's rows only), except for dense union columns, counted by their buffers (a slice's
    whole parent's), since Arrow's ``nbytes`` over-counts and may crash on them (decision 0013)."""
    kinds = [holds_dense_union(field.type) for field in data.schema]
    if not any(kinds):
        return data.nbytes
    return sum(column.get_total_buffer_size() if union else column.nbytes for column, union in zip(data.columns, kinds))


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of no rows of ``schema``; a dense union column, which Arrow cannot make empty, is made as no nulls."""
    try:
        return schema.empty_table()
    except pa.ArrowNotImplementedError:
        return pa.table([pa.nulls(0, field.type) for field in schema], schema=schema)


_PLAIN_OF_VIEW = {pa.string_view(): pa.large_string(), pa.binary_view(): pa.large_binary()}


def without_views(kind: pa.DataType) -> pa.DataType | None:
    """``kind`` with each string or binary view, at any depth, replaced by its large offset-based twin; None when it
    holds none, or one a cast could not bring back (in a list view, dictionary, extension or union)."""
    if kind in _PLAIN_OF_VIEW:
        return _PLAIN_OF_VIEW[kind]
    if pa.types.is_struct(kind):
        fields = [kind.field(k) for k in range(kind.num_fields)]
        plain = [without_views(f.type) for f in fields]
        if all(p is None for p in plain):
            return None
        return pa.struct([f if p is None else f.with_type(p) for f, p in zip(fields, plain)])
    if pa.types.is_map(kind):
        key, item = without_views(kind.key_field.type), without_views(kind.item_field.type)
        if key is None and item is None:
            return None
        return pa.map_(kind.key_field if key is None else kind.key_field.with_type(key),
                       kind.item_field if item is None else kind.item_field.with_type(item), kind.keys_sorted)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        value = without_views(kind.value_type)
        if value is None:
            return None
        field = kind.value_field.with_type(value)
        if pa.types.is_fixed_size_list(kind):
            return pa.list_(field, kind.list_size)
        return pa.large_list(field) if pa.types.is_large_list(kind) else pa.list_(field)
    return None


@functools.lru_cache(maxsize=256)
def schema_without_views(schema: pa.Schema) -> pa.Schema | None:
    """``schema`` with its string and binary views replaced (:func:`without_views`), or None when it has none."""
    plain = [without_views(f.type) for f in schema]
    if all(p is None for p in plain):
        return None
    return pa.schema([f if p is None else f.with_type(p) for f, p in zip(schema, plain)], metadata=schema.metadata)


def filter_rows(table: pa.Table, mask: Any) -> pa.Table:
    """``table.filter(mask)``, also for view columns (filtered as their large twins and cast back, a batch at a
    time)."""
    plain = schema_without_views(table.schema)
    if plain is None:
        return table.filter(mask)
    mask = mask if isinstance(mask, pa.ChunkedArray) else pa.chunked_array([mask])
    kept, start = [], 0
    for batch in table.to_batches():
        rows = mask.slice(start, batch.num_rows)
        start += batch.num_rows
        kept.append(pa.Table.from_batches([batch]).cast(plain).filter(rows).cast(table.schema))
    return pa.concat_tables(kept) if kept else table.schema.empty_table()


FEW_ROWS_TAKEN = 4096
"""At most this many rows of a view column are taken one by one (a top's rows); more, through the column's copy."""


def take_rows(table: pa.Table, indices: Any) -> pa.Table:
    """``table.take(indices)``, also for view columns (:func:`filter_rows`); a few rows are copied one by one."""
    plain = schema_without_views(table.schema)
    if plain is None:
        return table.take(indices)
    rows = [int(i) for i in indices.to_pylist()] if len(indices) <= FEW_ROWS_TAKEN else None
    if rows is None:
        return table.cast(plain).take(indices).cast(table.schema)
    columns = []
    for field, wide, column in zip(table.schema, plain, table.columns):
        if field.type.equals(wide.type):
            columns.append(column.take(indices))
        else:
            one_by_one = [column.slice(i, 1).cast(wide.type).combine_chunks() for i in rows]
            columns.append(pa.chunked_array(one_by_one, wide.type).cast(field.type))
    return pa.table(columns, schema=table.schema)


def compact_views(batch: pa.RecordBatch, plain: pa.Schema) -> pa.RecordBatch:
    """``batch`` whose view columns hold only the bytes of its own rows (decision 0013): each rebuilt from its rows,
    cast to ``plain`` (copying them) and back."""
    own = pa.RecordBatch.from_arrays([pa.concat_arrays([column]) for column in batch.columns], schema=batch.schema)
    return own.cast(plain).cast(batch.schema)


def growing_dictionaries(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` with each dictionary column's dictionary only ever extended, never replaced.

    An IPC file holds one dictionary per column, which later batches may only extend; a stream may replace it at
    every batch. Each batch is re-indexed into the dictionary so far plus its new values (same values read back), so
    all can be written with ``emit_dictionary_deltas``. Lists of dictionary values grow the same way; a dictionary
    deeper in a nested type passes unchanged.
    """
    seen: dict[int, pa.Array] = {}
    for batch in batches:
        columns = list(batch.columns)
        changed = False
        for k, column in enumerate(columns):
            if isinstance(column, pa.DictionaryArray):
                grown = _into_dictionary(column, seen.get(k))
                seen[k] = grown.dictionary
            elif (isinstance(column, (pa.ListArray, pa.LargeListArray))
                  and isinstance(column.values, pa.DictionaryArray)):
                values = _into_dictionary(column.values, seen.get(k))
                seen[k] = values.dictionary
                grown = column if values is column.values else type(column).from_arrays(
                    column.offsets, values, type=column.type, mask=column.is_null() if column.null_count else None)
            else:
                continue
            if grown is not column:
                columns[k], changed = grown, True
        yield pa.RecordBatch.from_arrays(columns, schema=batch.schema) if changed else batch


def _into_dictionary(column: pa.DictionaryArray, known: pa.Array | None) -> pa.DictionaryArray:
    """``column`` indexed into ``known`` followed by its own dictionary's values ``known`` lacks."""
    own = column.dictionary
    if known is None or own.equals(known) or (len(own) >= len(known) and own.slice(0, len(known)).equals(known)):
        return column  # the first, the same, or an extension: written as it is (a delta at most)
    import pyarrow.compute as pc

    new_values = own.filter(pc.is_null(pc.index_in(own, value_set=known)))
    merged = pa.concat_arrays([known, new_values.cast(known.type)])
    position = pc.index_in(own, value_set=merged)  # every value of ``own`` is in ``merged`` now
    index_type = column.type.index_type
    if len(merged) - 1 > _largest_index(index_type):
        raise LimitExceeded(f"the dictionary of a column grew to {len(merged):,} values across the batches of one "
                            f"partition, past what its {index_type} indices can address; send wider indices",
                            field="dictionary")
    indices = position.take(column.indices).cast(index_type)
    return pa.DictionaryArray.from_arrays(indices, merged, ordered=column.type.ordered)


def _largest_index(index_type: pa.DataType) -> int:
    """The largest value of an integer index type."""
    return int(np.iinfo(index_type.to_pandas_dtype()).max)


def widens_losslessly(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether every value of ``source`` is a value of ``target`` (int32 -> int64, date -> timestamp; string, binary and
    list encodings among themselves)."""
    import pyarrow.types as pat

    if source.equals(target):
        return True
    for family in (_STRINGS, _BINARIES):
        if family(source) and family(target):
            return True
    if pat.is_integer(source) and pat.is_floating(target):
        return target.bit_width == 64 and source.bit_width <= 32
    if pat.is_integer(source) and pat.is_integer(target):
        if pat.is_signed_integer(source) == pat.is_signed_integer(target):
            return target.bit_width >= source.bit_width
        return pat.is_unsigned_integer(source) and target.bit_width > source.bit_width
    if pat.is_floating(source) and pat.is_floating(target):
        return target.bit_width >= source.bit_width
    if pat.is_date(source) and pat.is_timestamp(target):
        return target.tz is None
    return False


def _STRINGS(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _BINARIES(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)


def describe_columns(schema: pa.Schema) -> list[dict[str, Any]]:
    """Each column's name, type and nullability, as ``show``, ``ls --long`` and the status page print them."""
    return [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema]

