"""A node's Flight server, composed of its concerns: stores partitions, serves them, reports to its catalog.

:class:`NodeServer` builds the state its concerns share (:class:`~.shared.NodeBase`) and takes the rest from
them: the catalog link (:mod:`.catalog_link`), integrity (:mod:`.integrity`), the put and get streams
(:mod:`.puts`, :mod:`.gets`) and its own actions (:mod:`.actions`); its action table is the one each concern
adds to. Each method does one thing and hands Arrow objects to Arrow: ``do_get`` returns a
``RecordBatchStream`` over a memory-mapped table (projection and row ranges are zero-copy slices), so no Python
runs per batch.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from typing import Any

from flightpart.errors import CannotStart
from flightpart.io import inprocess
from flightpart.io.access import Access
from flightpart.io.allocator import keep_freed_memory
from flightpart.io.connections import ConnectionPool
from flightpart.io.counters import Counters
from flightpart.io.hosts import advertised_ip
from flightpart.io.layout import default_data_dir
from flightpart.io.leader import CatalogAddresses, split_addresses
from flightpart.tokens import Keys, outdated_format, role_token, verify_token
from flightpart.version import __version__

from ..assembler import Assembler
from ..base import action_table
from ..beats import ANSWER_SECONDS, DatagramBeats
from ..settings import NodeSettings
from ..store import PartitionStore
from .actions import NODE_ACTIONS, NodeActions
from .catalog_link import CATALOG_ORDERS, CatalogLink
from .gets import GetStreams
from .integrity import INTEGRITY_ACTIONS, Integrity
from .puts import PutStreams

NODE_COUNTERS = ("bytes_sent", "rows_sent", "batches_sent", "partitions_served", "bytes_received", "partitions_stored",
                 "put_streams", "errors", "storage_full_refusals", "partitions_assembled", "partitions_linked",
                 "assembled_rows",
                 "pulled_bytes", "streams_compressed", "partitions_damaged", "partitions_missing", "scrubbed_bytes",
                 "get_streams", "stale_orders")
"""What a node's ``stats`` action and metrics count."""


def node_name(keys: Keys | None, token: str | None) -> str | None:
    """The node a node credential names (None without one); a token this cluster did not sign for a node is refused."""
    if token is None:
        return None
    credential = verify_token(keys, token, time.time()) if keys is not None else None
    if credential is None or credential.role != "node":
        outdated = outdated_format(token)
        why = (f"it is an {outdated} token, signed with an earlier release's key" if outdated else
               "it is not a node token of this cluster (or it has expired, or there is no --verify-key-file to "
               "check it)")
        raise CannotStart(f"the node token cannot be used: {why}; mint one with "
                          "`flightpart token --role node --name NODE`")
    return credential.name


class NodeServer(CatalogLink, Integrity, PutStreams, GetStreams, NodeActions):
    """One node of a flightpart cluster."""

    def __init__(self, settings: NodeSettings, *, secret: Keys | None = None, token: str | None = None,
                 pool: ConnectionPool | None = None, direct_reads: bool = True, **server_kwargs: Any):
        """A node serving as ``settings`` say (:meth:`NodeSettings.in_process` for one run inside a program); ``secret``
        checks callers' tokens, ``token`` is its own node token, ``pool`` its connections to the other daemons, and
        ``server_kwargs`` the Flight server's TLS settings. ``direct_reads``: a client in this process reads the
        stored table itself (off: it streams, as from anywhere)."""
        host, port, advertise = settings.host, settings.port, settings.advertise
        super().__init__(host, port, secret=secret, max_streams=settings.max_streams, advertise=advertise,
                         stream_idle_timeout=settings.stream_idle_timeout, **server_kwargs)
        advertise_ip = settings.advertise_ip
        if advertise_ip is None and advertise:
            advertise_ip = socket.gethostbyname(advertise)
        self.ip = advertise_ip or (host if host not in ("0.0.0.0", "::", "") else advertised_ip())
        self.store = PartitionStore(settings.data_dir or default_data_dir(),
                                    max_partition_bytes=settings.max_partition_bytes, max_maps=settings.max_maps,
                                    group=settings.group, node_id=node_name(secret, token))
        self.min_free_bytes = settings.min_free_bytes
        self.node_id = self.store.node_id
        self.pid = os.getpid()
        keep_freed_memory()  # receiving puts and pulls: freed buffers reused, not faulted in again per partition
        self.counters = Counters(NODE_COUNTERS)
        # the cluster's catalogs (several when they share a lease): reports go to the leader, followed when it moves
        catalog = settings.catalog
        self.catalogs = CatalogAddresses(split_addresses(catalog)) if catalog else None
        self.heartbeat_interval = heartbeat_interval = settings.heartbeat
        access = pool.access if pool is not None else Access()
        # it speaks to the catalog and to other nodes as the node it is
        if token is not None or isinstance(secret, bytes):
            access = dataclasses.replace(access, token=token or role_token(secret, "node", self.node_id))
        self.pool = ConnectionPool(access)
        self.datagrams = DatagramBeats(access.token, timeout=min(ANSWER_SECONDS, max(0.25, heartbeat_interval / 2)))
        self.assembler = Assembler(self.store, self.pool, self.uri, lambda: self.catalog_uri, self.counters.add)
        self.init_gets()
        self.stopping = threading.Event()
        self.registered = threading.Event()
        self.last_contact: float | None = None  # monotonic time of the catalog's last answer
        self.refused_by_catalog: str | None = None  # why the catalog last refused this node, until it accepts it
        self.scrub_rate = settings.scrub_rate
        self.scrub_interval = settings.scrub_interval
        self.init_integrity()
        if direct_reads:  # a client in this process reads the stored table itself (off: it streams, as from anywhere)
            inprocess.register(self.uri, self.store.open)
        self.load_revocations()  # enforced before the first call is answered, whether the catalog answers or not
        if catalog:
            self.start_reports()
        if self.scrub_interval > 0 and self.scrub_rate > 0:
            self.start_scrubs()

    def info(self) -> dict:
        return {
            "node_id": self.node_id,
            "uri": self.uri,
            "ip": self.ip,
            "pid": self.pid,
            "data_dir": str(self.store.root),
            "version": __version__,
        }

    def shutdown(self) -> None:
        self.stopping.set()
        inprocess.unregister(self.uri)
        self.datagrams.close()
        super().shutdown()

    def problems(self) -> list[str]:
        """Why this node should not get new work, if it should not: its data directory is gone, read-only or nearly
        full, or it is not (or no longer) registered with its catalog. Empty: SERVING."""
        root = self.store.root
        if not root.is_dir():
            return [f"data directory {root} is gone"]
        found = [] if os.access(root, os.W_OK) else [f"data directory {root} is not writable"]
        free = self.free_bytes()
        if free is None or free < self.min_free_bytes:
            found.append(f"low disk space: {free or 0:,} bytes free, below --min-free-bytes {self.min_free_bytes:,}")
        if self.catalog_uri is not None:
            # one heartbeat lost on a busy machine is not a reason to turn probes away: the node re-registers at the
            # next beat, so it is NOT_SERVING only when refused, never registered, or its catalog silent for a while
            silent = time.monotonic() - self.last_contact if self.last_contact is not None else None
            if self.refused_by_catalog is not None:
                found.append(f"the catalog {self.catalog_uri} refused this node: {self.refused_by_catalog}")
            elif silent is None:
                found.append(f"not registered with the catalog {self.catalog_uri} yet")
            elif silent > max(3 * self.heartbeat_interval, 5.0):
                state = "has not answered" if self.registered.is_set() else "has not registered this node"
                found.append(f"the catalog {self.catalog_uri} {state} for {silent:.0f} s")
        return found

    def stats(self) -> dict:
        """Counters for the ``stats`` action and the metrics endpoint."""
        return {**self.counters.snapshot(), "partitions_held": self.store.count(), "maps_open": len(self.store.maps),
                "free_bytes": self.free_bytes() or 0, "open_streams": self.guard.open_streams,
                "refused_calls": self.guard.refused, "problems": self.problems()}

    actions = action_table(*NODE_ACTIONS, *CATALOG_ORDERS, *INTEGRITY_ACTIONS)
