"""Where a query meets the data: filters, per-partition statistics and the pruning they allow, aggregates
(partial on the nodes, combined on the reader), and :func:`apply_ticket`, which applies a ticket to a table.

Buffers received over Flight need not be aligned, and Acero warns per misaligned buffer; flightpart sets
``ACERO_ALIGNMENT_HANDLING=reallocate`` (unless set) so Acero copies only those buffers, with the same answer.

The names below are imported on first use: :mod:`flightpart.wire`, a core module, reads :mod:`.functions`, and
importing this package must not import the modules that read the wire.
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
