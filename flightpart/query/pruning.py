"""Which row blocks a filter can match, decided from the partitions' statistics before any stream opens.

Each row block's *guarantee* (:func:`flightpart.query.statistics.guarantee`) becomes the partition expression of
a fragment of a ``FileSystemDataset``, and Arrow's expression simplification says whether the filter can be
true under it. No file is opened.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from flightpart.query.filters import bindable
from flightpart.query.functions import DECIDED_BY_STATISTICS, arrow_call
from flightpart.query.joined import conjunction
from flightpart.query.statistics import guarantee


class Pruner:
    """Guarantees of the row blocks of one dataset version."""

    def __init__(self, schema: pa.Schema, blocks: Mapping[int, tuple[int, Sequence[dict | None]]]):
        """``blocks``: row block -> (its rows, the statistics of each of its partitions)."""
        schema = bindable(schema)  # as filters are bound: a view or a category as its values
        self.empty = {i for i, (rows, _stats) in blocks.items() if rows == 0}
        self.known: list[int] = []
        expressions = []
        for i, (rows, stats) in sorted(blocks.items()):
            if rows == 0:
                continue
            g = conjunction([g for s in stats if s for g in [guarantee(s, schema, rows)] if g is not None])
            if g is None:
                continue  # nothing known: the block may match anything
            self.known.append(i)
            expressions.append(g)
        self._dataset = None
        if self.known:
            self._dataset = pads.FileSystemDataset.from_paths(
                [f"block-{i}" for i in self.known], schema=schema, format=pads.IpcFileFormat(),
                filesystem=pafs.LocalFileSystem(), partitions=expressions)

    def _kept(self, expression: pc.Expression) -> set[int]:
        if self._dataset is None:
            return set()
        return {int(f.path.rsplit("-", 1)[1]) for f in self._dataset.get_fragments(filter=expression)}

    def cannot_match(self, expression: pc.Expression) -> set[int]:
        """Blocks where no row can satisfy ``expression`` (empty blocks included)."""
        if _compares_with_nan(expression):
            return set(self.empty)
        return self.empty | (set(self.known) - self._kept(expression))

    def all_match(self, expression: pc.Expression) -> set[int]:
        """Blocks where every row satisfies ``expression`` (it is neither false nor null on any row)."""
        if _compares_with_nan(expression):
            return set()
        fails = ~expression | arrow_call("is_null", [expression])
        return set(self.known) - self._kept(fails)


_NAN = re.compile(r"(?<![\w.])-?nan(?![\w.])")
_CALLED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\(")


def _compares_with_nan(expression: pc.Expression) -> bool:
    """Whether ``expression`` may compare with a NaN, which Arrow's simplification orders against block bounds unlike
    any comparison kernel: a NaN literal, or a value computed by a function not marked ``statistics`` in
    :mod:`flightpart.query.functions`. Statistics then decide nothing."""
    text = str(expression)
    return _NAN.search(text) is not None or not set(_CALLED.findall(text)) <= DECIDED_BY_STATISTICS
