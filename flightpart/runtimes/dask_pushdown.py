"""Dask's row filters pushed into flightpart reads: ``ddf[ddf.fare > 30]`` reads only the rows it keeps.

A predicate is pushed only when it translates exactly: comparisons (``<``, ``<=``, ``>``, ``>=``, ``==``) of
one column with a plain constant, joined by ``&`` and ``|``. Rows come with their positions, so the index is
the unfiltered read's and only the bytes moved change; anything else stays a Dask filter (decision 0016).
"""

from __future__ import annotations

import operator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from flightpart.query.filters import Filter

try:  # dask-expr's optimizer, where this dask has it (its expressions are the extension point read_parquet uses)
    from dask.dataframe.dask_expr._expr import (
        EQ,
        GE,
        GT,
        LE,
        LT,
        And,
        Expr,
        Or,
        Projection,
        is_filter_pushdown_available,
    )
    from dask.dataframe.dask_expr._expr import Filter as DaskFilter
    from dask.dataframe.dask_expr.io import FromMapProjectable

    PUSHDOWN_AVAILABLE = True
    COMPARISONS: dict[type, Any] = {LT: operator.lt, LE: operator.le, GT: operator.gt, GE: operator.ge, EQ: operator.eq}
except ImportError:  # pragma: no cover - an older dask: filters stay in Dask
    PUSHDOWN_AVAILABLE = False
    FromMapProjectable = object  # type: ignore[assignment,misc]
    COMPARISONS = {}


_FLIPPED = {operator.lt: operator.gt, operator.le: operator.ge, operator.gt: operator.lt, operator.ge: operator.le,
            operator.eq: operator.eq}


def arrow_predicate(predicate: Any, frame_name: str) -> pc.Expression | None:
    """``predicate`` (a dask-expr expression over the frame ``frame_name``) as an Arrow expression, or None when
    any part of it cannot be translated exactly."""
    if isinstance(predicate, (And, Or)):
        left, right = arrow_predicate(predicate.left, frame_name), arrow_predicate(predicate.right, frame_name)
        if left is None or right is None:
            return None
        return (left & right) if isinstance(predicate, And) else (left | right)
    compare = COMPARISONS.get(type(predicate))
    if compare is None:
        return None
    left, right = predicate.left, predicate.right
    if isinstance(right, Projection) and not isinstance(left, Expr):
        left, right, compare = right, left, _FLIPPED[compare]
    if not (isinstance(left, Projection) and left.frame._name == frame_name) or isinstance(right, Expr):
        return None
    column = left.operand("columns")
    if isinstance(column, list):
        if len(column) != 1:
            return None
        column = column[0]
    if not isinstance(column, str) or not _plain_constant(right):
        return None
    return compare(pc.field(column), pc.scalar(right.item() if hasattr(right, "item") else right))


def _plain_constant(value: Any) -> bool:
    """A number, string, boolean or point in time, which pandas and Arrow compare alike; not a missing value."""
    import datetime

    if value is None or (isinstance(value, float) and value != value):
        return False
    if hasattr(value, "item") and not hasattr(value, "tz"):  # a NumPy scalar
        value = value.item()
    return isinstance(value, (bool, int, float, str, datetime.date, datetime.datetime, datetime.timedelta))


class FlightpartRead(FromMapProjectable):  # type: ignore[misc,valid-type]
    """``from_map``'s projectable read that also takes dask-expr's row filters, into its ``ReadBlock``."""

    def _simplify_up(self, parent: Any, dependents: Any) -> Any:
        if isinstance(parent, DaskFilter) and is_filter_pushdown_available(self, parent, dependents):
            pushed = self.func.filtered(arrow_predicate(parent.predicate, self._name))
            if pushed is not None:
                return self.substitute_parameters({"func": pushed})
        return super()._simplify_up(parent, dependents)


def compiled(expression: pc.Expression | None, schema: pa.Schema) -> Filter | None:
    """``expression`` bound to ``schema``, or None when it does not bind (a constant of another type: left to Dask)."""
    if expression is None:
        return None
    try:
        return Filter.compile(expression, schema)
    except Exception:  # any refusal: Dask filters the rows
        return None
