"""Partial aggregates answered from a partition's statistics, without asking its node.

A partition's statistics (:mod:`.statistics`) hold each column's null count and, for a column without nulls, its
exact min and max. So, with no group keys and no computed column, a block whose kept rows are known
(:meth:`~flightpart.client.plan.Plan.kept_by_statistics`) gives ``count(*)`` as that number, and one whose every
row is kept gives ``count(column)`` as its rows less the column's nulls and ``min``/``max`` as the recorded bounds.
Anything else (a sum, a mean, a key, a bound not recorded) is left for the node: the answer is exactly what the
node's partial would be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from flightpart.wire import Aggregate

from .functions import AGGREGATE
from .statistics import scalar_of


def partial_from_statistics(agg: Aggregate, expected: pa.Schema, kept: int, rows: int,
                            stats_of: Callable[[str], dict[str, Any] | None]) -> pa.Table | None:
    """The partial of ``agg`` (of schema ``expected``) over a block of ``rows`` rows of which the view keeps
    ``kept``, from ``stats_of(column)`` (the statistics of the column's partition, None: not known); None when
    statistics cannot answer it exactly (each function's ``statistics`` in :mod:`.functions`)."""
    if agg.by or agg.computed:
        return None
    pairs = list(dict.fromkeys((c, p) for c, f in agg.functions for p in AGGREGATE[f].partials))
    ways = [way for _c, p in pairs for way in [AGGREGATE[p].statistics] if way is not None]
    if len(ways) != len(pairs) or len(pairs) != len(expected):
        return None
    values = []
    for (column, _function), way, field in zip(pairs, ways, expected):
        if way == "kept":
            values.append(pa.array([kept], field.type))
            continue
        if kept == 0:
            values.append(pa.array([0 if way == "valid" else None], field.type))
            continue
        entry = stats_of(column) if kept == rows else None  # a subset of rows has no recorded bounds or nulls
        if not isinstance(entry, dict) or not isinstance(entry.get("nulls"), int):
            return None
        if way == "valid":
            values.append(pa.array([rows - entry["nulls"]], field.type))
        elif entry["nulls"] == 0 and "min" in entry and "max" in entry and not (
                isinstance(entry[way], float) and entry[way] == 0):  # -0.0 or 0.0: the bound lost its sign
            try:
                values.append(pa.array([scalar_of(entry[way], field.type)], field.type))
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                return None  # statistics this reader cannot type
        else:
            return None
    return pa.table(values, schema=expected)
