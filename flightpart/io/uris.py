"""Addresses of flightpart daemons, as people type them and as Flight needs them.

People write ``head:8815``, ``grpc://head:8815`` or, with TLS,
``grpc+tls://head:8815``; a web address (``http://head:8815``) is a common
slip when a daemon's metrics or status page is on the same host. One
function turns all of them into a Flight location or says, in one line,
what to type instead, so no command reaches the network with an address
gRPC cannot use (it would answer with a misleading "not found").
"""

from __future__ import annotations

FLIGHT_SCHEMES = ("grpc", "grpc+tcp", "grpc+tls")


def flight_uri(text: str, *, tls: bool = False) -> str:
    """``text`` as a Flight location: a bare ``host:port`` gets ``grpc://`` (``grpc+tls://`` when ``tls``)."""
    text = text.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = ("grpc+tls" if tls else "grpc"), text
    if scheme not in FLIGHT_SCHEMES:
        raise ValueError(f"{text!r} is not a flightpart address: daemons speak gRPC, so write "
                         f"grpc://{rest or 'HOST:PORT'} (grpc+tls:// when they serve TLS)")
    host, colon, port = rest.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise ValueError(f"{text!r} has no port: write {scheme}://HOST:PORT, e.g. {scheme}://{rest or 'head'}:8815")
    return f"{scheme}://{rest}"
