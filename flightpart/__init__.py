"""flightpart: partitioned, distributed dataframes shared over Arrow Flight.

The top level holds what needs no running service (the ``__partitioned__``
protocol, tiling rules, ``__distarray__``) plus :func:`connect` and
:func:`publish`, which talk to a cluster.
"""

from __future__ import annotations

from typing import Any

from . import distarray, errors, protocol
from . import lenient as _lenient
from . import wire as wire  # fp.wire: the messages, reachable but not among the names `import *` gives
from .errors import (
    CannotStart,
    ClientClosed,
    DatasetNotFound,
    FlightpartError,
    Forbidden,
    ForeignCluster,
    InvalidExpression,
    InvalidFilter,
    InvalidName,
    LimitExceeded,
    NodeConflict,
    NodeUnavailable,
    NotLeader,
    OutcomeUnknown,
    PartitionDamaged,
    PartitionedError,
    PartitionMissing,
    QueryTimeout,
    RequestRejected,
    SchemaMismatch,
    ServerBusy,
    ServerError,
    ServerStarting,
    StaleEpoch,
    StateUnavailable,
    StorageFull,
    StorageUnwritable,
    Unauthenticated,
    UserNotFound,
    VersionConflict,
    VersionExpired,
)
from .lenient import from_partitioned
from .protocol import IdentityGet, PartitionedFrame, partitioned
from .tiling import default_partition, local_target_of_slice
from .version import __version__


def connect(uri: str | None = None, *, host: str | None = None, token: str | None = None,
            tls_root_certs: bytes | None = None, cert_chain: bytes | None = None, private_key: bytes | None = None,
            access: Any = None, timeout: float = 30.0, idle_timeout: float = 2.0, compression: str = "auto",
            streams_per_partition: int = 1, data_dir: str | None = None, user: str | None = None,
            password: str | None = None):
    """A :class:`flightpart.client.Client` for the catalog at ``uri`` (or ``$FLIGHTPART_CATALOG``).

    With neither, an embedded node and catalog start in this process and
    stop when the client is closed (see :mod:`flightpart.local.embedded`);
    ``host``, ``timeout``, ``idle_timeout``, ``compression`` and
    ``streams_per_partition`` apply to it as to any cluster, ``data_dir``
    keeps its partitions (default: a temporary folder). Credentials name a
    cluster that has them, so with no address they are refused (TypeError),
    as ``data_dir`` is with one. Every keyword is described at
    :func:`flightpart.client.connect`.
    """
    import os

    from .client import CATALOG_ENV
    from .client import connect as _connect

    options = {"host": host, "timeout": timeout, "idle_timeout": idle_timeout, "compression": compression,
               "streams_per_partition": streams_per_partition}
    if uri is None and not os.environ.get(CATALOG_ENV):
        given = [k for k, v in {"token": token, "tls_root_certs": tls_root_certs, "cert_chain": cert_chain,
                                "private_key": private_key, "access": access, "user": user,
                                "password": password}.items() if v is not None]
        if given:
            raise TypeError(f"connect() got {', '.join(given)} but no address: the embedded cluster it would start "
                            "takes no credentials (pass the address of the cluster they belong to)")
        from .local import start_embedded

        return start_embedded(data_dir=data_dir, **options)
    if data_dir is not None:
        raise TypeError("connect() got data_dir with an address: data_dir is for the embedded cluster that "
                        "connect() with no address starts (a remote cluster's nodes keep their own)")
    return _connect(uri, token=token, tls_root_certs=tls_root_certs, cert_chain=cert_chain, private_key=private_key,
                    access=access, user=user, password=password, **options)


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


def __getattr__(name: str) -> Any:
    """``fp.Client`` and ``fp.Dataset`` (what :func:`connect` and ``Client.open`` return), and ``fp.dask``,
    ``fp.ray`` and ``fp.spmd``: imported on first use (they pull in Flight and the runtimes)."""
    import importlib

    if name in ("Client", "Dataset"):
        value = getattr(importlib.import_module(".client", __name__), name)
        globals()[name] = value
        return value
    if name in ("dask", "ray", "spmd"):
        module = importlib.import_module(f".runtimes.{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'flightpart' has no attribute {name!r}")


__all__ = [
    "Client",
    "Dataset",
    "CannotStart",
    "ClientClosed",
    "DatasetNotFound",
    "FlightpartError",
    "Forbidden",
    "ForeignCluster",
    "IdentityGet",
    "InvalidExpression",
    "InvalidFilter",
    "InvalidName",
    "LimitExceeded",
    "NodeConflict",
    "NodeUnavailable",
    "PartitionDamaged",
    "PartitionMissing",
    "PartitionedError",
    "PartitionedFrame",
    "QueryTimeout",
    "RequestRejected",
    "SchemaMismatch",
    "ServerBusy",
    "ServerStarting",
    "NotLeader",
    "StateUnavailable",
    "StaleEpoch",
    "ServerError",
    "StorageFull",
    "StorageUnwritable",
    "Unauthenticated",
    "UserNotFound",
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
]
