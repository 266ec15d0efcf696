"""``Dataset.to_polars(lazy=True)``: a Polars ``LazyFrame`` over a dataset, through Polars' IO-plugin interface.

Polars hands the source the columns a query needs, its predicate and a row
limit. Columns become a ``select`` view, and the parts of the predicate
that translate to ``pyarrow.compute`` (comparisons with literals, and/or/
not, is_null, is_in, is_between, datetime/date literals, str.starts_with/ends_with/contains(literal=True)) become
a filter evaluated on the nodes, with Polars' meaning (NaN greater than every number);
the whole predicate is then applied again by Polars on what arrives, so a
part that does not translate is still honoured. A row limit stops the
stream once enough rows came.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from flightpart.errors import PartitionedError
from flightpart.frames import polars_frame, shown_to_polars
from flightpart.query.functions import arrow_call
from flightpart.query.joined import conjunction
from flightpart.query.predicates import Value, column_value, comparison, literal_value, membership

_COMPARE = {"Eq": "eq", "NotEq": "ne", "Lt": "lt", "LtEq": "le", "Gt": "gt", "GtEq": "ge"}


def lazy_frame(ds: Any) -> Any:
    """A LazyFrame whose scans read ``ds`` with Polars' projection, predicate and limit pushed down."""
    import polars as pl
    from polars.io.plugins import register_io_source

    schema = pl.DataFrame(shown_to_polars(ds.to_reader().schema).empty_table()).schema  # one Polars cannot read:
    # a clear error now, not a Rust panic in the middle of a scan

    def source(with_columns: list[str] | None, predicate: Any, n_rows: int | None,
               batch_size: int | None) -> Iterator[Any]:
        view = ds
        needed = list(with_columns) if with_columns is not None else None
        if predicate is not None:
            pushed = to_arrow_expression(predicate, ds.schema)
            if pushed is not None:
                try:
                    view = view.filter(pushed)
                except PartitionedError:
                    pass  # it cannot travel: Polars applies the predicate below all the same
            if needed is not None:
                needed += [c for c in predicate.meta.root_names() if c not in needed]
        if needed is not None:
            view = view.reading(needed)
        if n_rows is not None and predicate is None:
            view = view[:n_rows]  # only the row blocks those rows are in
        remaining = n_rows
        for batch in view.to_batches():
            frame = polars_frame(batch)
            if predicate is not None:
                frame = frame.filter(predicate)
            if with_columns is not None:
                frame = frame.select(with_columns)
            if remaining is not None:
                frame = frame.head(remaining)
                remaining -= frame.height
            if frame.height:
                yield frame
            if remaining is not None and remaining <= 0:
                return

    return register_io_source(source, schema=schema, explain_name="flightpart",
                              explain_detail=f"{ds.name} v{ds.version}")


def to_arrow_expression(predicate: Any, schema: pa.Schema | None = None) -> pc.Expression | None:
    """The translatable conjuncts of a Polars predicate as one pyarrow expression (None: nothing translates).

    Each conjunct keeps Polars' meaning (NaN is greater than every number and
    equal to NaN; a literal meets its column's type), or is left out: Polars
    applies the whole predicate again to what arrives, so a conjunct left out
    costs bytes, never a row.
    """
    try:
        tree = json.loads(predicate.meta.serialize(format="json"))
    except Exception:
        return None
    schema = schema if schema is not None else pa.schema([])
    try:
        return conjunction([e for e in (_translate(c, schema) for c in _conjuncts(tree)) if e is not None])
    except RecursionError:  # a predicate nested deeper than Python walks: Polars applies it to every row read
        return None


def _conjuncts(node: Any) -> list:
    if isinstance(node, dict) and "BinaryExpr" in node and node["BinaryExpr"].get("op") in ("And", "LogicalAnd"):
        return _conjuncts(node["BinaryExpr"]["left"]) + _conjuncts(node["BinaryExpr"]["right"])
    return [node]


_UNITS = {"Nanoseconds": "ns", "Microseconds": "us", "Milliseconds": "ms"}


def _literal(node: Any) -> Value:
    """A Polars literal as an operand, or KeyError for a kind this module does not read."""
    value = node["Literal"]
    inner = value.get("Dyn") or value.get("Scalar")
    (kind, v), = inner.items()
    if v is None:  # Polars writes NaN and the infinities as a float of null: which one is not known
        raise KeyError(f"{kind} literal without its value")
    if kind == "Float16":  # its bits, not its value: 15360 is 1.0 (read as 15360.0, no row had matched)
        return literal_value(struct.unpack("<e", int(v).to_bytes(2, "little"))[0])
    if kind in ("Int", "Float", "String", "Boolean") or kind.startswith(("Int", "UInt", "Float")):
        return literal_value(v)
    if kind == "Datetime":
        count, unit, zone = v
        return literal_value(count, pa.timestamp(_UNITS[unit], tz=(zone or {}).get("inner") if zone else None))
    if kind == "Date":
        return literal_value(v, pa.date32())
    if kind == "Duration":
        count, unit = v
        return literal_value(count, pa.duration(_UNITS[unit]))
    raise KeyError(kind)


def _list_literal(node: Any) -> list:
    """The values of a Polars list literal (serialized as an Arrow IPC stream of one list)."""
    raw = bytes(node["Literal"]["Scalar"]["List"])
    table = pa.ipc.open_stream(raw).read_all()
    return table.column(0).to_pylist()


def _translate(node: Any, schema: pa.Schema) -> pc.Expression | None:
    try:
        return _expr(node, schema).expression
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, pa.ArrowException):
        return None  # InvalidFilter is a ValueError: a conjunct that does not compare exactly is not pushed


def _expr(node: Any, schema: pa.Schema) -> Value:
    if "Column" in node:
        return column_value(schema, node["Column"])
    if "Literal" in node:
        return _literal(node)
    if "BinaryExpr" in node:
        b = node["BinaryExpr"]
        op = b["op"]
        if op in _COMPARE:
            _not_a_condition(b["left"])
            _not_a_condition(b["right"])
        left, right = _expr(b["left"], schema), _expr(b["right"], schema)
        if op in _COMPARE:
            return _boolean(comparison(schema, _COMPARE[op], left, right))
        if op in ("And", "LogicalAnd"):
            return _boolean(left.expression & right.expression)
        if op in ("Or", "LogicalOr"):
            return _boolean(left.expression | right.expression)
        raise KeyError(op)
    if "Function" in node:
        return _function(node["Function"], schema)
    raise KeyError(next(iter(node), "?"))


def _function(f: dict, schema: pa.Schema) -> Value:
    inputs, function = f["input"], f["function"]
    boolean = function.get("Boolean") if isinstance(function, dict) else None
    strings = function.get("StringExpr") if isinstance(function, dict) else None
    if boolean == "IsNull":
        return _boolean(_expr(inputs[0], schema).expression.is_null())
    if boolean == "IsNotNull":
        return _boolean(_expr(inputs[0], schema).expression.is_valid())
    if boolean == "Not":
        return _boolean(~_expr(inputs[0], schema).expression)
    if isinstance(boolean, dict) and ("IsBetween" in boolean or "IsIn" in boolean):
        _not_a_condition(inputs[0])
    if isinstance(boolean, dict) and "IsBetween" in boolean:
        closed = boolean["IsBetween"].get("closed", "Both")
        x, lo, hi = (_expr(i, schema) for i in inputs[:3])
        low = comparison(schema, "ge" if closed in ("Both", "Left") else "gt", x, lo)
        high = comparison(schema, "le" if closed in ("Both", "Right") else "lt", x, hi)
        return _boolean(low & high)
    if isinstance(boolean, dict) and "IsIn" in boolean:
        x = _expr(inputs[0], schema)
        listed = _list_literal(inputs[1])
        values = [v for v in listed if v is not None]
        if not values:
            raise KeyError("empty is_in")
        member = membership(schema, x, [literal_value(v) for v in values])
        if not (boolean["IsIn"] or {}).get("nulls_equal"):
            return _boolean(member)  # a null row is null, as SQL's IN has it
        # nulls_equal: a null row is in the list when the list holds a null, else definitely not (so `~` keeps it)
        nulls = x.expression.is_null()
        return _boolean(member | nulls if None in listed else pc.if_else(nulls, False, member))
    if strings in ("StartsWith", "EndsWith") or (isinstance(strings, dict)
                                                 and strings.get("Contains", {}).get("literal")):
        x, text = _expr(inputs[0], schema), _literal(inputs[1])
        if not isinstance(text.literal, str) or x.type is None or not pa.types.is_string(x.type):
            raise KeyError("string function on a non-string")
        name = ({"StartsWith": "starts_with", "EndsWith": "ends_with"}[strings] if isinstance(strings, str)
                else "contains")
        return _boolean(arrow_call(name, [x.expression], pc.MatchSubstringOptions(text.literal)))
    raise KeyError(str(function))


def _not_a_condition(node: Any) -> None:
    """KeyError (not pushed) for a condition used where a comparison, ``is_between`` or ``is_in`` reads its operand:
    their translations use it two or three times (its value, its NaN test, its validity), so conditions compared
    inside conditions grow as 3^depth (Polars applies such a predicate to the rows it reads)."""
    if "BinaryExpr" in node and node["BinaryExpr"].get("op") in (*_COMPARE, "And", "LogicalAnd", "Or", "LogicalOr"):
        raise KeyError("a condition compared")
    function = node.get("Function", {}).get("function") if isinstance(node.get("Function"), dict) else None
    if isinstance(function, dict) and "Boolean" in function:
        raise KeyError("a condition compared")


def _boolean(expression: pc.Expression) -> Value:
    return Value(expression, pa.bool_())
