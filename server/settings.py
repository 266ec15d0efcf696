"""What a daemon is started with: :class:`NodeSettings` (``flightpart serve``) and :class:`CatalogSettings`
(``flightpart catalog``).

Each is a frozen value whose fields carry their default and their help text (:func:`~flightpart.settings.setting`);
the CLI makes one option per field from them (:mod:`flightpart.cli.options`) and builds the value back from what
it parsed, so a setting is spelled once, here, and the daemon, the node and the catalog take the value. A field
whose type is itself such a value (:class:`Lifetimes`, :class:`Identity`, :class:`Security`, :class:`Observability`)
stands for the options of its fields; a field made without ``setting`` is no option (set in code only).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from flightpart.settings import setting

from .security import Security


@dataclass(frozen=True)
class Lifetimes:
    """How long a catalog keeps what it hands out: a put not yet committed, the read capability in a handle."""

    pending_ttl: float = setting(3600.0, "--pending-ttl", "Catalog: abort a put still pending after this many seconds "
                                 "and delete its files.", show_default=True)
    capability_ttl: float = setting(86400.0, "--capability-ttl", "Catalog: seconds the read capability in a dataset "
                                    "handle stays valid.", show_default=True)


@dataclass(frozen=True)
class Identity:
    """How a catalog on new or lost state settles the cluster's identity."""

    cluster_id: str | None = setting(None, "--cluster-id", "Catalog: the cluster's identity, given instead of learned "
                                     "from the nodes (a fresh state takes it at once; a state of another cluster "
                                     "refuses to start).")
    rebuild_grace: float = setting(5.0, "--rebuild-grace", "Catalog on new or lost state: seconds writes wait for "
                                   "nodes to report their cluster, versions and tombstones before version numbers are "
                                   "handed out (more than the nodes' --heartbeat).", show_default=True, min=0)


@dataclass(frozen=True)
class SignIn:
    """How users sign in to a catalog: how long a session lasts, and the identity provider whose tokens it takes."""

    session_ttl: float = setting(43200.0, "--session-ttl", "Catalog: seconds a user's session (a sign-in with a name "
                                 "and password, or an identity provider's token exchanged) stays valid.",
                                 show_default=True, min=1.0)
    jwks: str | None = setting(None, "--jwks", "Catalog: accept bearer JWTs signed by a key of this JWKS (a file, or "
                               "an https:// URL); needs --jwt-issuer and --jwt-audience.", metavar="FILE|URL")
    jwt_issuer: str | None = setting(None, "--jwt-issuer", "Catalog, with --jwks: the iss every token must carry.")
    jwt_audience: str | None = setting(None, "--jwt-audience", "Catalog, with --jwks: the aud every token must name.")
    jwt_user_claim: str = setting("sub", "--jwt-user-claim", "Catalog, with --jwks: the claim naming the user.",
                                  show_default=True)
    jwt_groups_claim: str = setting("groups", "--jwt-groups-claim", "Catalog, with --jwks: the claim listing the "
                                    "user's groups.", show_default=True)
    jwt_role_claim: str | None = setting(None, "--jwt-role-claim", "Catalog, with --jwks: a claim naming the user's "
                                         "role (reader, writer or admin); without it, or absent, reader.")


@dataclass(frozen=True)
class Observability:
    """Ports of the health (gRPC) and metrics (Prometheus HTTP) endpoints; None: not served."""

    health_port: int | None = setting(None, "--health-port", "Serve grpc.health.v1.Health on this port (8817 by "
                                      "convention; 0: any).")
    metrics_port: int | None = setting(None, "--metrics-port", "Serve HTTP on this port (8818 by convention; 0: any): "
                                       "/metrics for Prometheus, /healthz (200 or 503 with reasons) and, on a catalog, "
                                       "the status page at / and /status.json.")
    metrics_host: str = setting("127.0.0.1", "--metrics-host", "Address the HTTP endpoint binds. Its metrics show "
                                "counts only; a catalog's status page shows node addresses and dataset names, so "
                                "expose it only where they may be seen.", show_default=True)


@dataclass(frozen=True)
class CatalogSettings:
    """``flightpart catalog``: a catalog alone; also the catalog a ``flightpart serve`` without ``--catalog`` runs
    inside (:meth:`NodeSettings.embedded_catalog`)."""

    host: str = setting("127.0.0.1", "--host", show_default=True)
    port: int = setting(8815, "--port", show_default=True)
    state_dir: str | None = setting(None, "--state-dir", "SQLite state (default: per-user data dir).", path="dir")
    dead_after: float = setting(10.0, "--dead-after", "Seconds without heartbeat before a node is dead.",
                                show_default=True)
    retire_after: float = setting(86400.0, "--retire-after", "Seconds without heartbeat before a dead node is "
                                  "forgotten; its partitions then count as lost replicas.", show_default=True)
    advertise: str | None = setting(None, "--advertise", "Host name clients and nodes use to reach this catalog "
                                    "(default: --host); with --lease, what a standby names as the leader's address.")
    lease: str | None = setting(None, "--lease", "Several catalogs, one leader: keep the state in this PostgreSQL "
                                "database and lead only while holding its lease (every catalog of the cluster gets the "
                                "same; also $FLIGHTPART_LEASE, where a password stays off the command line). Without "
                                "it: SQLite in --state-dir, one catalog.", envvar="FLIGHTPART_LEASE",
                                metavar="postgresql://USER@HOST:PORT/DB")
    lease_seconds: float = setting(3.0, "--lease-seconds", "How long a lease lasts unrenewed: a standby takes over "
                                   "about this long after the leader dies.", show_default=True, min=1.0)
    sql_through_catalog: bool = setting(False, "--sql-through-catalog", "Flight SQL: answer every query at the "
                                        "catalog, at one endpoint, a plain scan too (bounded as every answer the "
                                        "catalog sends): SQL users then need only the catalog's address, and clients "
                                        "that read every answer from the server they connected to get all of it. "
                                        "Without it a plain scan's endpoints name the nodes, read in parallel.")
    lifetimes: Lifetimes = field(default_factory=Lifetimes)
    identity: Identity = field(default_factory=Identity)
    sign_in: SignIn = field(default_factory=SignIn)
    security: Security = field(default_factory=Security)
    ports: Observability = field(default_factory=Observability)

    @classmethod
    def in_process(cls, host: str = "127.0.0.1", **changes: Any) -> CatalogSettings:
        """A catalog another program runs in its own process (tests, the local and runtime clusters): any free port,
        its state in memory unless ``changes`` name a ``state_dir``; the rest as ``flightpart catalog``'s."""
        return cls(**{"host": host, "port": 0, **changes})


@dataclass(frozen=True)
class NodeSettings:
    """``flightpart serve``: a node, and without ``catalog`` a catalog in the same process (``node_port``,
    ``state_dir``, ``dead_after``, ``lifetimes`` and ``identity`` are that catalog's).

    The defaults are the command's; :meth:`in_process` gives those of a node another program runs in its process.
    """

    host: str = setting("127.0.0.1", "--host", "Address to bind and advertise.", show_default=True)
    port: int = setting(8815, "--port", "Port (0: any free port).", show_default=True)
    data_dir: str | os.PathLike | None = setting(None, "--data-dir", "Where partitions live (default: per-user data "
                                                 "dir).", path="dir")
    catalog: str | None = setting(None, "--catalog", "Catalog to join; without it this process is also the catalog. "
                                  "($FLIGHTPART_CATALOG is not read here: it names the catalog for client commands.)",
                                  address=True)
    node_port: int = setting(0, "--node-port", "Node port when this process is also the catalog.")
    state_dir: str | None = setting(None, "--state-dir", "Catalog state when embedded.", path="dir")
    heartbeat: float = setting(2.0, "--heartbeat", "Seconds between heartbeats.", show_default=True)
    dead_after: float = setting(10.0, "--dead-after", "Embedded catalog: seconds without heartbeat before a node is "
                                "dead.", show_default=True)
    max_partition_bytes: int | None = setting(None, "--max-partition-bytes", "Refuse partitions larger than this.")
    max_streams: int | None = setting(64, "--max-streams", "Refuse new do_get/do_put streams past this many open.",
                                      show_default=True)
    stream_idle_timeout: float | None = setting(60.0, "--stream-idle-timeout", "Free the slot of a do_get stream whose "
                                                "reader has taken nothing for this many seconds.", show_default=True,
                                                min=0.1)
    advertise: str | None = setting(None, "--advertise", "Host name clients use to reach this node (default: --host).")
    min_free_bytes: int = setting(64 << 20, "--min-free-bytes", "Report NOT_SERVING and low space (no new partitions "
                                  "placed here) below this much free disk.", show_default=True)
    group: str | None = setting(None, "--group", "Let this group's members map partitions zero-copy (directories 750, "
                                "files 640); default: owner only.")
    scrub_rate: int = setting(64 << 20, "--scrub-rate", "Bytes per second the background scrub reads to check stored "
                              "files against their checksums (0: off).", show_default=True)
    scrub_interval: float = setting(3600.0, "--scrub-interval", "Seconds between background scrub passes (0: off); a "
                                    "pass over B bytes takes B / --scrub-rate seconds.", show_default=True)
    node_token_file: str | None = setting(None, "--node-token-file", "File (mode 600) holding this node's own token "
                                          "(`flightpart token --role node --name NODE`): with --verify-key-file, what "
                                          "a node needs instead of the cluster secret. The token names the node.",
                                          path="file")
    verify_key_file: str | None = setting(None, "--verify-key-file", "File holding the cluster's verify key "
                                          "(`flightpart verify-key`): checks callers' tokens, mints none.", path="file")
    lifetimes: Lifetimes = field(default_factory=Lifetimes)
    identity: Identity = field(default_factory=Identity)
    security: Security = field(default_factory=Security)
    ports: Observability = field(default_factory=Observability)
    advertise_ip: str | None = None
    """The address the catalog is told (default: ``advertise`` resolved, else ``host``, else this machine's)."""
    max_maps: int = 256
    """How many partition files the node keeps memory-mapped at once."""

    @classmethod
    def in_process(cls, host: str = "127.0.0.1", **changes: Any) -> NodeSettings:
        """A node another program runs in its own process (tests, the local and runtime clusters): any free port,
        no cap on open streams and no floor of free disk unless ``changes`` set them; the rest as ``serve``'s."""
        return cls(**{"host": host, "port": 0, "max_streams": None, "min_free_bytes": 0, **changes})

    @property
    def credentials(self) -> Security:
        """The node's :class:`Security` with its own token and the verify key: what it checks callers with and
        speaks to the other daemons as."""
        return replace(self.security, node_token_file=self.node_token_file, verify_key_file=self.verify_key_file)

    def embedded_catalog(self) -> CatalogSettings:
        """The catalog this process also runs when no ``catalog`` is given: on ``host:port``, with the node's
        credentials (so a node token without the secret refuses to start it); the node then takes ``node_port``."""
        return CatalogSettings(host=self.host, port=self.port, state_dir=self.state_dir, dead_after=self.dead_after,
                               lifetimes=self.lifetimes, identity=self.identity, security=self.credentials)
