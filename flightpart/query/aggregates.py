"""Aggregates computed in two steps: a partial result per partition (:func:`partial`, on the node), combined by the
reader (:func:`combine`). The result has the shape and names of ``pyarrow.Table.group_by(by).aggregate(pairs)``
over the whole data; each function's partials are its entry in :mod:`.functions`."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from flightpart import frames
from flightpart.errors import InvalidExpression, PartitionedError, RequestRejected, ServerError
from flightpart.wire import Aggregate

from .functions import AGGREGATE, AGGREGATES, EXACT, ROW_COUNT
from .predicates import parse_sql_value
from .soundness import decimal_past_precision, unsound


def spec(pairs: Sequence[tuple[str, str]], by: Sequence[str], columns: Sequence[str] | pa.Schema,
         computed: Mapping[str, str] | None = None) -> Aggregate:
    """Check what a user asked for against the dataset's ``schema`` (which ``computed`` columns extend); returns the
    spec a ticket carries."""
    if isinstance(by, str):
        by = [by]
    schema = columns if isinstance(columns, pa.Schema) else None
    columns = list(schema.names) if schema is not None else list(columns)
    extra: list[tuple[str, str]] = []
    for name, text in (computed or {}).items():
        if schema is None:
            raise TypeError("computed columns are checked against a schema: pass the dataset's schema as columns")
        if not isinstance(name, str) or not name or name in columns:
            raise PartitionedError(f"computed column {name!r}: name it with a string that is not a "
                                   "column of the dataset")
        if not isinstance(text, str):
            raise InvalidExpression(f"computed column {name!r}: give its SQL expression as text, got "
                                    f"{type(text).__name__}",
                                    field="computed")
        evaluated(text, schema)  # InvalidExpression, naming what cannot be computed exactly
        extra.append((name, text))
    columns = [*columns, *(name for name, _ in extra)]
    out = []
    for k, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise PartitionedError(f"aggregate[{k}]: expected (column, function), got {pair!r:.60}")
        column, function = pair
        if function not in AGGREGATES:
            raise PartitionedError(f"aggregate[{k}]: unknown function {function!r}; known: {', '.join(AGGREGATES)}")
        if not AGGREGATE[function].reads_column:
            column = ""
        elif column not in columns:
            raise PartitionedError(f"aggregate[{k}]: no column {column!r}; the columns are {list(columns)}")
        out.append((column, function))
    for key in by:
        if key not in columns:
            raise PartitionedError(f"aggregate by {key!r}: no such column; the columns are {list(columns)}")
    twice = _named_twice(by)
    if twice is not None:
        raise PartitionedError(f"aggregate by {twice!r} twice: name each key once")
    if not out:
        raise PartitionedError("aggregate: name at least one (column, function)")
    return Aggregate(tuple(out), tuple(by), tuple(extra) or None)


def columns_read(agg: Aggregate, schema: pa.Schema | None = None) -> list[str]:
    """The columns of ``schema`` an aggregate reads, keys first (a computed column's by what its expression reads)."""
    named = [*agg.by, *(c for c, f in agg.functions if AGGREGATE[f].reads_column)]
    if agg.computed:
        if schema is None:
            raise TypeError("the columns computed columns read are found in a schema: pass the dataset's schema")
        defined = dict(agg.computed)
        named = [c for c in named if c not in defined] + [c for name in named if name in defined
                                                          for c in evaluated(defined[name], schema)[2]]
    return list(dict.fromkeys(named))


@functools.lru_cache(maxsize=256)
def evaluated(text: str, schema: pa.Schema) -> tuple[pc.Expression, pa.DataType, tuple[str, ...]]:
    """A computed column's expression over ``schema``, parsed once per text and schema."""
    return parse_sql_value(text, schema)


def with_computed(table: pa.Table, agg: Aggregate, where: str = "ticket.aggregate.computed") -> pa.Table:
    """``table`` with the computed columns the aggregate uses, each evaluated as DuckDB would, or RequestRejected for
    a missing column, a checked overflow or a float that is not finite."""
    used = {*agg.by, *(c for c, _f in agg.functions)}
    wanted = [(name, text) for name, text in agg.computed or () if name in used]
    if not wanted:
        return table
    expressions, names = [pc.field(n) for n in table.column_names], list(table.column_names)
    for name, text in wanted:
        if name in names:
            raise RequestRejected(f"{where}: {name!r} is already a column", field=where)
        try:
            expression, _type, _reads = evaluated(text, table.schema)
        except InvalidExpression as exc:
            raise InvalidExpression(str(exc), field=where) from None
        expressions.append(expression)
        names.append(name)
    source = acero.Declaration("table_source", acero.TableSourceNodeOptions(table))
    plan = acero.Declaration.from_sequence([source,
                                            acero.Declaration("project", acero.ProjectNodeOptions(expressions, names))])
    try:
        out = plan.to_table(use_threads=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowMemoryError) as exc:
        raise InvalidExpression(f"{where}: cannot be computed here ({str(exc)[:200]})", field=where) from None
    for name, _text in wanted:
        values = out.column(name)
        if pa.types.is_floating(values.type) and pc.all(pc.is_finite(values)).as_py() is False:
            raise InvalidExpression(f"{where}: {name!r} is not finite on some row (infinity or NaN), where DuckDB "
                                    "refuses or gives NULL", field=where)
    return out


def _partial_pairs(agg: Aggregate) -> list[tuple[str, str]]:
    return list(dict.fromkeys((c, p) for c, f in agg.functions for p in AGGREGATE[f].partials))


def _arrow_pair(column: str, function: str) -> tuple:
    """What pyarrow's ``aggregate`` is asked for one function."""
    entry = AGGREGATE[function]
    if not entry.reads_column:
        return ([], entry.arrow)
    return (_exact_name(column) if entry.exact else column, entry.arrow)


def _exact_name(column: str) -> str:
    """The column an exact sum adds up (see :func:`_with_exact_columns`)."""
    return f"\x00exact\x00{column}"


def _with_exact_columns(table: pa.Table, pairs: Sequence[tuple[str, str]],
                        narrowed: set[str] | None = None) -> pa.Table:
    """``table`` with each exact sum's column as :data:`EXACT` when it holds integers or booleans, under
    :func:`_exact_name`. With ``narrowed``: a column whose sum cannot pass int64's range whatever rows a group takes
    (its largest magnitude times its rows) is added up as int64 instead, its name put in ``narrowed``, and its sums
    are cast to :data:`EXACT` after (the same values, summed without decimals)."""
    for column in dict.fromkeys(c for c, f in pairs if AGGREGATE[f].exact):
        values = table.column(column)
        if pa.types.is_boolean(values.type):
            values = pc.cast(values, pa.int8())
        if pa.types.is_integer(values.type):
            if narrowed is not None and _sums_fit_int64(values):
                values = pc.cast(values, pa.int64())
                narrowed.add(column)
            else:
                values = pc.cast(values, EXACT)
        table = table.append_column(_exact_name(column), values)
    return table


def _sums_fit_int64(values: pa.ChunkedArray) -> bool:
    """Whether no sum of ``values`` (any of its rows) can pass int64's range."""
    if len(values) == values.null_count:
        return True
    low, high = (v.as_py() for v in pc.min_max(values).values())
    return max(abs(low), abs(high)) * len(values) < 1 << 63


def _output_name(column: str, function: str) -> str:
    return AGGREGATE[function].output_name(column)


def _result_name(column: str, function: str) -> str:
    """The column pyarrow's group-by names the result of a partial pair."""
    entry = AGGREGATE[function]
    return f"{_exact_name(column)}_{entry.arrow}" if entry.exact else _output_name(column, function)


def _named_twice(names: Sequence[str]) -> str | None:
    """The first name ``names`` holds twice."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def _read_columns(agg: Aggregate) -> list[str]:
    """The columns an aggregate groups by and aggregates (computed ones by their names), keys first."""
    return list(dict.fromkeys([*agg.by, *(c for c, f in agg.functions if AGGREGATE[f].reads_column)]))


def values_of_dictionaries(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``table`` with each dictionary column of ``columns`` decoded to its values.

    Partials are computed and combined over values, never dictionaries: Arrow counts a dictionary's indices, some
    kernels crash on dictionaries, and partitions' dictionaries differ. :func:`combine` re-encodes the keys, so a
    result has the types pyarrow's own ``group_by`` gives.
    """
    for name in columns:
        i = table.schema.get_field_index(name)
        if i >= 0 and pa.types.is_dictionary(table.schema.field(i).type):
            column = table.column(i)
            table = table.set_column(i, name, column.cast(column.type.value_type))
    return table


def partial(table: pa.Table, agg: Aggregate) -> pa.Table:
    """One partition's partial result: the keys, then one column ``p{k}`` per partial function."""
    twice = _named_twice(agg.by)
    if twice is not None:
        raise RequestRejected(f"ticket.aggregate: grouped by {twice!r} twice", field="ticket.aggregate")
    table = with_computed(table, agg)
    read = _read_columns(agg)
    for column in read:
        if column not in table.column_names:
            raise RequestRejected(f"ticket.aggregate: no column {column!r} in this partition", field="ticket.aggregate")
    pairs = _partial_pairs(agg)
    narrowed: set[str] = set()
    try:
        table = _with_exact_columns(values_of_dictionaries(table, read), pairs, narrowed)
        result = table.group_by(list(agg.by), use_threads=False).aggregate([_arrow_pair(c, f) for c, f in pairs])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise RequestRejected(f"ticket.aggregate: {str(exc)[:200]}", field="ticket.aggregate") from None
    arrays = [result.column(k) for k in agg.by] + [
        result.column(_result_name(c, f)).cast(EXACT) if AGGREGATE[f].exact and c in narrowed
        else result.column(_result_name(c, f)) for c, f in pairs]
    for (column, function), values in zip(pairs, arrays[len(agg.by):]):
        _check_sum_fits(values, column, function, "ticket.aggregate")
    return pa.table(arrays, names=[*agg.by, *(f"p{k}" for k in range(len(pairs)))])


def _check_sum_fits(values: pa.ChunkedArray, column: str, function: str, where: str) -> None:
    """RequestRejected when a decimal sum outgrew its precision (Arrow's sum would wrap it; DuckDB raises overflow)."""
    if AGGREGATE[function].arrow != "sum" or not pa.types.is_decimal(values.type):
        return
    try:
        values.validate(full=True)
        decimal_past_precision(values)  # a sum that wrapped to exactly the width's floor passes Arrow's check
    except pa.ArrowInvalid:
        raise RequestRejected(f"{where}: the sum of {column!r} does not fit in {values.type} (an overflow)",
                              field=where) from None


@functools.lru_cache(maxsize=256)
def partial_schema(agg: Aggregate, schema: pa.Schema) -> pa.Schema:
    """The schema every partition's partial of ``agg`` has over a dataset of ``schema`` (kept per both: a reader
    asks it at each aggregate)."""
    try:
        empty = frames.empty_table(schema)
    except pa.ArrowNotImplementedError as exc:  # a union column: Arrow cannot make it empty, nor aggregate it
        raise RequestRejected(f"aggregate: {str(exc)[:200]}", field="aggregate") from None
    return partial(empty, agg).schema


def checked_partials(tables: Sequence[pa.Table], agg: Aggregate, expected: pa.Schema, most_rows: int) -> list[pa.Table]:
    """Partials nodes sent, checked before they are combined: the columns and types of ``expected``
    (:func:`partial_schema`), at most ``most_rows`` rows, valid values, no group twice within one. A faulty node
    gets a clear ServerError, not an Arrow error from :func:`combine` (false numbers in the right shape cannot be
    told). Checked in one pass over all partials, so the check costs about what combining does."""
    bound = max(1, most_rows if agg.by else 1)
    out = []
    for table in tables:
        where = f"a node's partial aggregate ({table.num_rows} rows: {', '.join(table.column_names)[:200]})"
        if table.num_rows > bound:
            raise ServerError(f"{where}: more rows than the {bound:,} it can have; not used")
        if not table.schema.equals(expected):
            if table.column_names != expected.names:
                raise ServerError(f"{where}: the columns asked were {', '.join(expected.names)[:200]}; not used")
            if table.schema.types != expected.types:
                raise ServerError(f"{where}: its types ({', '.join(map(str, table.schema.types))[:200]}) are not "
                                  f"those asked ({', '.join(map(str, expected.types))[:200]}); not used")
            table = table.cast(expected)  # nullability and metadata as asked
        out.append(table)
    _all_valid(out)
    if agg.by and any(t.num_rows > 1 for t in out):
        _each_group_once(out, agg.by)
    return out


def _all_valid(tables: Sequence[pa.Table]) -> None:
    """ServerError when one of ``tables`` holds values Arrow's kernels may read out of bounds
    (:func:`~flightpart.query.soundness.unsound`), checked in one pass, then the culprit found."""
    if not tables or unsound(pa.concat_tables(tables)) is None:
        return
    for table in tables:
        why = unsound(table)
        if why is not None:
            raise ServerError(f"a node's partial aggregate ({table.num_rows} rows: "
                              f"{', '.join(table.column_names)[:200]}): its values are not valid Arrow "
                              f"({why}); not used")


def _each_group_once(tables: Sequence[pa.Table], by: Sequence[str]) -> None:
    """ServerError when one of ``tables`` holds a group twice (one grouping over all)."""
    origin = "flightpart partial"
    while origin in by:  # a key named so: another name for the partial's number
        origin += "_"
    keys = [t.select(list(by)).append_column(origin, pa.array(np.full(t.num_rows, k, np.int64)))
            for k, t in enumerate(tables)]
    try:  # keys are values (checked_partials held them to partial_schema's types), never dictionaries to unify
        merged = pa.concat_tables(keys).combine_chunks()
        counted = merged.group_by([*by, origin], use_threads=False).aggregate([([], AGGREGATE[ROW_COUNT].arrow)])
    except pa.ArrowException as exc:
        raise ServerError("a node's partial aggregate: its keys cannot be grouped "
                          f"({str(exc)[:200]}); not used") from None
    twice = pc.greater(counted.column(AGGREGATE[ROW_COUNT].output_name("")), 1)
    if pc.any(twice).as_py():
        k = counted.filter(twice).column(origin)[0].as_py()
        raise ServerError(f"a node's partial aggregate ({tables[k].num_rows} rows: "
                          f"{', '.join(tables[k].column_names)[:200]}): a group appears more than once; not used")


def combine(partials: Sequence[pa.Table], agg: Aggregate, schema: pa.Schema) -> pa.Table:
    """The final result from every partition's partial (``schema``: the dataset's, for an empty result's types)."""
    empty = _empty_result(agg, schema)
    if not partials:
        return empty
    pairs = _partial_pairs(agg)
    merged = pa.concat_tables(partials, promote_options="permissive")
    rolled = merged.group_by(list(agg.by), use_threads=False).aggregate(
        [(f"p{k}", _combined_by(f)) for k, (_c, f) in enumerate(pairs)])
    index = {pair: rolled.column(f"p{k}_{_combined_by(pair[1])}") for k, pair in enumerate(pairs)}
    for (column, function), values in index.items():
        _check_sum_fits(values, column, function, "aggregate")
    arrays, names = [_as_key(rolled.column(k), empty.schema.field(i).type) for i, k in enumerate(agg.by)], list(agg.by)
    for column, function in agg.functions:
        entry = AGGREGATE[function]
        arrays.append(entry.finish_arrow([index[(column, p)] for p in entry.partials]))
        names.append(_output_name(column, function))
    return pa.table(arrays, names=names)


@functools.lru_cache(maxsize=256)
def _empty_result(agg: Aggregate, schema: pa.Schema) -> pa.Table:
    """The result over no rows, with the types pyarrow's ``group_by`` gives; RequestRejected for what Arrow cannot
    aggregate (kept per aggregate and schema: every combine asks it)."""
    empty = with_computed(frames.empty_table(schema), agg)
    keys = set(agg.by)
    empty = _with_exact_columns(values_of_dictionaries(empty, [c for c in _read_columns(agg) if c not in keys]),
                                agg.functions)
    try:
        result = empty.group_by(list(agg.by), use_threads=False).aggregate([_arrow_pair(c, f)
                                                                            for c, f in agg.functions])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise RequestRejected(f"aggregate: {str(exc)[:200]}", field="aggregate") from None
    return result.rename_columns([*agg.by, *(_output_name(c, f) for c, f in agg.functions)])


def _as_key(values: pa.ChunkedArray, wanted: pa.DataType) -> pa.ChunkedArray:
    """A combined key column as ``wanted``: re-encoded when pyarrow's ``group_by`` gives a dictionary."""
    if not pa.types.is_dictionary(wanted) or pa.types.is_dictionary(values.type):
        return values
    encoded = pc.dictionary_encode(values)
    try:
        return encoded.cast(wanted)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return encoded


def _combined_by(function: str) -> str:
    """How the partials of one function combine across partitions (its entry's ``rollup``)."""
    rollup = AGGREGATE[function].rollup
    assert rollup is not None, f"{function} is not a partial"
    return rollup
