"""Row filters that travel to the data: ``pyarrow.compute`` expressions as Substrait (decision 0012).

A filter crosses the wire as a Substrait extended expression, safe to decode and never pickled, bound to a schema
of only the columns it reads, so a node can evaluate it on any partition holding those columns. ``parse_where``
turns SQL text into an expression without evaluating anything (:mod:`flightpart.query.predicates`).
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc
import pyarrow.substrait as substrait

from flightpart.errors import PartitionedError, RequestRejected
from flightpart.frames import filter_rows, schema_without_views
from flightpart.wire import Ticket

_FIELD_PATH = re.compile(r"FieldPath\((\d+)")


@dataclass(frozen=True)
class Filter:
    """A filter ready to travel: its Substrait bytes and the columns it reads (in the bound order)."""

    expression: pc.Expression
    columns: tuple[str, ...]
    substrait: bytes

    @classmethod
    def compile(cls, expression: pc.Expression, schema: pa.Schema, *, translated: bool = False) -> "Filter":
        """Bind ``expression`` to the columns of ``schema`` it reads; a clear error when it cannot travel. Every filter
        is held to :data:`MAX_SUBSTRAIT_BOUND`; one not ``translated`` from text is also held to
        :data:`MAX_FILTER_BYTES`."""
        if not isinstance(expression, pc.Expression):
            raise TypeError("a filter is a pyarrow.compute.Expression (e.g. pc.field('x') > 0), got "
                            f"{type(expression).__qualname__}")
        columns = referenced_columns(expression, schema, None if translated else MAX_FILTER_BYTES)
        bound = pa.schema([schema.field(c) for c in columns])
        raw = serialize(expression, bound if columns else pa.schema([]), weighed=True)
        if len(raw) > MAX_TICKET_FILTER_BYTES:
            raise PartitionedError(f"filter {str(expression)[:200]}: {len(raw):,} bytes of Substrait, more than a "
                                   f"ticket carries ({MAX_TICKET_FILTER_BYTES:,}); write a chain of x = 1 OR x = 2 ... "
                                   "as x IN (1, 2, ...), use fewer or shorter values, or filter the rows after reading")
        return cls(expression, columns, raw)


def serialize(expression: pc.Expression, schema: pa.Schema, *, weighed: bool = False) -> bytes:
    """``expression`` bound to ``schema`` as the Substrait bytes a ticket carries (the node checks it is a filter).
    ``weighed``: already held to :data:`MAX_SUBSTRAIT_BOUND`."""
    if not weighed:
        check_substrait_bound(expression)
    try:
        return bytes(substrait.serialize_expressions([expression], ["filter"], bindable(schema)))
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise PartitionedError(f"filter {expression}: cannot be sent to the nodes ({exc}); filter the "
                               "rows after reading instead, or use functions Substrait knows (comparisons, and/or/not, "
                               "is_in, is_null, arithmetic)") from None


MAX_FILTER_BYTES = 16 << 10
"""The most Substrait a filter built as an expression (or pushed by DuckDB or Polars) may take to be sent to the
nodes. Arrow reads a Substrait expression by recursion as deep as it is nested, and an ``is_in`` of N values nests
N deep (some 6 bytes a value): a node reads each new filter first on a 2 MiB stack and refuses, with a code, one
that overflows it (:mod:`flightpart.server.substrait_check`), which an ``is_in`` of 3,400 values (20 KB) does. 16 KiB
(some 2,700 values) is what a node reads with room to spare, so a filter the reader sends is not refused there;
DuckDB and Polars keep a larger one and apply it to the rows they read. Ordinary filters take a few hundred bytes."""

MAX_TICKET_FILTER_BYTES = Ticket.MAX_BYTES * 3 // 4 - (64 << 10)
"""The most Substrait a filter may take to fit in a ticket: it travels as base64 (4 bytes for 3) in a ticket of at
most ``Ticket.MAX_BYTES``, beside the ticket's other fields (64 KiB kept for them). Refused when the filter is made,
not when the first read is (a text ``IN`` of 1,000 strings of 1 KB had passed, then every read failed)."""

MAX_SUBSTRAIT_BOUND = 4 << 20
"""The most Substrait any filter may be estimated to take before it is written (:func:`substrait_bound`): pyarrow's
writer doubles what an expression costs with each level of nesting, so an ``OR`` of 40 terms chained would take
terabytes (and the memory of the process writing it: a user's, or the catalog's for a SQL query). A translated
text filter, held only to this bound, is written as balanced trees."""

_CAPSULE_POINTER = ctypes.pythonapi.PyCapsule_GetPointer
_CAPSULE_POINTER.restype = ctypes.c_void_p
_CAPSULE_POINTER.argtypes = [ctypes.py_object, ctypes.c_char_p]
_METADATA_OFFSET = 2 * ctypes.sizeof(ctypes.c_void_p)  # ArrowSchema: format, name, metadata, ...


def _entries(schema: pa.Schema) -> list[tuple[bytes, bytes]]:
    """A schema's metadata in order, repeated keys kept, read from its C data interface export."""
    capsule = schema.__arrow_c_schema__()
    metadata = ctypes.c_void_p.from_address(_CAPSULE_POINTER(capsule, b"arrow_schema") + _METADATA_OFFSET).value
    if not metadata:
        return []
    pairs, position = [], metadata + 4
    for _ in range(ctypes.c_int32.from_address(metadata).value):
        pair = []
        for _part in range(2):
            length = ctypes.c_int32.from_address(position).value
            pair.append(ctypes.string_at(position + 4, length))
            position += 4 + length
        pairs.append((pair[0], pair[1]))
    return pairs


def substrait_bound(expression: pc.Expression) -> int:
    """An upper bound (within about 2.5x) of the Substrait bytes pyarrow writes for ``expression``, found without
    writing it: pyarrow writes each argument twice, so each entry of Arrow's own listing of the tree is weighed at
    48 bytes plus its literal, times 2^depth."""
    listing = pa.ipc.open_file(expression.__reduce__()[1][0])
    literals = listing.get_batch(0) if listing.num_record_batches else None
    depth, total = 0, 0
    for key, value in _entries(listing.schema):
        if key == b"end":
            depth -= 1
            continue
        size = 48
        if key in (b"literal", b"options") and literals is not None:
            size += literals.column(int(value)).nbytes
        total += size << min(depth, 64)
        if key == b"call":
            depth += 1
    return total


def called_functions(expression: pc.Expression) -> set[str]:
    """The Arrow functions ``expression`` calls, read from Arrow's own listing of it."""
    listing = pa.ipc.open_file(expression.__reduce__()[1][0])
    return {value.decode() for key, value in _entries(listing.schema) if key == b"call"}


def check_substrait_bound(expression: pc.Expression) -> None:
    """PartitionedError when ``expression`` would take more than :data:`MAX_SUBSTRAIT_BOUND` to write."""
    try:
        bound = substrait_bound(expression)
    except (pa.ArrowException, ValueError, IndexError, TypeError):
        return  # a listing this does not know: written as before
    if bound > MAX_SUBSTRAIT_BOUND:
        raise PartitionedError(f"filter {str(expression)[:200]}: nested too deeply to be sent to the nodes (about "
                               f"{bound:,} bytes of Substrait; write long and/or chains as is_in, or filter the rows "
                               "after reading)")


def referenced_columns(expression: pc.Expression, schema: pa.Schema,
                       most_bytes: int | None = MAX_FILTER_BYTES) -> tuple[str, ...]:
    """The top-level columns of ``schema`` that ``expression`` reads, in schema order; an error naming a field the
    schema lacks, or for more than ``most_bytes`` of Substrait (None: any)."""
    check_substrait_bound(expression)
    indexed = _indexable(schema)
    unwritable = [(k, field.name, field.type) for k, field in enumerate(schema)
                  if not field.type.equals(pa.null()) and indexed.field(k).type.equals(pa.null())]
    try:
        raw = substrait.serialize_expressions([expression], ["filter"], indexed)
        bound = None if most_bytes is not None and len(raw) > most_bytes else substrait.deserialize_expressions(raw)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        named = [f"{name!r} ({kind})" for _k, name, kind in unwritable
                 if re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", str(expression))]
        hint = f"; it seems to read {', '.join(named)}, of a type Substrait has not, which the nodes cannot filter" \
            if named else ""
        raise PartitionedError(f"filter {expression}: cannot be sent to the nodes ({exc}); the columns are "
                               f"{schema.names}; Substrait knows comparisons, and/or/not, is_in, is_null and "
                               f"arithmetic{hint}") from None
    if bound is None:
        raise PartitionedError(f"filter {str(expression)[:200]}: {len(raw):,} bytes of Substrait, more than the "
                               f"{most_bytes:,} sent to the nodes (Arrow reads an is_in of thousands of values by a "
                               "recursion that can overflow a thread's stack); filter the rows after reading instead")
    used = {int(k) for k in _FIELD_PATH.findall(str(bound.expressions["filter"]))}
    for k, name, kind in unwritable:
        if k in used:
            raise PartitionedError(f"filter {str(expression)[:200]}: reads column {name!r} of type {kind}, "
                                   "which Substrait has no type for, so the nodes cannot filter it; filter the rows "
                                   "after reading instead")
    return tuple(name for k, name in enumerate(schema.names) if k in used)


@functools.lru_cache(maxsize=256)
def _indexable(schema: pa.Schema) -> pa.Schema:
    """``schema`` as :func:`bindable` binds it, with each column of a type Substrait lacks as nulls: a filter that does
    not read such a column binds at the same indexes, and one that does is refused naming it."""
    shown = bindable(schema)
    for k, field in enumerate(shown):
        if _stand_in(field.type) is None:  # no Substrait type to bind it to
            shown = shown.set(k, field.with_type(pa.null()))
    return shown


@functools.lru_cache(maxsize=256)
def decode(raw: bytes) -> tuple[pc.Expression, pa.Schema]:
    """The expression and its bound schema from Substrait bytes, or RequestRejected."""
    try:
        bound = substrait.deserialize_expressions(pa.py_buffer(raw))
        expression = bound.expressions["filter"]
    except (pa.ArrowException, KeyError, TypeError, ValueError) as exc:
        raise RequestRejected(f"ticket.filter: not a Substrait filter expression ({str(exc)[:200]})",
                              field="ticket.filter") from None
    return expression, bound.schema


def apply(table: pa.Table, raw: bytes, *, keep: Collection[str] | None = None) -> pa.Table:
    """The rows of ``table`` the encoded filter keeps, in order (the columns it reads must be in ``table``), of the
    columns in ``keep`` (None: every column) in ``table``'s order."""
    expression, bound = decode(raw)
    if len(set(bound.names)) != len(bound.names):
        raise RequestRejected("ticket.filter: bound to a schema that names a column twice", field="ticket.filter")
    recast = []  # columns read as the type the filter was bound to: a zone Substrait did not carry, or a stand-in
    for field in bound:
        if field.name not in table.column_names:
            raise RequestRejected(f"ticket.filter: reads column {field.name!r}, which this partition does not have "
                                  f"(it has {table.column_names})", field="ticket.filter")
        here = table.schema.field(field.name).type
        if here.equals(field.type):
            continue
        if not (_same_instants(here, field.type) or _stands_in(here, field.type)):
            raise RequestRejected(f"ticket.filter: column {field.name!r} is {here} here, "
                                  f"the filter was bound to {field.type}", field="ticket.filter")
        recast.append(field.name)
    kept = table if keep is None else table.select([n for n in table.column_names if n in keep])
    # a column recast, or a view column Acero cannot filter: the filter's answer, from the columns it reads, selects
    # the partition's own rows in their own types; otherwise Acero filters the kept columns and those it reads
    if len(recast) == 1 and len(bound) == 1 and pa.types.is_dictionary(table.schema.field(recast[0]).type):
        return filter_rows(kept, _dictionary_answer(expression, table.column(recast[0]), bound))
    by_mask = bool(recast) or schema_without_views(table.schema) is not None
    order = list(bound.names) + ([] if by_mask else [n for n in kept.column_names if n not in bound.names])
    source_table = table.select(order)
    for name in recast:  # the same values in the type the filter reads them as
        k = order.index(name)
        source_table = source_table.set_column(k, name, _as_bound(source_table.column(k), bound.field(name).type))
    answer = _evaluated(expression, source_table, keep_rows=not by_mask)
    if by_mask:
        return filter_rows(kept, answer.column("keep"))  # a null answer drops the row, as a filter does
    return answer.select(kept.column_names)


def _evaluated(expression: pc.Expression, table: pa.Table, *, keep_rows: bool) -> pa.Table:
    """``table``'s rows where ``expression`` holds (``keep_rows``), or its answer for every row (column ``keep``)."""
    source = acero.Declaration("table_source", acero.TableSourceNodeOptions(table))
    step = (acero.Declaration("filter", acero.FilterNodeOptions(expression)) if keep_rows
            else acero.Declaration("project", acero.ProjectNodeOptions([expression], ["keep"])))
    try:
        return acero.Declaration.from_sequence([source, step]).to_table(use_threads=False)  # one thread: rows in order
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise RequestRejected(f"ticket.filter: cannot be evaluated here ({str(exc)[:200]})",
                              field="ticket.filter") from None


def _as_bound(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    """``column`` cast to the type a filter was bound to; a failed cast is the request's error, not the node's."""
    try:
        return column.cast(kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise RequestRejected(f"ticket.filter: cannot be evaluated here ({str(exc)[:200]})",
                              field="ticket.filter") from None


def _dictionary_answer(expression: pc.Expression, column: pa.ChunkedArray, bound: pa.Schema) -> pa.ChunkedArray:
    """``expression`` over one dictionary column, answered once per dictionary value (and once for a null) and taken
    by the indices, after unifying the chunks' dictionaries, instead of decoding the column."""
    field = bound.field(0)
    column = column.unify_dictionaries()
    if column.num_chunks == 0:
        return pa.chunked_array([], pa.bool_())
    dictionary = column.chunk(0).dictionary
    values = pa.concat_arrays([_as_bound(pa.chunked_array([dictionary]), field.type).combine_chunks(),
                               pa.nulls(1, field.type)])
    per_value = _evaluated(expression, pa.table([values], schema=pa.schema([field])), keep_rows=False).column(0)
    per_value = per_value.combine_chunks()
    on_values, on_null = per_value.slice(0, len(dictionary)), per_value[len(dictionary)]
    answers = []
    for chunk in column.chunks:
        taken = on_values.take(chunk.indices)
        answers.append(pc.if_else(chunk.indices.is_null(), on_null, taken) if chunk.indices.null_count else taken)
    return pa.chunked_array(answers, pa.bool_())


@functools.lru_cache(maxsize=256)
def bindable(schema: pa.Schema) -> pa.Schema:
    """``schema`` as a filter is bound to it: each column as the type that holds its values exactly and that Substrait
    and Arrow's comparisons know (decimal32/64 as decimal128, views as plain, dictionaries as their values). A node
    casts its columns to these types before it filters (:func:`_stands_in`)."""
    for k, field in enumerate(schema):
        kind = field.type
        if pa.types.is_decimal32(kind) or pa.types.is_decimal64(kind):
            schema = schema.set(k, field.with_type(pa.decimal128(kind.precision, kind.scale)))
        elif pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
            schema = schema.set(k, field.with_type(pa.string() if pa.types.is_string_view(kind) else pa.binary()))
        elif pa.types.is_dictionary(kind) and _stand_in(kind) is not None:
            schema = schema.set(k, field.with_type(_stand_in(kind)))
    return schema


@functools.lru_cache(maxsize=256)
def _stand_in(kind: pa.DataType) -> pa.DataType | None:
    """The type a filter over a column of ``kind`` is bound to, or None when none can be written."""
    try:
        raw = substrait.serialize_expressions([pc.field("c").is_null()], ["filter"], pa.schema([("c", kind)]))
        return substrait.deserialize_expressions(raw).schema.field("c").type
    except (pa.ArrowException, TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=256)
def _stands_in(here: pa.DataType, bound: pa.DataType) -> bool:
    """Whether a filter bound to ``bound`` reads a column of type ``here`` exactly once it is cast to ``bound``."""
    if pa.types.is_decimal32(here) or pa.types.is_decimal64(here):
        return bound.equals(bindable(pa.schema([("c", here)])).field("c").type)
    stand_in = _stand_in(here)
    if stand_in is None or not stand_in.equals(bound):
        return False
    try:
        pa.array([None], here).cast(bound)
    except (pa.ArrowException, TypeError, ValueError):
        return False
    return True


def _same_instants(here: pa.DataType, bound: pa.DataType) -> bool:
    """Whether a column of type ``here`` holds what a filter bound to ``bound`` reads: timestamps of one unit with a
    time zone (Substrait carries no zone name, and a zone changes no stored value)."""
    return (pa.types.is_timestamp(here) and pa.types.is_timestamp(bound) and here.unit == bound.unit
            and here.tz is not None and bound.tz is not None)


# ---------------------------------------------------------------------- --where text


def parse_where(text: str, schema: pa.Schema | Sequence[str]) -> pc.Expression:
    """A filter from SQL text such as ``fare > 10 AND zone IN ('JFK', 'LGA')`` (see :mod:`flightpart.query.predicates`).
    Literals take the type of the column they meet when ``schema`` has types; nothing is evaluated; what cannot be
    translated exactly is InvalidFilter."""
    from .predicates import parse_sql_predicate

    if not isinstance(schema, pa.Schema):
        schema = pa.schema([pa.field(name, pa.null()) for name in schema])
    return parse_sql_predicate(text, bindable(schema))  # a category compared as its values, as DuckDB compares them
