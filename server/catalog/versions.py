"""Versions: reserving a number, commit (checked on the nodes, sealed on its holders, settled when the
database's answer was lost), abort and drop, and who may finish a version (its writer's grant and share).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from flightpart import tiling
from flightpart.errors import (
    DatasetNotFound,
    FlightpartError,
    Forbidden,
    NotLeader,
    PartitionedError,
    RequestRejected,
    StateUnavailable,
    VersionExpired,
)
from flightpart.tokens import version_grant
from flightpart.wire import (
    Abort,
    Aborted,
    Begin,
    Commit,
    Committed,
    Drop,
    Dropped,
    ListVersions,
    VersionList,
    VersionReply,
)

from ..auth import CLOCK_MARGIN, wall_clock
from ..base import Action
from ..info_cache import FlightInfoCache
from ..state.records import LEARNED, OnTop, PartRecord
from ..telemetry import describe
from .orders import NodeOrders, manifest_of

log = logging.getLogger("flightpart.catalog")


def test_pause(variable: str, what: str) -> None:
    """A test hook: sleep the seconds ``$variable`` names, so a test can kill the catalog at that step of a commit."""
    seconds = os.environ.get(variable)
    if seconds:
        log.warning("%s: paused %s s (%s, a test hook)", what, seconds, variable)
        time.sleep(float(seconds))


def check_geometry(shape: tuple[int, int], grid: tuple[int, int], parts: list[PartRecord]) -> None:
    """The committed partitions cover the grid once each and tile the dataset exactly."""
    positions = {p.part for p in parts}
    if len(positions) != len(parts) or len(parts) != grid[0] * grid[1] \
            or any(not (i < grid[0] and j < grid[1]) for i, j in positions):
        raise RequestRejected(f"commit: {len(parts)} partitions do not fill the {grid} grid once each",
                              field="commit.partitions")
    try:
        tiling.check_tiling(shape, grid, {p.part: (p.start, p.shape) for p in parts})
    except PartitionedError as exc:
        raise RequestRejected(f"commit: the partitions do not tile the dataset: {exc}",
                              field="commit.partitions") from None


class Versions(NodeOrders):
    """A version from its reservation to its commit or its tombstone."""

    _infos: FlightInfoCache  # set by the composed server (:class:`~.server.CatalogServer`), as below
    _unsure: set[tuple[str, int]]
    _unsure_lock: threading.Lock
    _stopping: threading.Event

    def _begin(self, b: Begin) -> VersionReply:
        self.require(self.caller.credential, "write", b.dataset, "begin")
        self.cluster_for_write()
        version = self.state.begin(b.dataset, writer=self.writer(), most_pending=self.pending_share())
        return VersionReply(version, self.grant(b.dataset, version))

    def pending_share(self) -> int | None:
        """The versions the caller may hold pending (None: any, for an admin or the owner)."""
        return None if self.caller.credential.role in ("admin", "owner") else self.pending_per_writer

    def grant(self, dataset: str, version: int) -> str | None:
        """A writer's (or any user's) grant to write ``version`` of ``dataset`` on nodes (decision 0015); None for an
        admin's role token or the owner."""
        credential = self.caller.credential
        if self.secret is None or (credential.role != "writer" and not credential.user):
            return None
        return version_grant(self.secret, dataset, version, credential.name,
                             int(wall_clock() + self.pending_ttl + CLOCK_MARGIN))

    def writer(self) -> str:
        """The caller as the writer of what it begins: its role and name."""
        credential = self.caller.credential
        return f"{credential.role}:{credential.name}"

    def check_writer(self, dataset: str, version: int, what: str) -> None:
        """FORBIDDEN unless the caller began ``version`` or is an admin or the owner."""
        credential = self.caller.credential
        if credential.role in ("admin", "owner"):
            return
        began = self.state.writer_of(dataset, version)
        if began == LEARNED:
            raise Forbidden(f"{what}: {dataset} v{version} was learned from nodes' files when this catalog lost its "
                            f"state, and may have been committed: only an admin may {what} it", field="version")
        if began is not None and began != self.writer():
            raise Forbidden(f"{what}: {dataset} v{version} was begun by another writer; only it or an admin may "
                            f"{what} it", field="version")

    def _commit(self, b: Commit) -> Committed:
        if self._committed_already(b):  # only the very manifest stored: a retry whose answer was lost (any writer
            return Committed(b.dataset, b.version)  # sending it learns nothing it could not read)
        self.require(self.caller.credential, "write", b.dataset, "commit", version=b.version)
        self.check_writer(b.dataset, b.version, "commit")
        nodes = {n.node_id: n for n in self.state.nodes()}
        parts = []
        for k, p in enumerate(b.partitions):
            unknown = [h for h in p.nodes if h not in nodes]
            if not p.nodes or unknown:
                raise RequestRejected(f"commit.partitions[{k}].nodes: expected ids of registered nodes, got "
                                      f"{list(p.nodes)!r:.80}",
                                      field=f"commit.partitions[{k}].nodes")
            parts.append(PartRecord(p.part, p.start, p.shape, 0, [nodes[h] for h in p.nodes]))
        check_geometry(b.shape, b.tiling, parts)
        schema = b.schema.serialize().to_pybytes()
        try:
            self.verify_on_nodes(b.dataset, b.version, b.schema, parts)
        except FlightpartError:
            self._raise_if_not_pending(b.dataset, b.version)
            raise
        test_pause("FLIGHTPART_TEST_PAUSE_BEFORE_COMMIT", f"commit {b.dataset} v{b.version}")
        with self.outcome_watched(b.dataset, b.version):
            self.state.commit(b.dataset, b.version, schema, b.shape, b.tiling, parts, replicas=max(1, b.replicas),
                              on_top=OnTop(b.base))
        test_pause("FLIGHTPART_TEST_PAUSE_AFTER_COMMIT", f"commit {b.dataset} v{b.version}")
        holders = {n.node_id: n for p in parts for n in p.nodes}
        if self.seal(b, holders.values()) == len(holders):
            self.state.sealed_everywhere(b.dataset, b.version)
        describe("commit", dataset=b.dataset, version=b.version, partitions=len(parts), rows=b.shape[0])
        threading.Thread(target=self._prepare, args=(b.dataset, b.version), name="flightpart-prepare",
                         daemon=True).start()
        return Committed(b.dataset, b.version)

    def _committed_already(self, b: Commit) -> bool:
        """Whether this very commit is published already (a retry after a lost answer): a version is reserved for
        one writer, so the same manifest is the same write; a different one is a VERSION_CONFLICT."""
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
    def outcome_watched(self, dataset: str, version: int) -> Iterator[None]:
        """Around a commit transaction: when the database's answer is lost (StateUnavailable) the version may be
        committed, so it is settled (:meth:`settle_unsure`) once the database answers, before any open of it."""
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
            self.settle_unsure()
            with self._unsure_lock:
                if not self._unsure:  # a commit that lands here after the check starts a thread of its own
                    return

    SETTLE_EVERY = 0.25
    """Seconds between two looks at commits whose outcome is unknown, while the database does not answer."""

    def settle_unsure(self) -> bool:
        """Seal every commit whose answer was lost and which the database took; forget the others. True while
        some are left (the database does not answer)."""
        with self._unsure_lock:
            unsure = sorted(self._unsure)
        for dataset, version in unsure:
            try:
                state = self.state.version_state(dataset, version)
                if state is not None and state[0] == "committed":
                    record = self.state.version(dataset, version)
                    holders = {n.node_id: n for p in record.parts for n in p.nodes}
                    if self.seal(manifest_of(record), holders.values()) == len(holders):
                        self.state.sealed_everywhere(dataset, version)
                    log.warning("%s v%d: committed although the database's answer was lost; sealed on its holders",
                                dataset, version)
            except (StateUnavailable, NotLeader):
                return True  # the database (or the lease) is still out of reach: the next look tries again
            with self._unsure_lock:
                self._unsure.discard((dataset, version))
        return False

    def _raise_if_not_pending(self, dataset: str, version: int) -> None:
        """DatasetNotFound when ``version`` was dropped or aborted (why its files are gone)."""
        state = self.state.version_state(dataset, version)
        if state is not None and state[0] == "aborted":
            raise VersionExpired(f"{dataset} v{version} was aborted while it was being written (pending longer than "
                                 "--pending-ttl, or given up); nothing was published: put it again", field="version")
        if state is None or state[0] == "dropped":
            was = state[0] if state else "unknown"
            raise DatasetNotFound(f"{dataset} v{version} was {was} while it was being written; nothing was published",
                                  field="version")

    def _prepare(self, name: str, version: int) -> None:
        """Build a version's FlightInfo just after its commit, so the first open finds it built (decision 0019)."""
        try:
            self.cached_info(name, version)
        except Exception as exc:  # the open that needs it builds it then, and says what is wrong
            log.debug("building the FlightInfo of %s v%d after its commit failed: %s", name, version, exc)

    def _abort(self, b: Abort) -> Aborted:
        self.require(self.caller.credential, "write", b.dataset, "abort", version=b.version)
        self.check_writer(b.dataset, b.version, "abort")
        nodes = self.state.abort(b.dataset, b.version)
        state = self.state.version_state(b.dataset, b.version)
        if not nodes and state is not None and state[0] == "dropped":
            # dropped while its writer was still storing: files may have arrived after the drop's orders went out
            # (pending_only: a node keeps whatever is sealed)
            nodes = self.state.nodes()
        self.drop_files(b.dataset, b.version, nodes, pending_only=True)
        return Aborted(b.version)

    def _drop(self, b: Drop) -> Dropped:
        self.require(self.caller.credential, "write", b.dataset, "drop", version=b.version)
        self.state.drop(b.dataset, b.version)
        self._infos.clear()  # before any file goes: whoever finds its files gone learns it was dropped
        # every live node, holder or not, keeps the tombstone: a catalog that loses its state learns it back from any
        cleaned = self.drop_files(b.dataset, b.version, self.state.nodes())
        describe("drop", dataset=b.dataset, version=b.version, nodes=cleaned)
        return Dropped(b.dataset, b.version, cleaned)

    def _versions(self, b: ListVersions) -> VersionList:
        self.require(self.caller.credential, "read", b.dataset, "versions")
        return VersionList(tuple(self.state.versions_of(b.dataset)))


ACTIONS = (
    Action(Begin, Versions._begin, "reserve the next version of a dataset", "write", changes_state=False),
    Action(Commit, Versions._commit, "publish a version once every partition is stored on its nodes", "write"),
    Action(Abort, Versions._abort, "forget a pending version and drop its files", "write"),
    Action(Drop, Versions._drop, "drop a version (or all versions) of a dataset and its files", "admin"),
    Action(ListVersions, Versions._versions, "committed versions of a dataset", "read", changes_state=False),
)
"""The actions this part serves, added to the catalog's table (:attr:`~.server.CatalogServer.actions`)."""
