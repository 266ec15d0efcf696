"""flightpart.client: what a user holds (``Client``, ``Dataset``, the picklable ``get``)."""

from __future__ import annotations

import os

from .client import Client
from .dataset import Dataset
from .fetch import FlightGet, PartitionRef

CATALOG_ENV = "FLIGHTPART_CATALOG"
TOKEN_ENV = "FLIGHTPART_TOKEN"


def connect(uri: str | None = None, *, host: str | None = None, token: str | None = None,
            tls_root_certs: bytes | None = None) -> Client:
    """A client of the catalog at ``uri`` (or ``$FLIGHTPART_CATALOG``).

    With neither, an embedded node and catalog start in this process and
    stop when the client is closed. ``host`` overrides which address counts
    as this host for locality (also ``$FLIGHTPART_HOST``).
    """
    uri = uri or os.environ.get(CATALOG_ENV)
    token = token or os.environ.get(TOKEN_ENV)
    if uri is None:
        from .embedded import start_embedded

        return start_embedded()
    if "://" not in uri:
        uri = f"grpc://{uri}"
    return Client(uri, host=host, token=token, tls_root_certs=tls_root_certs)


__all__ = ["Client", "Dataset", "FlightGet", "PartitionRef", "connect"]
