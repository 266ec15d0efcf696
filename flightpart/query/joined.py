"""Boolean expressions joined as balanced trees, since pyarrow's Substrait writer writes each argument twice and a
filter's size doubles with each level of nesting."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow.compute as pc


def conjunction(terms: Sequence[pc.Expression]) -> pc.Expression | None:
    """``terms[0] & terms[1] & ...`` as a balanced tree (:func:`balanced`), or None for no terms."""
    return balanced(terms, lambda a, b: a & b)


def disjunction(terms: Sequence[pc.Expression]) -> pc.Expression | None:
    """``terms[0] | terms[1] | ...`` as a balanced tree (:func:`balanced`), or None for no terms."""
    return balanced(terms, lambda a, b: a | b)


def balanced(terms: Sequence[pc.Expression],
             join: Callable[[pc.Expression, pc.Expression], pc.Expression]) -> pc.Expression | None:
    """``terms`` joined pairwise, level by level: as deep as log2 of their number, so the filter's Substrait size
    (:func:`~flightpart.query.filters.substrait_bound`) grows linearly, not exponentially."""
    level = list(terms)
    if not level:
        return None
    while len(level) > 1:
        level = [join(level[k], level[k + 1]) if k + 1 < len(level) else level[k] for k in range(0, len(level), 2)]
    return level[0]

