"""The catalog's Flight server, composed of its parts: one ``FlightInfo`` per dataset, built from its state.

``get_flight_info(for_path(name))`` answers as any Flight client understands
(:func:`flightpart.wire.encode_flight_info`). Each part brings its handlers and actions; this module builds the
state, the lease, the shared threads and the action table.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any

from flightpart.errors import CannotStart, ForeignCluster
from flightpart.io.access import Access
from flightpart.io.connections import ConnectionPool
from flightpart.tokens import CATALOG_NODE, role_token

from ..auth import Handshake
from ..base import action_table
from ..identity import IdentitySettings, JwtVerifier
from ..info_cache import FlightInfoCache
from ..settings import CatalogSettings
from ..state import CatalogState
from ..state.database import PostgresDatabase
from ..state.versions import pending_per_writer_from_env
from . import access, leadership, publish, reads, registry, repair, versions
from .access import AccessControl
from .leadership import Leading
from .lease import Lease
from .publish import Publishing
from .reads import Reads
from .registry import Registry
from .repair import Repairs
from .versions import Versions

log = logging.getLogger("flightpart.catalog")

NODE_TIMEOUT = 5.0
"""Seconds a node has to answer the catalog's own calls to it (its identity, a repair's copy beyond its bytes)."""
FAN_OUT_TIMEOUT = 2.0
"""Seconds a node has to answer an order (drop, abort, seal); one that misses it is told when it registers again."""


class CatalogServer(Leading, Registry, Versions, Repairs, Publishing, Reads, AccessControl):
    """Aggregates the nodes' partitions into datasets."""

    log = log
    role = "catalog"

    def __init__(self, settings: CatalogSettings, *, secret: bytes | None = None, pool: ConnectionPool | None = None,
                 **server_kwargs: Any):
        """A catalog serving as ``settings`` say (:meth:`CatalogSettings.in_process` for one inside a program): its
        state in ``settings.state_dir`` (SQLite; None: in memory) or, with ``settings.lease``, in PostgreSQL.
        ``secret`` mints and checks tokens, ``pool`` holds its TLS settings for calls to nodes, ``server_kwargs`` are
        the Flight server's TLS settings."""
        host, port, lease, lease_seconds = settings.host, settings.port, settings.lease, settings.lease_seconds
        state_path = ":memory:" if settings.state_dir is None else str(Path(settings.state_dir) / "catalog.sqlite")
        if secret is not None:  # users sign in by Flight's handshake (see .access)
            server_kwargs.setdefault("auth_handler", Handshake())
        super().__init__(host, port, secret=secret, advertise=settings.advertise, **server_kwargs)
        self._infos = FlightInfoCache()
        # several catalogs, one leader: the state lives in PostgreSQL and only the lease holder writes it
        self.lease = Lease(lease, self.uri, duration=lease_seconds, on_lead=self.took_over,
                           on_lose=self.lost_lead, find_leader=self.leader_among) if lease else None
        database = PostgresDatabase(lease, fence=self.lease.fence, link_timeout=lease_seconds, settings={
            "idle_in_transaction_session_timeout": f"{int(lease_seconds * 1000)}ms"}) \
            if self.lease is not None else None
        self.state = CatalogState(state_path, dead_after=settings.dead_after, database=database)
        self._started = time.monotonic()
        known = self.state.cluster()
        cluster_id = settings.identity.cluster_id
        if cluster_id is not None and known is not None and known != cluster_id:
            raise ForeignCluster(f"--cluster-id {cluster_id}: this catalog's state belongs to cluster {known}",
                                 field="cluster")
        self._cluster_id = cluster_id
        if cluster_id is not None and self.lease is None:  # with a lease: minted by whichever catalog leads first
            known = self.state.mint_cluster(cluster_id)
        # state that knows its cluster is intact; otherwise (new, or lost) writes wait for the nodes to come back first
        self.rebuild_grace = 0.0 if known is not None or settings.state_dir is None else settings.identity.rebuild_grace
        self._identity_known = threading.Event()
        if known is not None:
            self._identity_known.set()
        self._without_identity: set[str] = set()  # nodes registered before the identity was known: told it later
        self._registering: dict[str, float] = {}  # node id -> when its registration in pages began
        access = pool.access if pool is not None else Access()
        if secret is not None:  # the catalog calls nodes (held, seal, drop, copy-to) with the node role
            access = dataclasses.replace(access, token=role_token(secret, "node", CATALOG_NODE))
        self.pool = ConnectionPool(access)
        self.capability_ttl = settings.lifetimes.capability_ttl
        self.pending_ttl = settings.lifetimes.pending_ttl
        self.pending_per_writer = pending_per_writer_from_env()
        self.start_access(settings.sign_in.session_ttl, identity_of(settings))
        self.node_timeout = NODE_TIMEOUT
        self.fan_out_timeout = FAN_OUT_TIMEOUT
        self.retire_after = settings.retire_after
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
            threading.Thread(target=self.warm_later, name="flightpart-warm", daemon=True).start()
        self.beats = self.listen_for_beats(host)  # last: nothing after it can fail and leave the port bound

    def shutdown(self) -> None:
        self._stopping.set()
        if self.beats is not None:
            self.beats.close()
        if self.lease is not None:
            self.lease.stop()  # a leader gives the lease up: a standby takes over without waiting for it to expire
        super().shutdown()
        self.state.close()

    def _expire_pending_loop(self) -> None:
        """Abort puts that never finished, once older than the pending TTL (docs/operations/failures.md)."""
        while not self._stopping.wait(min(max(self.pending_ttl / 4, 0.2), 30.0)):
            if self.lease is not None and not self.lease.leads():
                continue  # a standby (or a leader cut off from its database) keeps house for no one
            try:
                for dataset, version in self.state.expired_pending(self.pending_ttl):
                    log.info("%s v%d: pending for more than %ss, aborted", dataset, version, self.pending_ttl)
                    self.drop_files(dataset, version, self.state.abort(dataset, version), pending_only=True)
                    self._infos.clear()
                retired = self.state.retire_dead(self.retire_after)
                if retired:
                    log.warning("retired %d nodes silent for more than %ss: %s; their partitions count as lost "
                                "replicas until `flightpart repair` copies them", len(retired), self.retire_after,
                                ", ".join(retired))
                    self._infos.clear()
                self.state.flush_heartbeats()
            except Exception:  # the database is closing: the loop ends with the server
                if not self._stopping.is_set():
                    log.exception("expiring pending versions failed")

    actions = action_table(*(action for part in (registry, leadership, reads, versions, repair, publish, access)
                             for action in part.ACTIONS))


def identity_of(settings: CatalogSettings) -> JwtVerifier | None:
    """The identity provider whose tokens the catalog takes (``--jwks``), its key set read once now so a wrong one
    stops the start; None without ``--jwks``."""
    given = settings.sign_in
    if given.jwks is None:
        return None
    if not given.jwt_issuer or not given.jwt_audience:
        raise CannotStart("--jwks needs --jwt-issuer and --jwt-audience: a token is taken only from its issuer and "
                          "for this catalog")
    verifier = JwtVerifier(IdentitySettings(given.jwks, given.jwt_issuer, given.jwt_audience, given.jwt_user_claim,
                                            given.jwt_groups_claim, given.jwt_role_claim))
    try:
        verifier.check()
    except ValueError as exc:
        raise CannotStart(f"--jwks: {exc}") from None
    return verifier
