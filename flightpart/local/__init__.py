"""Clusters on this machine: the embedded one behind ``fp.connect()``, daemons as child processes
(:class:`LocalCluster`, what tests and the demo run), hosts in network namespaces (:class:`NetCluster`)
and the compose example's client."""

from .cluster import Daemon, LocalCluster
from .embedded import start_embedded
from .netcluster import Host, NetCluster

__all__ = ["Daemon", "Host", "LocalCluster", "NetCluster", "start_embedded"]
