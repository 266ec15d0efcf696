"""Leadership: which of several catalogs leads (the lease, :mod:`.lease`), what a standby answers, and what a
catalog does when it takes over (tells every node, builds the FlightInfos) or loses the lead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from flightpart.errors import FlightpartError, NotLeader
from flightpart.wire import GetLeadership, Lead, Leadership

from ..base import Action
from ..info_cache import FlightInfoCache
from ..state.records import NodeRecord
from .lease import LeaseRow
from .orders import NodeOrders

log = logging.getLogger("flightpart.catalog")


class Leading(NodeOrders):
    """A catalog's part as leader or standby."""

    _infos: FlightInfoCache  # set by the composed server (:class:`~.server.CatalogServer`), as below
    _cluster_id: str | None
    _identity_known: threading.Event
    _stopping: threading.Event

    def refusal(self, rpc: str, args: tuple) -> NotLeader | None:
        """A standby answers every call (but ``leadership``) with NOT_LEADER, naming the leader when it knows it."""
        lease = self.__dict__.get("lease")
        if lease is None or lease.leads() or lease.serves_from_memory():
            return None  # cut off from its database with no other leader known: reads from memory, writes refused
        if rpc == "do_action" and args and getattr(args[0], "type", None) == GetLeadership.ACTION:
            return None
        leader = lease.leader()
        return NotLeader(f"{self.uri} is a standby catalog; the leader is {leader or 'being elected (retry shortly)'}",
                         field=leader)

    def leader_among(self, uris: Sequence[str]) -> LeaseRow | None:
        """The catalog among ``uris`` that says it leads (asked by a catalog that cannot reach the database)."""
        for uri in uris:
            try:
                answer = self.pool.action(uri, GetLeadership(), timeout=1.0)
            except Exception:  # down, cut off too, or not a catalog any more: ask the next
                continue
            if answer.role == "leader" and answer.leader == uri:
                return LeaseRow(uri, answer.epoch or 0, answer.since or 0.0, True)
        return None

    def lost_lead(self) -> None:
        """Another catalog leads: what this one built or heard as leader is not to be trusted if it leads again."""
        self._infos.clear()
        self.state.forget_datagram_clocks()

    def took_over(self, epoch: int) -> None:
        """This catalog leads from ``epoch``: its state is read afresh and every node is told at once."""
        self._infos.clear()
        self.state.take_over()
        if self._cluster_id is not None and self.state.cluster() is None:
            self.state.mint_cluster(self._cluster_id)
        if self.state.cluster() is not None:
            self._identity_known.set()
        threading.Thread(target=self._announce, args=(epoch,), name="flightpart-announce", daemon=True).start()

    def _announce(self, epoch: int) -> None:
        cluster = self.state.cluster()
        order = Lead(cluster, epoch, self.uri)

        def tell(node: NodeRecord) -> None:
            self.pool.action(node.uri, order, timeout=min(self.fan_out_timeout, 2.0))
            self.state.heard(node.node_id)

        told = self.fan_out(self.state.nodes(), tell, f"lead (epoch {epoch})")
        self.state.announced()
        log.info("epoch %d: %d nodes follow this catalog", epoch, told)
        self.warm_later()

    def warm_later(self) -> None:
        if not self._stopping.wait(self.WARM_AFTER):
            self._warm()

    WARM_AFTER = 1.0
    """Seconds after a takeover (or a start) before the FlightInfos are built: waiting writers go first (decision
    0019)."""

    def _warm(self) -> None:
        """Build the FlightInfo of every dataset's latest version after a takeover or a start (decision 0019)."""
        started = time.monotonic()
        try:
            for name in self.state.latest_versions():
                if self.lease is not None and not self.lease.leads():
                    return
                self.cached_info(*name)
        except FlightpartError as exc:
            log.info("warming the FlightInfos stopped: %s", exc)
            return
        except Exception:  # the state closing under a catalog that stops: opens build what they need
            if not self._stopping.is_set():
                log.exception("warming the FlightInfos failed")
            return
        log.info("FlightInfos of every dataset's latest version built in %.2f s", time.monotonic() - started)

    def _leadership(self, _: GetLeadership) -> Leadership:
        return self.leadership()

    def leadership(self) -> Leadership:
        """Which catalog leads (this one alone, without a lease), since when, its epoch, and the standbys."""
        if self.lease is None:
            return Leadership("single", self.uri, self.uri)
        return Leadership(**self.lease.describe())

    def problems(self) -> list[str]:
        """Why the catalog cannot answer, if it cannot: its state database does not. Empty: SERVING."""
        found = [] if self.state.ping() else ["the state database does not answer"]
        if self.lease is not None and self.lease.serves_from_memory():
            found.append("this catalog's lease could not be renewed (the state database does not answer): read-only")
        return found


ACTIONS = (
    Action(GetLeadership, Leading._leadership, "which catalog leads, since when, its epoch, and the standbys (any "
           "catalog answers)", "read", changes_state=False),
)
"""The actions this part serves, added to the catalog's table (:attr:`~.server.CatalogServer.actions`)."""
