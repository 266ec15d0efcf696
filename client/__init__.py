"""flightpart.client: what a user holds (``Client``, ``Dataset``, the picklable ``get``)."""

from __future__ import annotations

import os
from pathlib import Path

from flightpart.connections import client_certificate

from .client import Client
from .dataset import Dataset
from .fetch import FlightGet, PartitionRef

CATALOG_ENV = "FLIGHTPART_CATALOG"
TOKEN_ENV = "FLIGHTPART_TOKEN"
TLS_CA_ENV = "FLIGHTPART_TLS_CA"


def connect(uri: str | None = None, *, host: str | None = None, token: str | None = None,
            tls_root_certs: bytes | None = None, cert_chain: bytes | None = None, private_key: bytes | None = None) -> Client:
    """A client of the catalog at ``uri`` (or ``$FLIGHTPART_CATALOG``).

    ``$FLIGHTPART_TOKEN`` and ``$FLIGHTPART_TLS_CA`` (a PEM file) supply the
    token and the CA when not given. With neither URI, an embedded node and catalog start in this process and
    stop when the client is closed. ``host`` overrides which address counts
    as this host for locality (also ``$FLIGHTPART_HOST``).
    """
    uri = uri or os.environ.get(CATALOG_ENV)
    token = token or os.environ.get(TOKEN_ENV)
    if tls_root_certs is None and os.environ.get(TLS_CA_ENV):
        tls_root_certs = Path(os.environ[TLS_CA_ENV]).read_bytes()
    if cert_chain is None and tls_root_certs is not None:
        cert_chain, private_key = client_certificate()
    if uri is None:
        from .embedded import start_embedded

        return start_embedded()
    if "://" not in uri:
        uri = f"grpc://{uri}"
    return Client(uri, host=host, token=token, tls_root_certs=tls_root_certs, cert_chain=cert_chain, private_key=private_key)


__all__ = ["Client", "Dataset", "FlightGet", "PartitionRef", "connect"]
