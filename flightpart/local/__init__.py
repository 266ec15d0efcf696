"""Clusters on this machine: the embedded one behind ``fp.connect()``, daemons as child processes
(:class:`LocalCluster`, what the demo and the attack tests run), servers inside this process
(:class:`InProcessCluster`, for the other tests), hosts in network namespaces (:class:`NetCluster`)
and the compose example's client."""

from .cluster import Daemon, LocalCluster
from .embedded import start_embedded
from .inprocess import InProcessCluster
from .netcluster import Host, NetCluster

__all__ = ["Daemon", "Host", "InProcessCluster", "LocalCluster", "NetCluster", "start_embedded"]
