"""The registry of nodes: registrations (what a node holds, the seals and drops it missed), one node id per
live process, heartbeats (over Flight or in datagrams), clock skew, and when the live nodes can be told from the dead.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import Forbidden, ForeignCluster, NodeConflict
from flightpart.tokens import manifest_signed
from flightpart.wire import (
    VERSION_LIMIT,
    Commit,
    GetNodeInfo,
    Heartbeat,
    HeartbeatReply,
    ListNodes,
    NodeList,
    NodeRow,
    RegisterNode,
    RegisterReply,
    VersionRef,
    pages,
)

from ..auth import CLOCK_MARGIN, authorize, wall_clock
from ..base import Action, boundary
from ..beats import BeatListener, udp_heartbeats_enabled
from ..info_cache import FlightInfoCache
from ..state.records import PartRecord, Registration, VersionRecord
from .orders import NodeOrders, manifest_of

log = logging.getLogger("flightpart.catalog")


def versions_named(b: RegisterNode) -> list[int]:
    """Every version number a registration names: its partitions, versions, manifests and tombstones."""
    named = [p.version for p in b.partitions] + [v.version for v in (*b.versions, *b.sealed_versions)]
    return named + [m.version for m in b.sealed] + [v for t in b.tombstones for v in (t.dropped_through, *t.dropped,
                                                                                      *t.aborted)]


def within_version_limit(b: RegisterNode) -> RegisterNode:
    """``b`` without the entries naming a version past :data:`~flightpart.wire.VERSION_LIMIT` (no catalog hands
    such out), with a warning; the entries, not the registration, so one planted file cannot shut a node out."""
    largest = max(versions_named(b), default=0)
    if largest <= VERSION_LIMIT:
        return b
    log.warning("register-node %s: left out what it said of versions past %d, which no catalog hands out (the largest "
                "it named: %d)", b.node_id, VERSION_LIMIT, largest)

    def within(version: int) -> bool:
        return version <= VERSION_LIMIT

    return dataclasses.replace(
        b, partitions=tuple(p for p in b.partitions if within(p.version)),
        versions=tuple(v for v in b.versions if within(v.version)),
        sealed_versions=tuple(v for v in b.sealed_versions if within(v.version)),
        sealed=tuple(m for m in b.sealed if within(m.version)),
        tombstones=tuple(dataclasses.replace(t, dropped_through=t.dropped_through if within(t.dropped_through) else 0,
                                             dropped=tuple(v for v in t.dropped if within(v)),
                                             aborted=tuple(v for v in t.aborted if within(v))) for t in b.tombstones))


def granted_to(node_id: str, manifests: list[Commit]) -> set[tuple[str, int, tuple[int, int]]]:
    """(dataset, version, part) the (signed) manifests list ``node_id`` as holding."""
    return {(m.dataset, m.version, p.part) for m in manifests for p in m.partitions if node_id in p.nodes}


def manifest_record(m: Commit) -> VersionRecord:
    """A version as a node's manifest describes it, for a catalog rebuilding its state."""
    parts = [PartRecord(p.part, p.start, p.shape, 0, []) for p in m.partitions]
    return VersionRecord(m.dataset, m.version, m.schema.serialize().to_pybytes(), m.shape, m.tiling, parts,
                         max(1, m.replicas))


class Registry(NodeOrders):
    """Nodes joining, beating and listed."""

    _infos: FlightInfoCache  # set by the composed server (:class:`~.server.CatalogServer`), as below
    _started: float
    _identity_known: threading.Event
    _without_identity: set[str]
    _registering: dict[str, float]
    _skewed: set[str]
    _owes_registration: set[str]
    _grants: dict[str, set[tuple[str, int, tuple[int, int]]]]
    _stopping: threading.Event

    def _register_node(self, b: RegisterNode) -> RegisterReply:
        began = time.time()
        if b.more:  # a registration in pages: what it clears (``missed``) is what was written before its first page
            self._registering.setdefault(b.node_id, began)
        cluster = self.state.adopt_cluster(b.cluster)
        if b.cluster is not None and b.cluster != cluster:
            raise ForeignCluster(f"node {b.node_id} at {b.uri} belongs to cluster {b.cluster}, this catalog is cluster "
                                 f"{cluster}",
                                 field="register-node.cluster")
        credential = self.caller.credential
        if credential.role == "node" and credential.name != b.node_id:
            raise Forbidden(f"a node token for {credential.name} cannot register node {b.node_id}",
                            field="register-node.node_id")
        self._check_identity(b)
        b = within_version_limit(b)
        held = [{"dataset": p.dataset, "version": p.version, "part": p.part, "nbytes": p.nbytes, "stats": p.stats}
                for p in b.partitions]
        trusted = self._signed_by_us(b.node_id, b.sealed)
        grants = self._grants.setdefault(b.node_id, set())
        grants.update(granted_to(b.node_id, trusted))
        if not b.more:
            self._grants.pop(b.node_id, None)
        orphans, to_seal, gone = self.state.register_node(Registration(
            b.node_id, b.uri, b.ip, b.pid, b.data_dir, held, [manifest_record(m) for m in trusted],
            [(v.dataset, v.version) for v in b.versions], [(v.dataset, v.version) for v in b.sealed_versions], grants,
            b.tombstones))
        self._identity_learned(cluster, b.node_id)
        for dataset, version in gone:  # a node heard a drop this catalog's state lost: every holder deletes it
            log.warning("%s v%d: node %s says it was dropped or aborted; forgotten here too", dataset, version,
                        b.node_id)
            self._infos.clear()
            self.drop_files(dataset, version, self.state.nodes())
        manifests = (self.signed(manifest_of(self.state.version(d, v))) for d, v in to_seal)
        seal, more = next(pages(manifests, lambda m: len(m.encode()), self.REPLY_BYTES))
        if more:  # the rest when it registers again, once this registration is done
            self._owes_registration.add(b.node_id)
        if not b.more and b.node_id in self._owes_registration:
            self._owes_registration.discard(b.node_id)
            self.state.must_register(b.node_id)
        elif not b.more:
            self.state.registered(b.node_id, self._registering.pop(b.node_id, began))
        return RegisterReply(b.node_id, cluster, tuple(VersionRef(d, v) for d, v in orphans), tuple(seal), self.epoch(),
                             self.revocation_entries())

    def _signed_by_us(self, node_id: str, sealed: tuple[Commit, ...]) -> list[Commit]:
        """The manifests this catalog signed; any other is logged and not taken as a commit (nor as a placement)."""
        if self.secret is None:
            return list(sealed)  # an open cluster: every caller is trusted anyway
        trusted = []
        for m in sealed:
            if manifest_signed(self.secret, m.to_json(), m.signature):
                trusted.append(m)
            else:
                self.telemetry.refused("unsigned_manifest")
                log.warning("node %s sent a manifest of %s v%d that this catalog did not sign: not taken as a commit",
                            node_id, m.dataset, m.version)
        return trusted

    REPLY_BYTES = 4 << 20
    """About how many bytes of manifests one answer to a registration carries."""

    def _identity_learned(self, cluster: str | None, node_id: str) -> None:
        """Nodes registered while the cluster had no identity register again once it has one, and join it."""
        if cluster is None:
            self._without_identity.add(node_id)
            return
        self._identity_known.set()
        waiting, self._without_identity = self._without_identity, set()
        self.state.must_register_all(waiting - {node_id})

    def cluster_for_write(self) -> str:
        """The cluster's identity, for a write: on new or lost state, nodes holding data have ``rebuild_grace``
        seconds from the start to tell theirs, then a new one is made."""
        known = self.state.cluster()
        if (known is not None and self._identity_known.is_set()
                and time.monotonic() >= self._started + self.rebuild_grace):
            return known
        remaining = self._started + self.rebuild_grace - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)  # writes wait for the rebuild: every live node re-registers within a heartbeat
        cluster = self.state.mint_cluster()
        self._identity_learned(cluster, "")
        return cluster

    def _check_identity(self, b: RegisterNode) -> None:
        """One node id, one live process (a copy of a live node's data directory is refused); one address, one
        node (an address where another live node still answers as itself is refused)."""
        other = next((n for n in self.state.nodes() if n.uri == b.uri and n.node_id != b.node_id and n.alive), None)
        if other is not None and self._node_at(b.uri) == other.node_id:  # else the old process is gone: it moves
            raise NodeConflict(f"{b.uri} is served by node {other.node_id}, not {b.node_id}", field="register-node.uri")
        known = self.state.node(b.node_id)
        if known is None or not known.alive or known.uri == b.uri:
            return  # new, dead, or the same address restarting
        if self._node_at(known.uri) == b.node_id:  # else the old process does not answer: the id moves to the new one
            raise NodeConflict(
                f"node id {b.node_id} is already served by {known.uri} (pid {known.pid}); a copied data directory "
                "needs an identity of its own: remove its flightpart-node.json to give it a fresh one",
                field="register-node.node_id")

    def _node_at(self, uri: str) -> str | None:
        """The id of the node answering at ``uri`` now, or None when nothing answers there (within 2 s at most)."""
        try:
            return self.pool.action(uri, GetNodeInfo(), timeout=min(self.node_timeout, 2.0)).node_id
        except Exception:
            self.pool.discard(uri)
            return None

    def _heartbeat(self, b: Heartbeat) -> HeartbeatReply:
        credential = self.caller.credential
        if credential.role == "node" and credential.name != b.node_id:
            raise Forbidden(f"a node token for {credential.name} cannot speak for node {b.node_id}",
                            field="heartbeat.node_id")
        return self._beat_reply(self._take_beat(b), b.asks_clock)

    def _take_beat(self, beat: Heartbeat, *, datagram: bool = False) -> bool:
        """Note a heartbeat; False when the node must register first, or (a datagram) this catalog does not lead or
        the beat could be a replay. Only a beat taken has its clock looked at: made-up ids leave nothing behind."""
        if not self.state.knows(beat.node_id) or (datagram
                                                  and not self.state.datagram_fresh(beat.node_id, beat.clock_ms)):
            return False
        skew = self._clock_skew(beat.node_id, beat.clock_ms)
        return self.state.heartbeat(beat.node_id, beat.free_bytes, beat.low_space, skew, beat.clock_ms,
                                    datagram=datagram)

    def listen_for_beats(self, host: str) -> BeatListener | None:
        """Heartbeats in datagrams on this catalog's port (UDP), unless turned off, the port is taken, or TLS is
        on without a secret to sign them (TLS promised who may speak)."""
        if not udp_heartbeats_enabled() or (self.uri.startswith("grpc+tls") and self.secret is None):
            return None
        try:
            return BeatListener(host, self.port, self.secret, self.state.knows, self._beat_in_datagram)
        except OSError as exc:
            log.warning("heartbeats come over Flight only: UDP %s:%d cannot be listened on: %s", host, self.port, exc)
            return None

    def _beat_in_datagram(self, beat: Heartbeat) -> bool:
        """A datagram's heartbeat, taken as over Flight when this catalog leads (a standby declines it)."""
        return self.refusal("do_action", ()) is None and self._take_beat(beat, datagram=True)

    _BEAT_REPLIES = {known: [flight.Result(pa.py_buffer(HeartbeatReply(known).encode()))] for known in (True, False)}

    @staticmethod
    def _beat_reply(known: bool, asks_clock: bool | None) -> HeartbeatReply:
        """The answer to a beat; with this catalog's clock when the node asks for it (it judges expiry by it)."""
        return HeartbeatReply(known, int(wall_clock() * 1000) if asks_clock and known else None)

    def do_action(self, context: Any, action: flight.Action) -> list[flight.Result]:
        """Heartbeats take a short path (decision 0020); anything unusual, and every other action, the table's."""
        if action.type == Heartbeat.ACTION and action.body is not None:
            with boundary(self.log, "action 'heartbeat'", self.telemetry, context):
                beat = Heartbeat.decode_plain(action.body.to_pybytes())
                if beat is not None:
                    credential = authorize(context, "node")
                    if credential.role != "node" or credential.name == beat.node_id:
                        known = self._take_beat(beat)
                        if not beat.asks_clock:
                            return self._BEAT_REPLIES[known]
                        return [flight.Result(pa.py_buffer(self._beat_reply(known, True).encode()))]
        return super().do_action(context, action)

    def _clock_skew(self, node_id: str, clock_ms: int | None) -> float | None:
        """Seconds the node's clock (sent in its heartbeat) runs ahead of ours; a warning when the two disagree by
        more than :data:`~flightpart.server.auth.CLOCK_MARGIN`, once until they agree again.

        The beat's travel time counts as the node being behind.
        """
        if clock_ms is None:
            return None
        skew = round(clock_ms / 1000 - wall_clock(), 3)
        if abs(skew) > CLOCK_MARGIN:
            if node_id not in self._skewed:
                self._skewed.add(node_id)
                log.warning("node %s: its clock is %+.1f s from the catalog's, more than the %g s margin for token "
                            "expiry; synchronise the clocks (NTP)", node_id, skew, CLOCK_MARGIN)
        elif node_id in self._skewed:
            self._skewed.discard(node_id)
            log.info("node %s: its clock agrees with the catalog's again (%+.1f s)", node_id, skew)
        return skew

    def _nodes(self, _: ListNodes) -> NodeList:
        """Every known node, once this catalog can tell the live from the dead (:meth:`wait_until_nodes_are_known`)."""
        self.wait_until_nodes_are_known()
        return NodeList(tuple(NodeRow(**n.as_json()) for n in self.state.nodes()))

    def wait_until_nodes_are_known(self) -> None:
        """Wait until every node was heard from since the start or takeover, or stayed silent ``dead_after``: before,
        a node not heard from is not known dead, and repairs, placements and appends would judge it so."""
        while (left := self.state.unsettled_for()) > 0 and not self._stopping.is_set():
            self._stopping.wait(min(left, 0.1))


ACTIONS = (
    Action(RegisterNode, Registry._register_node, "a node announces itself and what its data directory holds", "node"),
    Action(Heartbeat, Registry._heartbeat, "a node is alive", "node", changes_state=False),
    Action(ListNodes, Registry._nodes, "every known node, alive or not", "read", changes_state=False),
)
"""The actions this part serves, added to the catalog's table (:attr:`~.server.CatalogServer.actions`)."""
