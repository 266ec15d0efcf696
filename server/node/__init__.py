"""A node of a flightpart cluster, cut by concern; :class:`NodeServer` composes them.

``shared`` (what every concern may use), ``catalog_link`` (registration, heartbeats, the catalog's orders),
``integrity`` (scrubs, checks, reports of what is lost), ``puts`` and ``gets`` (the data streams), ``actions``
(the node's own actions), ``server`` (the composed Flight server).
"""

from .server import NodeServer

__all__ = ["NodeServer"]
