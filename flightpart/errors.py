"""The exceptions flightpart raises.

One small hierarchy so that callers can catch ``FlightpartError`` for anything
of ours, or a specific subclass, and so that messages can say what to do.
Each one also derives from the builtin a Python user would expect
(``ValueError`` for bad input, ``LookupError`` for unknown names,
``ConnectionError`` for unreachable nodes).
"""

from __future__ import annotations


class FlightpartError(Exception):
    """Base class of every error flightpart raises on purpose."""


class PartitionedError(FlightpartError, ValueError):
    """A ``__partitioned__`` dict (or a ``__distarray__`` dict) breaks the spec.

    The message names the offending field, e.g.
    ``partitions[(1, 0)].start: expected 2 integers, got (4,)``.
    """


class InvalidName(FlightpartError, ValueError):
    """A dataset name outside ``[A-Za-z0-9][A-Za-z0-9_.-]{0,127}``."""


class DatasetNotFound(FlightpartError, LookupError):
    """No committed dataset (or version) of that name exists in the catalog."""


class NodeUnavailable(FlightpartError, ConnectionError):
    """No replica of a partition could be reached, or no node is alive."""


class SchemaMismatch(FlightpartError, ValueError):
    """Data sent for a partition does not fit the dataset's schema or shape."""
