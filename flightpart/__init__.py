"""flightpart: partitioned, distributed dataframes shared over Arrow Flight.

The top level holds what needs no running service (the ``__partitioned__``
protocol, tiling rules, ``__distarray__``) plus :func:`connect` and
:func:`publish`, which talk to a cluster.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version as _dist_version
from typing import Any

from . import distarray
from .errors import (
    DatasetNotFound,
    FlightpartError,
    InvalidName,
    NodeUnavailable,
    PartitionedError,
    SchemaMismatch,
)
from .protocol import IdentityGet, PartitionedFrame, from_partitioned, partitioned, validate
from .tiling import default_partition, local_target_of_slice

try:
    __version__ = _dist_version("flightpart")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"


def connect(uri: str | None = None, **kwargs: Any):
    """A :class:`flightpart.client.Client` for the catalog at ``uri``.

    With no ``uri`` an embedded node and catalog start in this process.
    """
    from .client import connect as _connect

    return _connect(uri, **kwargs)


def publish(name: str, frame: Any, *, rank: int, nranks: int, catalog: str, **kwargs: Any):
    """SPMD-style put: each rank sends its rows to the node on its own host."""
    from .client.spmd_publish import publish as _publish

    return _publish(name, frame, rank=rank, nranks=nranks, catalog=catalog, **kwargs)


def __getattr__(name: str):
    """``fp.dask``, ``fp.ray`` and ``fp.spmd``, imported on first use (they pull in their runtimes)."""
    if name in ("dask", "ray", "spmd"):
        import importlib

        module = importlib.import_module(f".runtimes.{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'flightpart' has no attribute {name!r}")


__all__ = [
    "DatasetNotFound",
    "FlightpartError",
    "IdentityGet",
    "InvalidName",
    "NodeUnavailable",
    "PartitionedError",
    "PartitionedFrame",
    "SchemaMismatch",
    "__version__",
    "connect",
    "default_partition",
    "distarray",
    "from_partitioned",
    "local_target_of_slice",
    "partitioned",
    "publish",
    "validate",
]
