"""flightpart: partitioned, distributed dataframes shared over Arrow Flight.

The top level holds what needs no running service (the ``__partitioned__``
protocol, tiling rules, ``__distarray__``) plus :func:`connect` and
:func:`publish`, which talk to a cluster.
"""

from __future__ import annotations

from typing import Any

from . import distarray, errors, protocol, wire
from . import lenient as _lenient
from .errors import (
    CannotStart,
    ClientClosed,
    DatasetNotFound,
    FlightpartError,
    Forbidden,
    ForeignCluster,
    InvalidName,
    LimitExceeded,
    NodeConflict,
    NodeUnavailable,
    OutcomeUnknown,
    PartitionDamaged,
    PartitionedError,
    PartitionMissing,
    RequestRejected,
    SchemaMismatch,
    ServerBusy,
    ServerError,
    ServerStarting,
    StorageFull,
    StorageUnwritable,
    Unauthenticated,
    VersionConflict,
    VersionExpired,
)
from .lenient import from_partitioned
from .protocol import IdentityGet, PartitionedFrame, partitioned
from .tiling import default_partition, local_target_of_slice
from .version import __version__


def connect(uri: str | None = None, **kwargs: Any):
    """A :class:`flightpart.client.Client` for the catalog at ``uri`` (or ``$FLIGHTPART_CATALOG``).

    With neither, an embedded node and catalog start in this process and
    stop when the client is closed (see :mod:`flightpart.tools.embedded`).
    """
    import os

    from .client import CATALOG_ENV
    from .client import connect as _connect

    if uri is None and not os.environ.get(CATALOG_ENV):
        from .tools.embedded import start_embedded

        return start_embedded()
    return _connect(uri, **kwargs)


def validate(obj: Any, *, require_pickle: bool = False, lenient: bool = False) -> dict:
    """Check ``obj`` (or its ``__partitioned__``) against the spec and return the dict.

    Exact to the spec by default. ``lenient=True`` first reads the forms
    producers really emit (``flightpart.lenient.FORMS``: bare IP strings,
    MPI ranks as locations, extra keys, a missing ``shape``, a ``get`` for
    one object) and returns the dict in the spec's form.
    """
    if lenient:
        return _lenient.validate_lenient(obj, require_pickle=require_pickle)
    return protocol.validate(obj, require_pickle=require_pickle)


def publish(name: str, frame: Any, *, rank: int, nranks: int, catalog: str, **kwargs: Any):
    """SPMD-style put: each rank sends its rows to the node on its own host."""
    from .client.spmd_publish import publish as _publish

    return _publish(name, frame, rank=rank, nranks=nranks, catalog=catalog, **kwargs)


def traffic() -> dict[str, int]:
    """Partition bytes this process has sent, received over the network and read from local memory maps.

    Counted since the process started, by every client and ``get`` in it:
    compare two readings to see what an operation moved through this
    process (a repartition moves nothing; a local neighbour is mapped).
    """
    from .io.transfer import TRAFFIC

    return TRAFFIC.snapshot()


def __getattr__(name: str):
    """``fp.dask``, ``fp.ray`` and ``fp.spmd``, imported on first use (they pull in their runtimes)."""
    if name in ("dask", "ray", "spmd"):
        import importlib

        module = importlib.import_module(f".runtimes.{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'flightpart' has no attribute {name!r}")


__all__ = [
    "CannotStart",
    "ClientClosed",
    "DatasetNotFound",
    "FlightpartError",
    "Forbidden",
    "ForeignCluster",
    "IdentityGet",
    "InvalidName",
    "LimitExceeded",
    "NodeConflict",
    "NodeUnavailable",
    "PartitionDamaged",
    "PartitionMissing",
    "PartitionedError",
    "PartitionedFrame",
    "RequestRejected",
    "SchemaMismatch",
    "ServerBusy",
    "ServerStarting",
    "ServerError",
    "StorageFull",
    "StorageUnwritable",
    "Unauthenticated",
    "OutcomeUnknown",
    "VersionConflict",
    "VersionExpired",
    "__version__",
    "connect",
    "default_partition",
    "distarray",
    "errors",
    "from_partitioned",
    "local_target_of_slice",
    "partitioned",
    "publish",
    "traffic",
    "validate",
    "wire",
]
