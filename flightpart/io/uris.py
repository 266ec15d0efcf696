"""Addresses of flightpart daemons, as people type them and as Flight needs them.

``head:8815``, ``grpc://head:8815`` and ``grpc+tls://head:8815`` become a Flight location; anything else (a web
address, say) is refused with what to type instead, before it reaches the network.
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
