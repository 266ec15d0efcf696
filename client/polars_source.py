"""``Dataset.to_polars(lazy=True)``: a Polars ``LazyFrame`` over a dataset, through Polars' IO-plugin interface.

Polars hands the source the columns a query needs, its predicate and a row
limit. Columns become a ``select`` view, and the parts of the predicate
that translate to ``pyarrow.compute`` (comparisons with literals, and/or/
not, is_null, is_in, is_between) become a filter evaluated on the nodes;
the whole predicate is then applied again by Polars on what arrives, so a
part that does not translate is still honoured. A row limit stops the
stream once enough rows came.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from flightpart.errors import PartitionedError
from flightpart.query.filters import conjunction

_COMPARE = {"Eq": "equal", "NotEq": "not_equal", "Lt": "less", "LtEq": "less_equal", "Gt": "greater", "GtEq": "greater_equal"}


def lazy_frame(ds: Any) -> Any:
    """A LazyFrame whose scans read ``ds`` with Polars' projection, predicate and limit pushed down."""
    import polars as pl
    from polars.io.plugins import register_io_source

    schema = pl.from_arrow(ds.to_reader().schema.empty_table()).schema

    def source(with_columns: list[str] | None, predicate: Any, n_rows: int | None, batch_size: int | None) -> Iterator[Any]:
        view = ds
        needed = list(with_columns) if with_columns is not None else None
        if predicate is not None:
            pushed = to_arrow_expression(predicate)
            if pushed is not None:
                try:
                    view = view.filter(pushed)
                except PartitionedError:
                    pass  # it cannot travel: Polars applies the predicate below all the same
            if needed is not None:
                needed += [c for c in predicate.meta.root_names() if c not in needed]
        if needed is not None:
            view = view.select(needed)
        if n_rows is not None and predicate is None:
            view = view[:n_rows]  # only the row blocks those rows are in
        remaining = n_rows
        for batch in view.to_batches():
            frame = pl.from_arrow(batch)
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


def to_arrow_expression(predicate: Any) -> pc.Expression | None:
    """The translatable conjuncts of a Polars predicate as one pyarrow expression (None: nothing translates)."""
    try:
        tree = json.loads(predicate.meta.serialize(format="json"))
    except Exception:
        return None
    return conjunction([e for e in (_translate(c) for c in _conjuncts(tree)) if e is not None])


def _conjuncts(node: Any) -> list:
    if isinstance(node, dict) and "BinaryExpr" in node and node["BinaryExpr"].get("op") in ("And", "LogicalAnd"):
        return _conjuncts(node["BinaryExpr"]["left"]) + _conjuncts(node["BinaryExpr"]["right"])
    return [node]


def _literal(node: Any) -> Any:
    """A literal's Python value, or raise KeyError for one this module does not read."""
    value = node["Literal"]
    inner = value.get("Dyn") or value.get("Scalar")
    (kind, v), = inner.items()
    if kind in ("Int", "Float", "String", "Boolean") or kind.startswith(("Int", "UInt", "Float")):
        return v
    raise KeyError(kind)


def _translate(node: Any) -> pc.Expression | None:
    try:
        return _expr(node)
    except (KeyError, TypeError, ValueError, AttributeError, pa.ArrowException):
        return None


def _expr(node: Any) -> pc.Expression:
    if "Column" in node:
        return pc.field(node["Column"])
    if "Literal" in node:
        return pc.scalar(_literal(node))
    if "BinaryExpr" in node:
        b = node["BinaryExpr"]
        op = b["op"]
        left, right = _expr(b["left"]), _expr(b["right"])
        if op in _COMPARE:
            return pc.Expression._call(_COMPARE[op], [left, right])
        if op in ("And", "LogicalAnd"):
            return left & right
        if op in ("Or", "LogicalOr"):
            return left | right
        raise KeyError(op)
    if "Function" in node:
        f = node["Function"]
        inputs, function = f["input"], f["function"]
        boolean = function.get("Boolean") if isinstance(function, dict) else None
        if boolean == "IsNull":
            return _expr(inputs[0]).is_null()
        if boolean == "IsNotNull":
            return _expr(inputs[0]).is_valid()
        if boolean == "Not":
            return ~_expr(inputs[0])
        if isinstance(boolean, dict) and "IsBetween" in boolean:
            closed = boolean["IsBetween"].get("closed", "Both")
            x, lo, hi = _expr(inputs[0]), _expr(inputs[1]), _expr(inputs[2])
            low = (x >= lo) if closed in ("Both", "Left") else (x > lo)
            high = (x <= hi) if closed in ("Both", "Right") else (x < hi)
            return low & high
        raise KeyError(str(function))
    raise KeyError(next(iter(node), "?"))
