"""Where a query meets the data: filters (decoded, applied, parsed from ``--where``), per-partition
statistics and the pruning they allow, aggregates (partial on the nodes, combined on the reader),
and :func:`apply_ticket`, the one function that applies what a ticket asks to a partition's table."""

from .apply import apply_ticket
from .filters import Filter, parse_where
from .pruning import Pruner
from .statistics import StatsBuilder, guarantee

__all__ = ["Filter", "Pruner", "StatsBuilder", "apply_ticket", "guarantee", "parse_where"]
