"""Clusters on this machine: embedded (``fp.connect()``), child processes (:class:`LocalCluster`), servers in
this process (:class:`InProcessCluster`) and hosts in network namespaces (:class:`NetCluster`)."""

from .cluster import Daemon, LocalCluster
from .embedded import start_embedded
from .inprocess import InProcessCluster
from .netcluster import Host, NetCluster

__all__ = ["Daemon", "Host", "InProcessCluster", "LocalCluster", "NetCluster", "start_embedded"]
