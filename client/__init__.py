"""flightpart.client: what a user holds (``Client``, ``Dataset``, the picklable ``get``)."""

from __future__ import annotations

import os

from flightpart.io.access import Access
from flightpart.io.leader import split_addresses
from flightpart.io.sign_in import exchanged, signed_in
from flightpart.io.uris import flight_uri

from .client import Client
from .dataset import Dataset
from .fetch import FlightGet, PartitionRef

CATALOG_ENV = "FLIGHTPART_CATALOG"
USER_ENV = "FLIGHTPART_USER"
PASSWORD_ENV = "FLIGHTPART_PASSWORD"
"""A user's name and password, read when no token, user or password is given (a token in $FLIGHTPART_TOKEN then
goes unused)."""


def connect(uri: str | None = None, *, host: str | None = None, token: str | None = None,
            tls_root_certs: bytes | None = None, cert_chain: bytes | None = None, private_key: bytes | None = None,
            access: Access | None = None, timeout: float = 30.0, idle_timeout: float = 2.0,
            compression: str = "auto", streams_per_partition: int = 1, user: str | None = None,
            password: str | None = None) -> Client:
    """A client of the catalog at ``uri`` (or ``$FLIGHTPART_CATALOG``); ValueError without either (for an embedded
    cluster, call ``flightpart.connect()`` with no address).

    ``uri`` may list every catalog of a cluster sharing a lease (``"grpc://a:8815,grpc://b:8815"``): calls follow
    the leader. Credentials not given come from ``$FLIGHTPART_TOKEN``, ``$FLIGHTPART_TLS_CA`` and
    ``$FLIGHTPART_TLS_CERT``/``$FLIGHTPART_TLS_KEY``, or all at once from ``access``. ``host`` (or
    ``$FLIGHTPART_HOST``) says which address is this host. ``timeout`` bounds every catalog call (a put: plus its
    size at 16 MB/s); a read stream silent for ``idle_timeout`` seconds moves to the next replica.
    ``compression``: ``"auto"`` (ZSTD only from nodes over links measured slower than about 2 Gbit/s), ``"off"``,
    ``"zstd"`` or ``"lz4"``; stored files are never compressed. ``streams_per_partition`` above 1 reads a large
    remote partition (32 MiB or more) as that many row ranges at once. ``user`` and ``password`` sign in as a user
    of the catalog (its session token then goes with every call, to the nodes too); an identity provider's token
    given as ``token`` (a JWT) is exchanged for a session the same way. With none of them, ``$FLIGHTPART_USER`` and
    ``$FLIGHTPART_PASSWORD`` sign in.
    """
    uri = uri or os.environ.get(CATALOG_ENV)
    if uri is None:
        raise ValueError(f"no catalog address: pass a URI such as grpc://head:8815 or set ${CATALOG_ENV} "
                         "(flightpart.connect() with no address starts an embedded cluster)")
    if access is None:
        access = Access.from_environment(token=token, tls_root_certs=tls_root_certs, cert_chain=cert_chain,
                                         private_key=private_key)
    uris = [flight_uri(one, tls=access.tls) for one in split_addresses(uri)]
    if user is None and password is None and token is None and os.environ.get(USER_ENV):
        user, password = os.environ[USER_ENV], os.environ.get(PASSWORD_ENV)
    if user is not None or password is not None:
        if user is None or password is None:
            raise TypeError("connect() got a user without a password, or a password without a user: give both")
        access = signed_in(uris, access, user, password)
    else:
        access = exchanged(uris, access)
    uri = ",".join(uris)
    return Client(uri, host=host, access=access, timeout=timeout, idle_timeout=idle_timeout, compression=compression,
                  streams_per_partition=streams_per_partition)


__all__ = ["Access", "Client", "Dataset", "FlightGet", "PartitionRef", "connect"]
