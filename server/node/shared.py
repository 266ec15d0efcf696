"""What a node's concerns share: the daemon's settings, the state :class:`~.server.NodeServer` builds, and the
few calls every concern makes.

Each concern is a mixin of :class:`NodeBase` and imports no other: a call another concern answers is made on
``self``, which the composed :class:`~.server.NodeServer` answers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from flightpart.errors import RequestRejected, StorageFull, StorageUnwritable
from flightpart.io.connections import ConnectionPool
from flightpart.io.counters import Counters
from flightpart.io.errors import translated
from flightpart.io.leader import CatalogAddresses
from flightpart.wire import VERSION_LIMIT

from ..base import ServiceBase
from ..store import PartitionStore, StoredPartition

log = logging.getLogger("flightpart.node")


def within_limit(dataset: str, version: int, field: str) -> None:
    """INVALID_REQUEST for a version past :data:`~flightpart.wire.VERSION_LIMIT` (no catalog hands one out)."""
    if version > VERSION_LIMIT:
        raise RequestRejected(f"version {version:,} of {dataset} is past the {VERSION_LIMIT:,} a dataset may reach; a "
                              "catalog hands out no such number", field=field)


def _stats_weight(stats: dict | None) -> int:
    """An upper bound of the JSON size of a partition's statistics, without encoding them."""
    def size(v: Any) -> int:
        return 6 * len(v) + 2 if isinstance(v, str) else len(str(v))  # JSON escapes a character in at most 6

    return sum(6 * len(column) + 48 + sum(size(v) for v in entry.values()) for column, entry in (stats or {}).items())


def held_weight(stored: StoredPartition) -> int:
    """About what one partition weighs in a ``held`` reply or a registration."""
    return 120 + _stats_weight(stored.stats)


class NodeBase(ServiceBase):
    """What every concern of a node may use: the state :class:`~.server.NodeServer` builds, and the calls below."""

    log = log
    role = "node"
    streams_timed = True
    wrong_daemon_hint = "; client commands talk to the catalog: point --catalog (or $FLIGHTPART_CATALOG) at its address"

    store: PartitionStore
    node_id: str
    ip: str
    pid: int
    min_free_bytes: int
    counters: Counters
    pool: ConnectionPool
    catalogs: CatalogAddresses | None
    """The cluster's catalogs (several when they share a lease): reports go to the leader, followed when it moves."""
    heartbeat_interval: float
    stopping: threading.Event
    """Set when the node shuts down: its background loops end."""

    @property
    def catalog_uri(self) -> str | None:
        """The catalog this node reports to: the leader, as last heard of."""
        return self.catalogs.current if self.catalogs is not None else None

    def to_catalog(self, body: Any, timeout: float | None = None) -> Any:
        """An action at the leading catalog (a standby's NOT_LEADER followed, one that does not answer skipped)."""
        assert self.catalogs is not None
        with translated():
            return self.catalogs.call(lambda uri: self.pool.action(uri, body, timeout=timeout))

    def free_bytes(self) -> int | None:
        try:
            return self.store.free_bytes()
        except OSError:
            return None

    @contextlib.contextmanager
    def counting_errors(self, what: str) -> Iterator[None]:
        """Count a refused call (:meth:`count_error`)."""
        try:
            yield
        except BaseException as exc:
            self.count_error(what, exc)
            raise

    def count_error(self, what: str, exc: BaseException) -> None:
        """Count a refused call; a write refused for a full disk also as such, with a warning in the log."""
        if isinstance(exc, StorageUnwritable):
            self.counters.add(errors=1)
            log.error("refused a %s: the data disk refused a write", what)
        elif isinstance(exc, StorageFull):
            self.counters.add(errors=1, storage_full_refusals=1)
            log.warning("refused a %s: the disk is full (%s bytes free)", what, self.free_bytes())
        else:
            self.counters.add(errors=1)
