"""The catalog's Flight server: one ``FlightInfo`` per dataset, built from SQLite state.

``get_flight_info(for_path(name))`` answers in the form any Flight client
understands (see :func:`flightpart.wire.encode_flight_info`): the schema,
one endpoint per partition in row-major grid order with the replicas' node
URIs as locations, and JSON metadata that carries the ``__partitioned__``
geometry.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import tiling
from flightpart.errors import (
    DatasetNotFound,
    FlightpartError,
    Forbidden,
    ForeignCluster,
    NodeConflict,
    NodeUnavailable,
    NotLeader,
    PartitionedError,
    RequestRejected,
    SchemaMismatch,
    StaleEpoch,
    StateUnavailable,
    VersionConflict,
    VersionExpired,
)
from flightpart.io.access import Access
from flightpart.io.connections import DEFAULT_TIMEOUT, ConnectionPool
from flightpart.io.errors import translate
from flightpart.io.transfer import put_deadline
from flightpart.tokens import (
    CATALOG_NODE,
    capability,
    manifest_signature,
    manifest_signed,
    put_grant,
    role_token,
    version_grant,
)
from flightpart.wire import (
    SCRUB_DEADLINE,
    VERSION_LIMIT,
    Abort,
    Aborted,
    Begin,
    ClusterScrubReport,
    Commit,
    CommitPart,
    Committed,
    CopyFailed,
    CopyTo,
    Drop,
    DropFiles,
    Dropped,
    GetLeadership,
    GetNodeInfo,
    GetStats,
    Heartbeat,
    HeartbeatReply,
    Held,
    HeldPartition,
    Lead,
    Leadership,
    ListNodes,
    ListVersions,
    NodeList,
    NodeRow,
    NodeScrubReport,
    PartInfo,
    PartPlace,
    PublishBegin,
    PublishPart,
    PublishReply,
    RegisterNode,
    RegisterReply,
    Removed,
    Repair,
    RepairReport,
    ReplicaCopy,
    ReportDamage,
    Scrub,
    ScrubCluster,
    Seal,
    StatsReply,
    VersionInfo,
    VersionList,
    VersionRef,
    VersionReply,
    encode_flight_info,
    error_message,
    pages,
    parse_dataset_path,
)

from .auth import CLOCK_MARGIN, authorize, wall_clock
from .base import Action, ServiceBase, action_table, boundary, schema_error
from .beats import BeatListener, udp_heartbeats_enabled
from .catalog_db import PostgresDatabase
from .catalog_state import (
    LEARNED,
    CatalogState,
    NodeRecord,
    PartRecord,
    VersionRecord,
    order_key,
    pending_per_writer_from_env,
)
from .info_cache import FlightInfoCache
from .lease import LEASE_SECONDS, Lease, LeaseRow
from .status_page import cluster_status
from .telemetry import describe
from .while_alive import call_while_alive

log = logging.getLogger("flightpart.catalog")

REBUILD_GRACE = 5.0
"""Seconds a catalog started without a known cluster identity (new, or its state lost) lets writes wait, so that
every live node (each re-registers within one heartbeat, 2 s by default) can tell it the identity, versions and
tombstones it holds before a version number is handed out (``--rebuild-grace``)."""


def versions_named(b: RegisterNode) -> list[int]:
    """Every version number a registration names: its partitions, versions, manifests and tombstones."""
    named = [p.version for p in b.partitions] + [v.version for v in (*b.versions, *b.sealed_versions)]
    return named + [m.version for m in b.sealed] + [v for t in b.tombstones for v in (t.dropped_through, *t.dropped,
                                                                                      *t.aborted)]


def within_version_limit(b: RegisterNode) -> RegisterNode:
    """``b`` without the entries naming a version past :data:`~flightpart.wire.VERSION_LIMIT`, left out with a
    warning (``b`` itself when it names none, as every honest one). Such a number comes from no catalog: a node
    token's holder pushing a name's counter to the end of the number line, or a file a writer planted on the node.
    Leaving the entries out, not the registration, keeps one planted file from shutting its node out."""
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


def version_info(record: VersionRecord, cap: str | None = None) -> VersionInfo:
    """What the wire says of a stored version (replicas as (uri, ip, pid), live ones first)."""
    shared: dict[tuple[int, ...], tuple] = {}  # a few replica sets serve many partitions: one tuple each

    def replicas(nodes: list) -> tuple:
        key = tuple(map(id, nodes))
        found = shared.get(key)
        if found is None:
            found = shared[key] = tuple((n.uri, n.ip, n.pid) for n in nodes)
        return found

    parts = tuple(PartInfo(p.part, p.start, p.shape, replicas(p.nodes), p.nbytes, p.stats) for p in record.parts)
    return VersionInfo(record.dataset, record.version, pa.ipc.read_schema(pa.py_buffer(record.schema)), record.shape,
                       record.grid, parts, cap)


class CatalogServer(ServiceBase):
    """Aggregates the nodes' partitions into datasets."""

    log = log
    role = "catalog"

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, state_path: str = ":memory:",
                 dead_after: float = 10.0, pending_ttl: float = 3600.0, node_timeout: float = 5.0,
                 fan_out_timeout: float = 2.0, retire_after: float = 86400.0,
                 capability_ttl: float = 86400.0, secret: bytes | None = None, pool: ConnectionPool | None = None,
                 rebuild_grace: float | None = None, cluster_id: str | None = None, lease: str | None = None,
                 lease_seconds: float = LEASE_SECONDS, **server_kwargs: Any):
        super().__init__(host, port, secret=secret, **server_kwargs)
        self._infos = FlightInfoCache()
        # several catalogs, one leader: the state lives in PostgreSQL and only the lease holder writes it
        self.lease = Lease(lease, self.uri, duration=lease_seconds, on_lead=self._took_over,
                           on_lose=self._lost_lead, find_leader=self._leader_among) if lease else None
        database = PostgresDatabase(lease, fence=self.lease.fence, link_timeout=lease_seconds, settings={
            "idle_in_transaction_session_timeout": f"{int(lease_seconds * 1000)}ms"}) if self.lease is not None else None
        self.state = CatalogState(state_path, dead_after=dead_after, database=database)
        self._started = time.monotonic()
        known = self.state.cluster()
        if cluster_id is not None and known is not None and known != cluster_id:
            raise ForeignCluster(f"--cluster-id {cluster_id}: this catalog's state belongs to cluster {known}", field="cluster")
        self._cluster_id = cluster_id
        if cluster_id is not None and self.lease is None:  # with a lease: minted by whichever catalog leads first
            known = self.state.mint_cluster(cluster_id)
        # state that knows its cluster is intact; otherwise (new, or lost) writes wait for the nodes to come back first
        self.rebuild_grace = 0.0 if known is not None else (
            rebuild_grace if rebuild_grace is not None else (0.0 if state_path == ":memory:" else REBUILD_GRACE))
        self._identity_known = threading.Event()
        if known is not None:
            self._identity_known.set()
        self._without_identity: set[str] = set()  # nodes registered before the identity was known: told it later
        self._registering: dict[str, float] = {}  # node id -> when its registration in pages began
        access = pool.access if pool is not None else Access()
        if secret is not None:  # the catalog calls nodes (held, seal, drop, copy-to) with the node role
            access = dataclasses.replace(access, token=role_token(secret, "node", CATALOG_NODE))
        self.pool = ConnectionPool(access)
        self.capability_ttl = capability_ttl
        self.pending_ttl = pending_ttl
        self.pending_per_writer = pending_per_writer_from_env()
        self.node_timeout = node_timeout
        self.fan_out_timeout = fan_out_timeout  # drop, abort, seal: a node that misses it is told when it registers again
        self.retire_after = retire_after
        self._skewed: set[str] = set()  # nodes whose clock was last seen further from ours than CLOCK_MARGIN
        self._owes_registration: set[str] = set()  # nodes whose registration could not carry every seal
        self._unsure: set[tuple[str, int]] = set()  # commits whose database answer was lost: taken or not, unknown
        self._unsure_lock = threading.Lock()
        self._grants: dict[str, set[tuple[str, int, tuple[int, int]]]] = {}  # per node, over a registration's pages
        self._stopping = threading.Event()
        self._status_lock = threading.Lock()
        self._repairing = threading.Lock()  # one repair at a time: two would plan from the same state and copy twice
        self._status: tuple[float, dict] | None = None
        threading.Thread(target=self._expire_pending_loop, name="flightpart-pending-ttl", daemon=True).start()
        if self.lease is not None:
            self.lease.start()  # its first round runs now: the first catalog of a cluster leads before it answers
        else:  # a restarted catalog has its FlightInfos ready soon after, as a new leader does
            threading.Thread(target=self._warm_later, name="flightpart-warm", daemon=True).start()
        self.beats = self._listen_for_beats(host)  # last: nothing after it can fail and leave the port bound

    def shutdown(self) -> None:
        self._stopping.set()
        if self.beats is not None:
            self.beats.close()
        if self.lease is not None:
            self.lease.stop()  # a leader gives the lease up: a standby takes over without waiting for it to expire
        super().shutdown()
        self.state.close()

    # ------------------------------------------------------------------ leadership

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

    def _leader_among(self, uris: Sequence[str]) -> LeaseRow | None:
        """The catalog among ``uris`` that says it leads (asked by a catalog that cannot reach the database)."""
        for uri in uris:
            try:
                answer = self.pool.action(uri, GetLeadership(), timeout=1.0)
            except Exception:  # down, cut off too, or not a catalog any more: ask the next
                continue
            if answer.role == "leader" and answer.leader == uri:
                return LeaseRow(uri, answer.epoch or 0, answer.since or 0.0, True)
        return None

    def _lost_lead(self) -> None:
        """Another catalog leads: what this one built or heard as leader is not to be trusted if it leads again."""
        self._infos.clear()
        self.state.forget_datagram_clocks()

    def epoch(self) -> int | None:
        """The epoch orders to nodes carry (None without a lease)."""
        return self.lease.epoch if self.lease is not None else None

    def _took_over(self, epoch: int) -> None:
        """This catalog leads from ``epoch``: its view of the state is read afresh, and every node is told at once
        (nodes then refuse the old leader's orders and send their heartbeats here)."""
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

        told = self._fan_out(self.state.nodes(), tell, f"lead (epoch {epoch})")
        self.state.announced()
        log.info("epoch %d: %d nodes follow this catalog", epoch, told)
        self._warm_later()

    def _warm_later(self) -> None:
        if not self._stopping.wait(self.WARM_AFTER):
            self._warm()

    WARM_AFTER = 1.0
    """Seconds after a takeover (or a start) before the FlightInfos are built: the writers that waited for the new
    leader go first (building them for 50,000 partitions holds the process's CPU for most of a second)."""

    def _warm(self) -> None:
        """Build the FlightInfo of every dataset's latest version now, after a takeover or a start, so first opens do not
        each wait for a large version's partitions to be read from the database (most of a second at 50,000)."""
        started = time.monotonic()
        try:
            for name in self.state.latest_versions():
                if self.lease is not None and not self.lease.leads():
                    return
                self._cached_info(*name)
        except FlightpartError as exc:
            log.info("warming the FlightInfos stopped: %s", exc)
            return
        except Exception:  # the state closing under a catalog that stops: opens build what they need
            if not self._stopping.is_set():
                log.exception("warming the FlightInfos failed")
            return
        log.info("FlightInfos of every dataset's latest version built in %.2f s", time.monotonic() - started)

    def _leadership(self, _: GetLeadership) -> Leadership:
        if self.lease is None:
            return Leadership("single", self.uri, self.uri)
        return Leadership(**self.lease.describe())

    def _expire_pending_loop(self) -> None:
        """Abort puts that never finished, once they are older than the pending TTL (see docs/operations.md)."""
        while not self._stopping.wait(min(max(self.pending_ttl / 4, 0.2), 30.0)):
            if self.lease is not None and not self.lease.leads():
                continue  # a standby (or a leader cut off from its database) keeps house for no one
            try:
                for dataset, version in self.state.expired_pending(self.pending_ttl):
                    log.info("%s v%d: pending for more than %ss, aborted", dataset, version, self.pending_ttl)
                    self._drop_files(dataset, version, self.state.abort(dataset, version), pending_only=True)
                    self._infos.clear()
                retired = self.state.retire_dead(self.retire_after)
                if retired:
                    log.warning("retired %d nodes silent for more than %ss: %s; their partitions count as lost replicas "
                                "until `flightpart repair` copies them", len(retired), self.retire_after, ", ".join(retired))
                    self._infos.clear()
                self.state.flush_heartbeats()
            except Exception:  # the database is closing: the loop ends with the server
                if not self._stopping.is_set():
                    log.exception("expiring pending versions failed")

    def problems(self) -> list[str]:
        """Why the catalog cannot answer, if it cannot: its state database does not. Empty: SERVING."""
        found = [] if self.state.ping() else ["the state database does not answer"]
        if self.lease is not None and self.lease.serves_from_memory():
            found.append("this catalog's lease could not be renewed (the state database does not answer): read-only")
        return found

    STATUS_FRESH_SECONDS = 1.0
    """How long one gathering of the status page's facts serves every viewer (each asks every live node)."""

    def status(self) -> dict:
        """What the status page shows: nodes with their health and traffic, datasets with their grids; gathered at
        most once per :attr:`STATUS_FRESH_SECONDS` however many pages and scripts ask."""
        with self._status_lock:
            if self._status is None or time.monotonic() - self._status[0] > self.STATUS_FRESH_SECONDS:
                self._status = (time.monotonic(), cluster_status(self.state, self.pool,
                                                                 self._leadership(GetLeadership()).to_json()))
            return self._status[1]

    def stats(self) -> dict:
        """StatsReply for the ``stats`` action and the metrics endpoint."""
        nodes = self.state.nodes()
        unheard = self.state.unheard()  # just after a start or takeover: a node not heard from yet is not known dead
        out = {"datasets": len(self.state.datasets()), "nodes_alive": sum(n.alive for n in nodes),
               "nodes_dead": sum(not n.alive and n.node_id not in unheard for n in nodes),
               "nodes_unknown": sum(not n.alive and n.node_id in unheard for n in nodes), "refused_calls": self.guard.refused,
               "heartbeats_late": self.state.late_heartbeats}
        if self.lease is not None:
            out.update(leader=int(self.lease.leads()), epoch=self.lease.epoch or 0)
        if self.beats is not None:
            out.update(self.beats.counts())
        return out

    # ------------------------------------------------------------------ reads

    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        with boundary(log, "get_flight_info", self.telemetry, context):
            credential = authorize(context, "read")
            name, version = parse_dataset_path(descriptor)
            # a commit's answer was lost: what the database took is sealed before anyone opens it (while the database
            # does not answer, opens go on from memory and the settling thread keeps trying)
            if self._unsure and (self.lease is None or self.lease.reachable):
                self._settle_unsure()
            version = self.state.latest(name) if version is None else version
            return self._cached_info(name, version, credential.expiry)

    def get_schema(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        """A dataset's schema (``[name]`` or ``[name, version]``), as plain Flight clients ask for it."""
        with boundary(log, "get_schema", self.telemetry, context, schema_error):
            credential = authorize(context, "read")
            name, version = parse_dataset_path(descriptor)
            version = self.state.latest(name) if version is None else version
            return flight.SchemaResult(self._cached_info(name, version, credential.expiry).schema)

    def _cached_info(self, name: str, version: int, token_expiry: int = 0) -> flight.FlightInfo:
        """Versions are immutable: their FlightInfo is built once per state of the nodes (and capability expiry).

        With a cluster secret the info carries a read capability for this
        version alone, what the dataset's ``get`` presents to nodes. Its
        expiry is rounded to a quarter of ``capability_ttl`` so one
        FlightInfo serves every open in that quarter, and it is never later
        than ``token_expiry``, the expiry of the token that asked (0: none):
        a capability is no stronger than the token that obtained it.
        """
        nodes = tuple((n.node_id, n.uri, n.alive) for n in self.state.nodes())
        quarter = max(self.capability_ttl / 4, 1.0)
        expiry = int((wall_clock() // quarter) * quarter + self.capability_ttl)
        if token_expiry:
            expiry = min(expiry, token_expiry)

        def build() -> tuple[flight.FlightInfo, int]:
            cap = capability(self.secret, name, version, expiry) if self.secret is not None else None
            info = version_info(self.state.version(name, version), cap)
            return encode_flight_info(info), len(info.parts)

        return self._infos.get((name, version, expiry), nodes, build)

    def _prepare(self, name: str, version: int) -> None:
        """Build a version's FlightInfo just after its commit, beside the commit's answer: the first open (the
        writer's own, or anyone's) finds it built (a cold build of 50,000 partitions takes most of a second)."""
        try:
            self._cached_info(name, version)
        except Exception as exc:  # the open that needs it builds it then, and says what is wrong
            log.debug("building the FlightInfo of %s v%d after its commit failed: %s", name, version, exc)

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[flight.FlightInfo]:
        with boundary(log, "list_flights", self.telemetry, context):
            authorize(context, "read")
            infos = [encode_flight_info(version_info(record), with_endpoints=False) for record in self.state.datasets()]
        return iter(infos)

    def after_action(self, name: str) -> None:
        self._infos.clear()  # replicas, versions or nodes may have changed

    # ------------------------------------------------------------------ nodes

    def _register_node(self, b: RegisterNode) -> RegisterReply:
        began = time.time()
        if b.more:  # a registration in pages: what it clears (``missed``) is what was written before its first page
            self._registering.setdefault(b.node_id, began)
        cluster = self.state.adopt_cluster(b.cluster)
        if b.cluster is not None and b.cluster != cluster:
            raise ForeignCluster(f"node {b.node_id} at {b.uri} belongs to cluster {b.cluster}, this catalog is cluster {cluster}",
                                 field="register-node.cluster")
        credential = self.caller.credential
        if credential.role == "node" and credential.name != b.node_id:
            raise Forbidden(f"a node token for {credential.name} cannot register node {b.node_id}", field="register-node.node_id")
        self._check_identity(b)
        b = within_version_limit(b)
        held = [{"dataset": p.dataset, "version": p.version, "part": p.part, "nbytes": p.nbytes, "stats": p.stats}
                for p in b.partitions]
        trusted = self._signed_by_us(b.node_id, b.sealed)
        grants = self._grants.setdefault(b.node_id, set())
        grants.update(granted_to(b.node_id, trusted))
        if not b.more:
            self._grants.pop(b.node_id, None)
        orphans, to_seal, gone = self.state.register_node(b.node_id, b.uri, b.ip, b.pid, b.data_dir, held,
                                                          [manifest_record(m) for m in trusted],
                                                          [(v.dataset, v.version) for v in b.versions],
                                                          [(v.dataset, v.version) for v in b.sealed_versions], grants,
                                                          b.tombstones)
        self._identity_learned(cluster, b.node_id)
        for dataset, version in gone:  # a node heard a drop this catalog's state lost: every holder deletes it
            log.warning("%s v%d: node %s says it was dropped or aborted; forgotten here too", dataset, version, b.node_id)
            self._infos.clear()
            self._drop_files(dataset, version, self.state.nodes())
        manifests = (self._signed(manifest_of(self.state.version(d, v))) for d, v in to_seal)
        seal, more = next(pages(manifests, lambda m: len(m.encode()), self.REPLY_BYTES))
        if more:  # the rest when it registers again, once this registration is done
            self._owes_registration.add(b.node_id)
        if not b.more and b.node_id in self._owes_registration:
            self._owes_registration.discard(b.node_id)
            self.state.must_register(b.node_id)
        elif not b.more:
            self.state.registered(b.node_id, self._registering.pop(b.node_id, began))
        return RegisterReply(b.node_id, cluster, tuple(VersionRef(d, v) for d, v in orphans), tuple(seal), self.epoch())

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

    def _signed(self, manifest: Commit) -> Commit:
        """The manifest with this catalog's signature (nodes keep it; a catalog rebuilding its state trusts only that)."""
        unsigned = dataclasses.replace(manifest, signature=None)  # a writer's commit may carry anything there
        if self.secret is None:
            return unsigned
        return dataclasses.replace(unsigned, signature=manifest_signature(self.secret, unsigned.to_json()))

    REPLY_BYTES = 4 << 20
    """About how many bytes of manifests one answer to a registration carries."""

    def _identity_learned(self, cluster: str | None, node_id: str) -> None:
        """Keep track of nodes registered while the cluster had no identity: once it has one, each is made to
        register again (its next heartbeat is refused) and joins it."""
        if cluster is None:
            self._without_identity.add(node_id)
            return
        self._identity_known.set()
        waiting, self._without_identity = self._without_identity, set()
        self.state.must_register_all(waiting - {node_id})

    def _cluster(self) -> str:
        """The cluster's identity, for a write: a catalog on new or lost state first waits ``rebuild_grace`` seconds
        from its start for nodes holding data to tell it theirs (and their versions), then makes a new one."""
        known = self.state.cluster()
        if known is not None and self._identity_known.is_set() and time.monotonic() >= self._started + self.rebuild_grace:
            return known
        remaining = self._started + self.rebuild_grace - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)  # writes wait for the rebuild: every live node re-registers within a heartbeat
        cluster = self.state.mint_cluster()
        self._identity_learned(cluster, "")
        return cluster

    def _check_identity(self, b: RegisterNode) -> None:
        """One node id, one live process: a copy of a live node's data directory is refused; and one address, one
        node: a registration naming the address of another live node that still answers there as itself is refused
        (a node token holder had made its id a second replica at another node's address, so puts placed both copies
        there and failed)."""
        other = next((n for n in self.state.nodes() if n.uri == b.uri and n.node_id != b.node_id and n.alive), None)
        if other is not None and self._node_at(b.uri) == other.node_id:  # else the old process is gone: it moves
            raise NodeConflict(f"{b.uri} is served by node {other.node_id}, not {b.node_id}", field="register-node.uri")
        known = self.state.node(b.node_id)
        if known is None or not known.alive or known.uri == b.uri:
            return  # new, dead, or the same address restarting
        if self._node_at(known.uri) == b.node_id:  # else the old process does not answer: the id moves to the new one
            raise NodeConflict(
                f"node id {b.node_id} is already served by {known.uri} (pid {known.pid}); a copied data directory needs an "
                "identity of its own: remove its flightpart-node.json to give it a fresh one", field="register-node.node_id")

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
            raise Forbidden(f"a node token for {credential.name} cannot speak for node {b.node_id}", field="heartbeat.node_id")
        return self._beat_reply(self._take_beat(b), b.asks_clock)

    def _take_beat(self, beat: Heartbeat, *, datagram: bool = False) -> bool:
        """Note a heartbeat, over Flight or in a datagram; False when the node must register first, or (a datagram)
        this catalog does not lead or the beat could be a replay. Its clock is looked at (and a skew warned of)
        only for a beat that is taken: made-up ids and replays leave nothing behind."""
        if not self.state.knows(beat.node_id) or (datagram and not self.state.datagram_fresh(beat.node_id, beat.clock_ms)):
            return False
        skew = self._clock_skew(beat.node_id, beat.clock_ms)
        return self.state.heartbeat(beat.node_id, beat.free_bytes, beat.low_space, skew, beat.clock_ms, datagram=datagram)

    def _listen_for_beats(self, host: str) -> BeatListener | None:
        """Heartbeats in datagrams on this catalog's port (UDP), unless turned off or the port is taken, or behind TLS
        without a secret to sign them with (TLS, mutual TLS above all, promised who may speak)."""
        if not udp_heartbeats_enabled() or (self.uri.startswith("grpc+tls") and self.secret is None):
            return None
        try:
            return BeatListener(host, self.port, self.secret, self.state.knows, self._beat_in_datagram)
        except OSError as exc:
            log.warning("heartbeats come over Flight only: UDP %s:%d cannot be listened on: %s", host, self.port, exc)
            return None

    def _beat_in_datagram(self, beat: Heartbeat) -> bool:
        """A datagram's heartbeat, taken as Flight's short path takes it when this catalog leads (a standby declines
        it: the node then sends it over Flight, hears NOT_LEADER and follows the leader)."""
        return self.refusal("do_action", ()) is None and self._take_beat(beat, datagram=True)

    _BEAT_REPLIES = {known: [flight.Result(pa.py_buffer(HeartbeatReply(known).encode()))] for known in (True, False)}

    @staticmethod
    def _beat_reply(known: bool, asks_clock: bool | None) -> HeartbeatReply:
        """The answer to a beat; with this catalog's clock when the node asks for it (it judges expiry by it)."""
        return HeartbeatReply(known, int(wall_clock() * 1000) if asks_clock and known else None)

    def do_action(self, context: Any, action: flight.Action) -> list[flight.Result]:
        """Heartbeats take a short path (4,000 nodes send 2,000 a second); anything unusual, and every other action,
        the action table's."""
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

        The beat's travel time (one way, typically under a millisecond on a LAN) counts as the node being behind.
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
        """Every known node, once this catalog can tell the live from the dead (see
        :meth:`_wait_until_nodes_are_known`): writers place partitions and appends find holders by this list."""
        self._wait_until_nodes_are_known()
        return NodeList(tuple(NodeRow(**n.as_json()) for n in self.state.nodes()))

    def _stats(self, _: GetStats) -> StatsReply:
        return StatsReply(self.stats())

    # ------------------------------------------------------------------ versions

    def _begin(self, b: Begin) -> VersionReply:
        self._cluster()
        version = self.state.begin(b.dataset, writer=self._writer(), most_pending=self._pending_share())
        return VersionReply(version, self._grant(b.dataset, version))

    def _pending_share(self) -> int | None:
        """The versions the caller may hold begun and neither committed nor aborted (None: any, for an admin or the
        owner, which every caller of a cluster without a secret is)."""
        return None if self.caller.credential.role in ("admin", "owner") else self.pending_per_writer

    def _grant(self, dataset: str, version: int) -> str | None:
        """The caller's leave to write ``version`` of ``dataset`` on nodes, when it is a writer of a cluster with a
        secret (an admin or the owner needs none); it lasts as long as a pending version does."""
        credential = self.caller.credential
        if self.secret is None or credential.role != "writer":
            return None
        return version_grant(self.secret, dataset, version, credential.name,
                             int(wall_clock() + self.pending_ttl + CLOCK_MARGIN))

    def _writer(self) -> str:
        """The caller as the writer of what it begins: its role and name."""
        credential = self.caller.credential
        return f"{credential.role}:{credential.name}"

    def _check_writer(self, dataset: str, version: int, what: str) -> None:
        """FORBIDDEN unless the caller began ``version`` (or is an admin or the owner): any writer could commit
        forged rows as another's reserved version, or abort it under its feet."""
        credential = self.caller.credential
        if credential.role in ("admin", "owner"):
            return
        began = self.state.writer_of(dataset, version)
        if began == LEARNED:
            raise Forbidden(f"{what}: {dataset} v{version} was learned from nodes' files when this catalog lost its "
                            f"state, and may have been committed: only an admin may {what} it", field="version")
        if began is not None and began != self._writer():
            raise Forbidden(f"{what}: {dataset} v{version} was begun by another writer; only it or an admin may {what} it",
                            field="version")

    def _commit(self, b: Commit) -> Committed:
        if self._committed_already(b):  # only the very manifest stored: a retry whose answer was lost (any writer
            return Committed(b.dataset, b.version)  # sending it learns nothing it could not read)
        self._check_writer(b.dataset, b.version, "commit")
        nodes = {n.node_id: n for n in self.state.nodes()}
        parts = []
        for k, p in enumerate(b.partitions):
            unknown = [h for h in p.nodes if h not in nodes]
            if not p.nodes or unknown:
                raise RequestRejected(f"commit.partitions[{k}].nodes: expected ids of registered nodes, got {list(p.nodes)!r:.80}",
                                      field=f"commit.partitions[{k}].nodes")
            parts.append(PartRecord(p.part, p.start, p.shape, 0, [nodes[h] for h in p.nodes]))
        check_geometry(b.shape, b.tiling, parts)
        schema = b.schema.serialize().to_pybytes()
        try:
            self._verify_on_nodes(b.dataset, b.version, b.schema, parts)
        except FlightpartError:
            self._raise_if_not_pending(b.dataset, b.version)
            raise
        test_pause("FLIGHTPART_TEST_PAUSE_BEFORE_COMMIT", f"commit {b.dataset} v{b.version}")
        with self._outcome_watched(b.dataset, b.version):
            self.state.commit(b.dataset, b.version, schema, b.shape, b.tiling, parts, replicas=max(1, b.replicas),
                              ordered=True, base=b.base)
        test_pause("FLIGHTPART_TEST_PAUSE_AFTER_COMMIT", f"commit {b.dataset} v{b.version}")
        holders = {n.node_id: n for p in parts for n in p.nodes}
        if self._seal(b, holders.values()) == len(holders):
            self.state.sealed_everywhere(b.dataset, b.version)
        describe("commit", dataset=b.dataset, version=b.version, partitions=len(parts), rows=b.shape[0])
        threading.Thread(target=self._prepare, args=(b.dataset, b.version), name="flightpart-prepare", daemon=True).start()
        return Committed(b.dataset, b.version)

    def _committed_already(self, b: Commit) -> bool:
        """Whether this very commit is published already: its writer sent it again because the answer was lost (the
        catalog that took it died, and the writer's call moved to the new leader). A version number is reserved for
        one writer, so the same manifest is the same write; a different one is still a VERSION_CONFLICT."""
        state = self.state.version_state(b.dataset, b.version)
        if state is None or state[0] != "committed":
            return False
        stored = manifest_of(self.state.version(b.dataset, b.version))

        def shape(m: Commit) -> tuple:
            return (m.shape, m.tiling, sorted((p.part, p.start, p.shape, tuple(sorted(p.nodes))) for p in m.partitions))

        if shape(stored) != shape(b):
            return False
        log.info("%s v%d: committed already (the writer's retry of the same commit)", b.dataset, b.version)
        return True

    @contextmanager
    def _outcome_watched(self, dataset: str, version: int) -> Iterator[None]:
        """Around a version's commit transaction: when the database's answer is lost (StateUnavailable), the version
        may be committed all the same, so it is settled (:meth:`_settle_unsure`) as soon as the database answers,
        and before any open of it is answered."""
        try:
            yield
        except StateUnavailable:
            with self._unsure_lock:
                first = not self._unsure
                self._unsure.add((dataset, version))
            if first:
                threading.Thread(target=self._settle_unsure_loop, name="flightpart-settle", daemon=True).start()
            raise

    def _settle_unsure_loop(self) -> None:
        while not self._stopping.wait(self.SETTLE_EVERY):
            self._settle_unsure()
            with self._unsure_lock:
                if not self._unsure:  # a commit that lands here after the check starts a thread of its own
                    return

    SETTLE_EVERY = 0.25
    """Seconds between two looks at commits whose outcome is unknown, while the database does not answer."""

    def _settle_unsure(self) -> bool:
        """Seal every commit whose answer was lost and which the database did take (its holders were never told);
        forget those it did not take. True while some are left to settle (the database still does not answer)."""
        with self._unsure_lock:
            unsure = sorted(self._unsure)
        for dataset, version in unsure:
            try:
                state = self.state.version_state(dataset, version)
                if state is not None and state[0] == "committed":
                    record = self.state.version(dataset, version)
                    holders = {n.node_id: n for p in record.parts for n in p.nodes}
                    if self._seal(manifest_of(record), holders.values()) == len(holders):
                        self.state.sealed_everywhere(dataset, version)
                    log.warning("%s v%d: committed although the database's answer was lost; sealed on its holders",
                                dataset, version)
            except (StateUnavailable, NotLeader):
                return True  # the database (or the lease) is still out of reach: the next look tries again
            with self._unsure_lock:
                self._unsure.discard((dataset, version))
        return False

    def _raise_if_not_pending(self, dataset: str, version: int) -> None:
        """DatasetNotFound when ``version`` was dropped or aborted: why its files are gone, rather than a missing file."""
        state = self.state.version_state(dataset, version)
        if state is not None and state[0] == "aborted":
            raise VersionExpired(f"{dataset} v{version} was aborted while it was being written (pending longer than "
                                 "--pending-ttl, or given up); nothing was published: put it again", field="version")
        if state is None or state[0] == "dropped":
            was = state[0] if state else "unknown"
            raise DatasetNotFound(f"{dataset} v{version} was {was} while it was being written; nothing was published",
                                  field="version")

    def _seal(self, manifest: Commit, nodes: Any) -> int:
        """Tell the holders the version is committed; one that misses it is told when it registers again (also after
        a restart of this catalog: see :meth:`CatalogState.sealed_everywhere`). How many were told."""
        cluster, manifest = self.state.cluster(), self._signed(manifest)
        order = Seal(cluster, manifest, self.epoch())
        return self._fan_out(nodes, lambda node: self.pool.action(node.uri, order, timeout=self.fan_out_timeout),
                             f"seal {manifest.dataset} v{manifest.version}")

    def _verify_on_nodes(self, name: str, version: int, expected: pa.Schema, parts: list[PartRecord]) -> None:
        """Publish only what every claimed node really holds, with the right schema and rows."""
        by_node: dict[str, NodeRecord] = {n.node_id: n for p in parts for n in p.nodes}

        def held_by(node: NodeRecord) -> dict[tuple[int, int], tuple[HeldPartition, pa.Schema | None]]:
            out: dict[tuple[int, int], tuple[HeldPartition, pa.Schema | None]] = {}
            after = None
            while True:  # one page at a time: no reply size a large dataset can reach
                try:
                    reply = self.pool.action(node.uri, Held(name, version, after))
                except flight.FlightError as exc:
                    self.pool.discard(node.uri)
                    raise NodeUnavailable(f"node {node.uri} did not answer while committing {name} v{version}: "
                                          f"{error_message(exc)}") from None
                for k, h in enumerate(reply.partitions):
                    out[h.part] = (h, reply.schema(k))
                if not reply.more or not reply.partitions:
                    return out
                after = reply.partitions[-1].part

        with ThreadPoolExecutor(max_workers=min(32, len(by_node) or 1), thread_name_prefix="flightpart-verify") as ex:
            held = dict(zip(by_node, ex.map(held_by, by_node.values())))
        for p in parts:
            for node in p.nodes:
                h, h_schema = held[node.node_id].get(p.part, (None, None))
                if h is None:
                    raise SchemaMismatch(f"partition {p.part} of {name} v{version} is not stored on node {node.uri}",
                                         field="partitions")
                if h.rows != p.shape[0]:
                    raise SchemaMismatch(f"partition {p.part} of {name} v{version} on {node.uri} has {h.rows} rows, "
                                         f"expected {p.shape[0]}", field="partitions.shape")
                if h_schema is None or not h_schema.equals(_group_schema(expected, h_schema)):
                    raise SchemaMismatch(f"partition {p.part} of {name} v{version} on {node.uri} has schema {h_schema}, "
                                         f"which does not fit {expected}", field="schema")
                p.nbytes = max(p.nbytes, h.nbytes)
                p.stats = p.stats or h.stats  # computed by the node from what it stored, never taken from the writer

    def _abort(self, b: Abort) -> Aborted:
        self._check_writer(b.dataset, b.version, "abort")
        nodes = self.state.abort(b.dataset, b.version)
        state = self.state.version_state(b.dataset, b.version)
        if not nodes and state is not None and state[0] == "dropped":
            # dropped while its writer was still storing: files may have arrived after the drop's orders went out
            # (pending_only: a node keeps whatever is sealed)
            nodes = self.state.nodes()
        self._drop_files(b.dataset, b.version, nodes, pending_only=True)
        return Aborted(b.version)

    def _drop(self, b: Drop) -> Dropped:
        self.state.drop(b.dataset, b.version)
        self._infos.clear()  # before any file goes: whoever finds its files gone learns it was dropped
        # every live node, holder or not, keeps the tombstone: a catalog that loses its state learns it back from any
        cleaned = self._drop_files(b.dataset, b.version, self.state.nodes())
        describe("drop", dataset=b.dataset, version=b.version, nodes=cleaned)
        return Dropped(b.dataset, b.version, cleaned)

    def _drop_files(self, name: str, version: int | None, nodes: list[NodeRecord], *, pending_only: bool = False) -> int:
        """Tell the nodes to delete a version's files, in parallel; a node that misses it is told when it registers again."""
        through = self.state.dropped_through(name) if version is None and not pending_only else None
        order = DropFiles(name, version, self.state.cluster(), pending_only, through, self.epoch())
        what = order_key(name, version)
        # seen dead (or not heard from yet, just after a start): told when they register again
        self.state.must_register_all([n.node_id for n in nodes if not n.alive])
        live = [n for n in nodes if n.alive]
        self.state.expect_acknowledgements([n.node_id for n in live], what)
        told: list[str] = []

        def tell(node: NodeRecord) -> None:
            self.pool.action(node.uri, order, timeout=self.fan_out_timeout)
            told.append(node.node_id)

        count = self._fan_out(live, tell, f"drop {name} v{version}")
        self.state.told(told, what)  # the others stay ``missed`` (in the database): they register again, however late
        return count

    def _fan_out(self, nodes: Any, call: Any, what: str) -> int:
        """Run ``call(node)`` for every node at once, each with its own deadline; returns how many succeeded."""
        nodes = list(nodes)
        if not nodes:
            return 0
        if self.lease is not None and not self.lease.leads():
            # the lease ran out since the state was written: orders are the new leader's to give (it tells nodes
            # what they missed, as after a restart); nodes would refuse this epoch's anyway once it leads
            log.warning("%s: not sent, this catalog no longer holds the lease", what)
            return 0

        failed: list[str] = []

        def one(node: NodeRecord) -> bool:
            try:
                call(node)
                return True
            except Exception as exc:
                log.info("%s: node %s did not answer (%s); it is told again when it registers", what, node.uri, exc)
                self.pool.discard(node.uri)
                failed.append(node.node_id)
                return False

        with ThreadPoolExecutor(max_workers=min(32, len(nodes)), thread_name_prefix="flightpart-fan-out") as ex:
            count = sum(ex.map(one, nodes))
        self.state.must_register_all(failed)  # their next heartbeats are refused: they register and learn what they missed
        return count

    def _versions(self, b: ListVersions) -> VersionList:
        return VersionList(tuple(self.state.versions_of(b.dataset)))

    def _repair(self, _: Repair) -> RepairReport:
        """Copy every under-replicated partition from a live holder to a live node without it.

        Each copy waits for its holder at most as long as the holder's own put to the target may take
        (:func:`~flightpart.io.transfer.put_deadline` of the partition's bytes, plus twice the node timeout: the holder
        asks the catalog who is live first); a holder or
        target that failed once is not asked again in this repair (a frozen node would cost that wait per
        partition). A copy that cannot be made is reported with its reason and the repair goes on with the others.
        Repairs run one at a time: a second one waits for the first and then plans from what it left, so it copies
        only what is still missing (two planned together would each copy the same partitions).
        """
        with self._repairing:
            self._wait_until_nodes_are_known()
            return self._repair_now()

    def _wait_until_nodes_are_known(self) -> None:
        """Right after a start or a takeover a node not heard from yet is not known to be dead: its last heartbeat
        was flushed by a catalog before, perhaps longer ago than ``dead_after``. A repair judging it then would call
        its partitions lost and copy what needs no copy; a writer would put to fewer nodes, and an append would be
        told its partitions' holders are gone. So both wait until every node was heard from (nodes answer a new
        leader's announcement at once, and beat again within their heartbeat) or stayed silent ``dead_after``."""
        while (left := self.state.unsettled_for()) > 0 and not self._stopping.is_set():
            self._stopping.wait(min(left, 0.1))

    def _repair_now(self) -> RepairReport:
        live = [n for n in self.state.nodes() if n.alive]
        copies: list[ReplicaCopy] = []
        missing: list[PartPlace] = []
        failed: list[CopyFailed] = []
        silent: dict[str, str] = {}  # node id -> why it is not asked again in this repair
        load = {n.node_id: 0 for n in live}
        versions = self.state.all_versions()
        for record in versions:
            for p in record.parts:
                for n in p.nodes:
                    if n.node_id in load:
                        load[n.node_id] += 1
        for record in versions:
            schema = pa.ipc.read_schema(pa.py_buffer(record.schema))
            for p in record.parts:
                holders = [n for n in p.nodes if n.alive]
                if not holders:
                    missing.append(PartPlace(record.dataset, record.version, p.part))
                    continue
                held_by = {n.node_id for n in p.nodes}
                while len(holders) < record.replicas:
                    # the least loaded live node without it, nodes low on disk last
                    spare = sorted((n for n in live if n.node_id not in held_by),
                                   key=lambda n: (n.low_space, load[n.node_id]))
                    if not spare:
                        break  # fewer live nodes than replicas: the cluster's lack, not a failed copy
                    spare = [n for n in spare if n.node_id not in silent]
                    sources = [n for n in holders if n.node_id not in silent]
                    if not spare or not sources:
                        involved = {n.node_id for n in holders} | {n.node_id for n in live if n.node_id not in held_by}
                        why = "; ".join(f"{node_id}: {reason}" for node_id, reason in silent.items() if node_id in involved)
                        failed.append(CopyFailed(record.dataset, record.version, p.part,
                                                 f"no holder and target that answered ({why})"[:1000]))
                        break
                    target = spare[0]
                    if self.lease is not None and not self.lease.leads():
                        raise NotLeader("repair stopped: this catalog no longer holds the lease; run it again",
                                        field=self.lease.leader())
                    copied = self._copy_replica(record, p, schema, sources, target, silent)
                    if copied is None:
                        continue  # a holder or the target went silent: another pair is tried
                    held_by.add(target.node_id)
                    holders.append(target)
                    load[target.node_id] += 1
                    copies.append(copied)
        return RepairReport(tuple(copies), tuple(missing), tuple(failed))

    def _copy_replica(self, record: VersionRecord, p: PartRecord, schema: pa.Schema, sources: list[NodeRecord],
                      target: NodeRecord, silent: dict[str, str]) -> ReplicaCopy | None:
        """One copy of ``p`` from the first of ``sources`` to ``target``, checked and sealed there; None when it
        failed, the node to blame added to ``silent`` (the target when the holder says the target refused or did
        not answer, else the holder)."""
        holder = sources[0]
        deadline = put_deadline(DEFAULT_TIMEOUT, p.nbytes) + 2 * self.node_timeout
        grant = None if self.secret is None else put_grant(  # the one put the holder may make to the target
            self.secret, record.dataset, record.version, p.part, target.node_id, int(wall_clock() + deadline + CLOCK_MARGIN))
        order = CopyTo(record.dataset, record.version, p.part, target.uri, self.state.cluster(), self.epoch(), grant)
        try:
            # the holder's own put to the target, after it asked the catalog who is live
            self.pool.action(holder.uri, order, timeout=deadline)
        except (flight.FlightError, ConnectionError, OSError) as exc:
            self.pool.discard(holder.uri)
            refusal = translate(exc)
            if isinstance(refusal, StaleEpoch):
                raise NotLeader("repair stopped: a node has heard from a newer leader; run it there",
                                field=self.lease.leader() if self.lease is not None else None) from None
            if not (isinstance(refusal, VersionConflict) and refusal.field == "copy-to.target"):
                # the holder marks what the target refused or left unanswered; anything else is the holder's (it did not
                # answer in time, its copy is damaged or gone, it failed)
                blamed = target if refusal.field == "copy-to.target" else holder
                return self._not_asked_again(blamed, refusal, silent,
                                             f"copying {record.dataset} v{record.version} {p.part} from {holder.uri} to "
                                             f"{target.uri}")
            # the target already stores it: the copy of a repair whose catalog died (or lost the lease) before it
            # recorded the copy; checked below as any copy is, then recorded and sealed
            log.info("repair: %s already stores %s v%d %s; checking it", target.uri, record.dataset, record.version, p.part)
        try:
            self._verify_on_nodes(record.dataset, record.version, schema, [PartRecord(p.part, p.start, p.shape, 0, [target])])
        except FlightpartError as exc:
            return self._not_asked_again(target, exc, silent,
                                         f"checking the copy of {record.dataset} v{record.version} {p.part} on {target.uri}")
        self.state.add_replica(record.dataset, record.version, p.part, target.node_id)
        # the new holder keeps a manifest naming it, so a catalog rebuilding lost state takes its copy
        self._seal(manifest_of(self.state.version(record.dataset, record.version)), [target])
        return ReplicaCopy(record.dataset, record.version, p.part, target.uri)

    @staticmethod
    def _not_asked_again(node: NodeRecord, refusal: FlightpartError, silent: dict[str, str], what: str) -> None:
        """``node`` failed ``what``: noted in ``silent`` with why, so this repair asks it nothing more."""
        silent[node.node_id] = f"{refusal.code} {refusal.message}"[:300]
        log.warning("repair: %s failed (%s %s); %s is not asked again in this repair", what, refusal.code,
                    refusal.message, node.uri)

    def _report_damage(self, b: ReportDamage) -> Removed:
        """A node's replicas that failed their checksum or vanished: no longer listed, so reads skip them and repair
        recreates them."""
        credential = self.caller.credential
        if credential.role == "node" and credential.name != b.node_id:
            raise Forbidden(f"a node token for {credential.name} cannot speak for node {b.node_id}",
                            field="report-damage.node_id")
        removed = 0
        for p in b.partitions:
            if self.state.remove_replica(p.dataset, p.version, p.part, b.node_id):
                removed += 1
                log.warning("node %s lost its replica of %s v%d %s (damaged or missing); no longer listed", b.node_id,
                            p.dataset, p.version, p.part)
        return Removed(removed)

    def _scrub(self, _: ScrubCluster) -> ClusterScrubReport:
        """Every live node checks its files now (in parallel); their findings, summed, and the nodes not scrubbed.

        Once the catalog can tell the live nodes from the dead (:meth:`_wait_until_nodes_are_known`: right after a
        start it had skipped live nodes and reported a clean scrub of none). A node's scrub is waited for while the
        node beats (:func:`~.while_alive.call_while_alive`), however long its files take; one that stops beating
        (frozen) is left. The nodes not scrubbed (dead, failed or left) are listed as unreachable."""
        self._wait_until_nodes_are_known()
        nodes = self.state.nodes()
        live = [n for n in nodes if n.alive]

        def one(node: NodeRecord) -> NodeScrubReport:
            report = self.pool.action(node.uri, Scrub(), timeout=SCRUB_DEADLINE)
            return NodeScrubReport(**vars(report), uri=node.uri, node_id=node.node_id)

        answers = call_while_alive(live, one, lambda n: n.node_id, lambda: {n.node_id for n in self.state.nodes() if n.alive},
                                   self._stopping, "scrub")
        if self.lease is not None and not self.lease.leads():  # it stopped hearing the nodes' beats: its view is void
            raise NotLeader("this catalog lost the lease during the scrub; the new leader scrubs when asked again")
        for node, answer in zip(live, answers):
            if answer.why is not None:
                log.warning("scrub: node %s not scrubbed: %s", node.uri, answer.why)
                self.pool.discard(node.uri)
        found = [a.value for a in answers if a.why is None and a.value is not None]
        unreachable = [n.uri for n in nodes if not n.alive] + [n.uri for n, a in zip(live, answers) if a.why is not None]
        return ClusterScrubReport(tuple(found), tuple(unreachable),
                                  sum(len(a.damaged) for a in found), sum(len(a.missing) for a in found))

    # ------------------------------------------------------------------ SPMD publish

    def _publish_begin(self, b: PublishBegin) -> VersionReply:
        if not b.rank < b.nranks:
            raise RequestRejected(f"publish-begin: rank {b.rank} is not in [0, {b.nranks})", field="publish-begin.rank")
        self._cluster()
        # a rank joins its own writer's open publish (another writer's cannot hold it up), opened if there is none
        version = self.state.join_publish(b.dataset, b.nranks, b.rank, writer=self._writer(),
                                          most_pending=self._pending_share())
        return VersionReply(version, self._grant(b.dataset, version))

    def _publish_part(self, b: PublishPart) -> PublishReply:
        name, version = b.dataset, b.version
        self._check_writer(name, version, "publish")
        state = self.state.version_state(name, version)
        if state is None or state[0] != "pending" or state[1] is None:
            raise RequestRejected(f"publish-part: {name} v{version} is not an open SPMD publish", field="publish-part.version")
        nranks = state[1]
        first = self.state.version_schema(name, version)
        if first is not None and not pa.ipc.read_schema(pa.py_buffer(first)).equals(b.schema):
            raise SchemaMismatch(f"rank {b.rank} sent schema {b.schema}, other ranks sent {pa.ipc.read_schema(pa.py_buffer(first))}",
                                 field="publish-part.schema")
        if b.node_id not in {n.node_id for n in self.state.nodes()}:
            raise RequestRejected(f"publish-part: unknown node {b.node_id!r}", field="publish-part.node_id")
        schema_bytes = b.schema.serialize().to_pybytes()
        joined = self.state.add_rank_part(name, version, b.rank, b.rows, b.cols, 0, b.node_id, schema_bytes)
        if joined < nranks:
            return PublishReply(version, False, joined)
        # the last rank in commits; the node checks run without holding the database
        nodes = {n.node_id: n for n in self.state.nodes()}
        start, parts = 0, []
        for rank, rows, cols, node_id in self.state.rank_parts(name, version):
            parts.append(PartRecord((rank, 0), (start, 0), (rows, cols), 0, [nodes[node_id]]))
            start += rows
        self._verify_on_nodes(name, version, b.schema, parts)
        try:
            with self._outcome_watched(name, version):
                self.state.commit(name, version, schema_bytes, (start, parts[0].shape[1]), (nranks, 1), parts)
        except VersionConflict:
            return PublishReply(version, True, joined)  # another last rank committed it first, and sealed it
        # its holders are told, as a writer's commit tells them (an SPMD version had been sealed only when its nodes
        # registered again: not rebuildable from them until then, and its rows no reader's)
        holders = {n.node_id: n for p in parts for n in p.nodes}
        if self._seal(manifest_of(self.state.version(name, version)), holders.values()) == len(holders):
            self.state.sealed_everywhere(name, version)
        return PublishReply(version, True, joined)

    actions = action_table(
        Action(RegisterNode, _register_node, "a node announces itself and what its data directory holds", "node"),
        Action(GetLeadership, _leadership, "which catalog leads, since when, its epoch, and the standbys (any catalog "
               "answers)", "read", changes_state=False),
        Action(Heartbeat, _heartbeat, "a node is alive", "node", changes_state=False),
        Action(ListNodes, _nodes, "every known node, alive or not", "read", changes_state=False),
        Action(GetStats, _stats, "datasets and nodes alive or dead", "read", changes_state=False),
        Action(Begin, _begin, "reserve the next version of a dataset", "write", changes_state=False),
        Action(Commit, _commit, "publish a version once every partition is stored on its nodes", "write"),
        Action(Abort, _abort, "forget a pending version and drop its files", "write"),
        Action(Drop, _drop, "drop a version (or all versions) of a dataset and its files", "admin"),
        Action(ListVersions, _versions, "committed versions of a dataset", "read", changes_state=False),
        Action(Repair, _repair, "copy under-replicated partitions to live nodes (copy-to)", "admin"),
        Action(ReportDamage, _report_damage, "a node's replicas that failed their checksum or are gone: unlisted", "node"),
        Action(ScrubCluster, _scrub, "every live node checks its files against their checksums now; damaged and missing "
               "ones", "admin"),
        Action(PublishBegin, _publish_begin, "SPMD: join (or open) the pending publish of a dataset", "write",
               changes_state=False),
        Action(PublishPart, _publish_part, "SPMD: one rank's part is stored; commits when all ranks are in", "write"),
    )


def test_pause(variable: str, what: str) -> None:
    """A test hook: sleep the seconds ``$variable`` names, so a test can kill the catalog at that very step of a
    commit (before its database commit, or between it and the seal). Unset in any real deployment."""
    seconds = os.environ.get(variable)
    if seconds:
        log.warning("%s: paused %s s (%s, a test hook)", what, seconds, variable)
        time.sleep(float(seconds))


def manifest_of(record: VersionRecord) -> Commit:
    """The manifest a node keeps beside a committed version's partitions (the commit body, replicas included)."""
    parts = tuple(CommitPart(p.part, p.start, p.shape, tuple(n.node_id for n in p.nodes)) for p in record.parts)
    return Commit(record.dataset, record.version, pa.ipc.read_schema(pa.py_buffer(record.schema)), record.shape, record.grid,
                  parts, record.replicas)


def granted_to(node_id: str, manifests: list[Commit]) -> set[tuple[str, int, tuple[int, int]]]:
    """(dataset, version, part) the (signed) manifests list ``node_id`` as holding."""
    return {(m.dataset, m.version, p.part) for m in manifests for p in m.partitions if node_id in p.nodes}


def manifest_record(m: Commit) -> VersionRecord:
    """A version as a node's manifest describes it, for a catalog rebuilding its state."""
    parts = [PartRecord(p.part, p.start, p.shape, 0, []) for p in m.partitions]
    return VersionRecord(m.dataset, m.version, m.schema.serialize().to_pybytes(), m.shape, m.tiling, parts, max(1, m.replicas))


def check_geometry(shape: tuple[int, int], grid: tuple[int, int], parts: list[PartRecord]) -> None:
    """The committed partitions cover the grid once each and tile the dataset exactly."""
    positions = {p.part for p in parts}
    if len(positions) != len(parts) or len(parts) != grid[0] * grid[1] or any(not (i < grid[0] and j < grid[1]) for i, j in positions):
        raise RequestRejected(f"commit: {len(parts)} partitions do not fill the {grid} grid once each", field="commit.partitions")
    try:
        tiling.check_tiling(shape, grid, {p.part: (p.start, p.shape) for p in parts})
    except PartitionedError as exc:
        raise RequestRejected(f"commit: the partitions do not tile the dataset: {exc}", field="commit.partitions") from None


def _group_schema(full: pa.Schema, part: pa.Schema) -> pa.Schema:
    """The fields of ``full`` a column-group partition is expected to carry."""
    fields = [full.field(name) for name in part.names if full.get_field_index(name) >= 0]
    return pa.schema(fields, metadata=part.metadata) if len(fields) == len(part.names) else full
