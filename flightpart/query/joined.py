"""Boolean expressions joined as balanced trees.

pyarrow's Substrait writer writes each argument of a call twice, so what a
filter costs to send doubles with each level of its nesting: terms joined
left to right (``a | b | c ...``) nest as deep as they are many, joined
pairwise level by level only as deep as log2 of their number.
"""

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
    """``terms`` joined pairwise, level by level: as deep as log2 of their number, not as their number. pyarrow's
    Substrait writer writes each argument of a call twice, so what an expression costs to send doubles with each
    level of nesting (:func:`~flightpart.query.filters.substrait_bound`): 30 terms chained take 2^30 times a term."""
    level = list(terms)
    if not level:
        return None
    while len(level) > 1:
        level = [join(level[k], level[k + 1]) if k + 1 < len(level) else level[k] for k in range(0, len(level), 2)]
    return level[0]

