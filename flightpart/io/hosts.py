"""Which host this process is on, for locality decisions.

A partition is local when one of its locations' IP is an address of this host. ``FLIGHTPART_HOST`` (or
``host=``) overrides the detection, so a test cluster on 127.0.0.x can play several hosts.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache

HOST_ENV = "FLIGHTPART_HOST"


@lru_cache(maxsize=1)
def _interface_addresses() -> frozenset[str]:
    addrs: set[str] = set()
    try:
        import psutil

        for entries in psutil.net_if_addrs().values():
            for entry in entries:
                if entry.family in (socket.AF_INET, socket.AF_INET6):
                    addrs.add(entry.address.split("%")[0])
    except Exception:  # psutil missing or the OS refuses: fall back to the resolver
        pass
    try:
        addrs.add(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    addrs.add("127.0.0.1")
    return frozenset(addrs)


def host_addresses(override: str | None = None) -> frozenset[str]:
    """The addresses that count as "this host" (a host name given counts with its address)."""
    chosen = override or os.environ.get(HOST_ENV)
    if chosen:
        return frozenset({chosen, _resolve(chosen)})
    return _interface_addresses()


@lru_cache(maxsize=64)
def _resolve(name: str) -> str:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


def advertised_ip(override: str | None = None) -> str:
    """The one address this process names in ``location`` tuples."""
    chosen = override or os.environ.get(HOST_ENV)
    if chosen:
        return chosen
    try:
        ip = socket.gethostbyname(socket.gethostname())
        if ip:
            return ip
    except OSError:
        pass
    return "127.0.0.1"
