"""The catalog daemon, cut by concern: each module is one part of :class:`CatalogServer` and serves its own actions;
:mod:`.orders` is the base of every part, :mod:`.server` composes them. Its state is :mod:`flightpart.server.state`.
"""

from .server import CatalogServer

__all__ = ["CatalogServer"]
