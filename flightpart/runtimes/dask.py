"""Dask as producer and consumer of ``__partitioned__``."""

from __future__ import annotations

from typing import Any


class DaskGather:
    """Picklable ``get`` for ``distributed.Future`` handles: gathers them.

    Uses the client of the calling context (``distributed.get_client``), so
    it works on the driver and inside tasks alike.
    """

    def __call__(self, handles: Any) -> Any:
        from distributed import get_client

        client = get_client()
        if isinstance(handles, (list, tuple)):
            return client.gather(list(handles))
        return client.gather(handles)

    def __eq__(self, other: object) -> bool:
        return type(other) is DaskGather

    def __hash__(self) -> int:
        return hash(DaskGather)
