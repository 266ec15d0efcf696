"""Dask as producer and consumer of ``__partitioned__``."""

from __future__ import annotations

from flightpart.protocol import StatelessGet


class DaskGather(StatelessGet):
    """Picklable ``get`` for ``distributed.Future`` handles: gathers them.

    Uses the client of the calling context (``distributed.get_client``), so
    it works on the driver and inside tasks alike.
    """

    def fetch(self, handles: list) -> list:
        from distributed import get_client

        return get_client().gather(handles)
