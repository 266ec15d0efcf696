"""The catalog daemon, cut by concern: each module is one part of :class:`CatalogServer` and serves its own actions.

:mod:`.orders` (what the catalog tells nodes; the base of every part), :mod:`.lease` and :mod:`.leadership` (which
catalog leads), :mod:`.registry` (nodes registering and beating), :mod:`.versions` (begin, commit, abort, drop),
:mod:`.repair` (repair and scrub), :mod:`.publish` (SPMD publish), :mod:`.reads` (FlightInfos, status, stats), and
:mod:`.server` (:class:`CatalogServer`, composed of them). Its state lives in :mod:`flightpart.server.state`.
"""

from .server import CatalogServer

__all__ = ["CatalogServer"]
