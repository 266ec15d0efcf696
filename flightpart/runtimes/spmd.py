"""MPI-style SPMD programs: every rank publishes and opens its own part.

Ranks come from mpi4py under an MPI launcher, else from the launcher's environment (``RANK`` and
``WORLD_SIZE``, or Open MPI's and PMI's variables). The catalog comes from ``catalog=`` or
``$FLIGHTPART_CATALOG``; each rank talks to the node on its own host.
"""

from __future__ import annotations

import os
import time
from typing import Any

from flightpart.errors import FlightpartError
from flightpart.io.access import Access

RANK_VARIABLES = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"), ("RANK", "WORLD_SIZE"))


def _mpi_comm() -> Any:
    if not any(os.environ.get(r) for r, _ in RANK_VARIABLES[:2]):
        return None  # not under an MPI launcher: do not initialise MPI
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD


def world() -> tuple[int, int]:
    """(rank, size) of this process in its SPMD job."""
    comm = _mpi_comm()
    if comm is not None:
        return comm.Get_rank(), comm.Get_size()
    for rank_var, size_var in RANK_VARIABLES:
        if os.environ.get(rank_var) is not None and os.environ.get(size_var) is not None:
            rank, size = int(os.environ[rank_var]), int(os.environ[size_var])
            if not 0 <= rank < size:
                raise FlightpartError(f"${rank_var}={rank} is not in [0, ${size_var}={size})")
            return rank, size
    return 0, 1


def _catalog(catalog: str | None) -> str:
    uri = catalog or os.environ.get("FLIGHTPART_CATALOG")
    if not uri:
        raise FlightpartError("no catalog: pass catalog= or set $FLIGHTPART_CATALOG")
    return uri


def publish(name: str, frame: Any, *, catalog: str | None = None, host: str | None = None, wait: float = 120.0) -> dict:
    """This rank's rows become partition ``(rank, 0)`` of the next version of ``name``; returns once every
    rank's part is committed (an MPI barrier, else polling the catalog for at most ``wait`` seconds)."""
    from flightpart.client import Client
    from flightpart.client.spmd_publish import publish as publish_part

    rank, size = world()
    uri = _catalog(catalog)
    result = publish_part(name, frame, rank=rank, nranks=size, catalog=uri, host=host)
    comm = _mpi_comm()
    if comm is not None:
        comm.Barrier()
        return {**result, "complete": True}
    deadline = time.monotonic() + wait
    with Client(uri, host=host, access=Access.from_environment()) as client:
        while result["version"] not in client.versions(name):
            if time.monotonic() > deadline:
                raise FlightpartError(f"{name} v{result['version']}: not all {size} ranks published within {wait}s")
            time.sleep(0.05)
    return {**result, "complete": True}


def open(name: str, *, catalog: str | None = None, host: str | None = None, version: int | None = None) -> Any:
    """This rank's SPMD view of ``name``: ``locals``, others' data ``None``, ``__distarray__``."""
    from flightpart.client import Client

    rank, size = world()
    with Client(_catalog(catalog), host=host, access=Access.from_environment()) as client:
        return client.open(name, version, rank=rank, nranks=size)
