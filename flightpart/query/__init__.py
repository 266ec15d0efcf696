"""Where a query meets the data: filters (decoded, applied, parsed from ``--where``), per-partition
statistics and the pruning they allow, aggregates (partial on the nodes, combined on the reader),
and :func:`apply_ticket`, the one function that applies what a ticket asks to a partition's table.

Acero (under filters, ``group_by`` and the aggregates) checks that each input buffer is aligned to its type's
width. Buffers received over Flight need not be (gRPC hands out its own slices), and by default Acero then
prints a warning per buffer. flightpart asks Acero to copy such a buffer into an aligned one instead
(``ACERO_ALIGNMENT_HANDLING=reallocate``, unless the environment already says otherwise): the answer is the
same, nothing misaligned reaches a kernel, and the copy costs only the misaligned buffers (a partial aggregate's
few rows; memory-mapped partitions are aligned as written).


The names below are imported on first use: :mod:`flightpart.wire`, a core module, reads the table of
:mod:`.functions`, and importing this package must not import the modules that read the wire.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "reallocate")

_FROM = {"apply_ticket": "apply", "Filter": "filters", "parse_where": "filters", "Pruner": "pruning",
         "StatsBuilder": "statistics", "guarantee": "statistics"}

__all__ = ["Filter", "Pruner", "StatsBuilder", "apply_ticket", "guarantee", "parse_where"]


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_FROM[name]}", __name__), name)
    globals()[name] = value
    return value
