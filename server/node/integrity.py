"""A node's integrity: what it holds checked against checksums, and what is lost told to the catalog.

A file that fails its checksum is quarantined by the store, which calls :meth:`Integrity._damaged`; a scrub
reads every file at a bounded rate; what is damaged or missing is reported to the catalog (again at each beat
until it answers), which repairs it from other replicas.
"""

from __future__ import annotations

import threading
import time

from flightpart.errors import FlightpartError
from flightpart.wire import Checked, CheckedParts, CheckParts, PartPlace, ReportDamage, Scrub, ScrubReport

from ..base import Action
from .shared import NodeBase, log


class _Pacer:
    """Sleeps so that the bytes counted through :meth:`pace` stay under ``rate`` per second (ends early on ``stop``)."""

    def __init__(self, rate: int, stop: threading.Event):
        self.rate = rate
        self.stop = stop
        self.started = time.monotonic()
        self.done = 0

    def pace(self, nbytes: int) -> None:
        self.done += nbytes
        ahead = self.done / self.rate - (time.monotonic() - self.started)
        if ahead > 0:
            self.stop.wait(ahead)


class Integrity(NodeBase):
    """Scrubs, checks, and reports of damaged and missing partitions (``check``, ``check-parts``, ``scrub``)."""

    scrub_rate: int
    scrub_interval: float

    def init_integrity(self) -> None:
        """Set up what is lost and not yet reported, and hear of every file the store quarantines."""
        self._lost_lock = threading.Lock()
        # damaged or missing, not yet told to the catalog
        self._unreported: set[tuple[str, int, tuple[int, int]]] = set()
        self._settled: set[tuple[str, int, tuple[int, int]]] = set()  # missing ones the catalog already knows of
        self.store.on_damage = self._damaged

    def start_scrubs(self) -> None:
        """Scrub in the background (:meth:`_scrub_loop`), until the node stops."""
        threading.Thread(target=self._scrub_loop, name="flightpart-scrub", daemon=True).start()

    def _damaged(self, dataset: str, version: int, part: tuple[int, int]) -> None:
        """A file failed its checksum (and was quarantined): count it and tell the catalog now, in the background."""
        self.counters.add(partitions_damaged=1)
        log.error("partition %s of %s v%d failed its checksum: moved to quarantine, not served", part, dataset, version)
        with self._lost_lock:
            self._unreported.add((dataset, version, part))
            self._settled.add((dataset, version, part))  # quarantined: not reported missing as well
        threading.Thread(target=self.report_lost, name="flightpart-report-damage", daemon=True).start()

    def report_lost(self) -> None:
        """Tell the catalog which replicas this node no longer has intact; kept for the next beat if unanswered."""
        with self._lost_lock:
            places = sorted(self._unreported)
        if not places or self.catalog_uri is None:
            return
        body = ReportDamage(self.node_id, tuple(PartPlace(d, v, p) for d, v, p in places))
        try:
            self.to_catalog(body, timeout=10)
        except Exception as exc:
            log.info("could not report %d damaged or missing partitions to the catalog yet: %s", len(places), exc)
            return
        with self._lost_lock:
            self._unreported.difference_update(places)

    def scrub(self, rate: int | None = None) -> ScrubReport:
        """Check every stored file against its checksum and find missing ones; tell the catalog what is lost.

        ``rate`` bounds the bytes read per second (None: unbounded). Files
        drops remove meanwhile are no finding.
        """
        pace = _Pacer(rate, self.stopping).pace if rate else None
        since = self.store.drops.mark()
        found = self.store.scrub(self._claimed(), pace, self.stopping.is_set, since)
        missing = found["missing"]
        self._lost(missing)
        self.counters.add(scrubbed_bytes=found["bytes"])
        self.report_lost()
        return ScrubReport(found["checked"], found["bytes"], tuple(PartPlace(*p) for p in found["damaged"]),
                           tuple(PartPlace(*p) for p in missing))

    def _lost(self, missing: list[tuple[str, int, tuple[int, int]]]) -> None:
        """Partitions found missing: reported to the catalog (once per process), their statistics moved aside."""
        for place in missing:
            self.store.forget_missing(*place)
        with self._lost_lock:
            self._unreported.update(missing)
            self._settled.update(missing)
        if missing:
            self.counters.add(partitions_missing=len(missing))
            log.error("partitions missing from the data directory: %s", missing)

    def _claimed(self) -> set[tuple[str, int, tuple[int, int]]]:
        """What the manifests say this node holds, less what it already reported lost."""
        claimed = self.store.claimed(self.node_id)
        with self._lost_lock:
            return claimed - self._settled

    def find_missing(self) -> None:
        """At registration: partitions the manifests say this node holds whose files are gone (names only, no read)."""
        since = self.store.drops.mark()
        self._lost(self.store.missing(self._claimed(), since))
        self.report_lost()

    def _scrub_loop(self) -> None:
        """Scrub at ``scrub_rate`` bytes/s, one pass every ``scrub_interval`` seconds."""
        while not self.stopping.wait(self.scrub_interval):
            try:
                self.scrub(self.scrub_rate)
            except Exception as exc:  # a scrub never takes the node down; the next pass tries again
                log.warning("scrub pass failed: %s", exc)

    def _check(self, body: PartPlace) -> Checked:
        """Vouch for a partition before a reader on this host maps the file itself (verified once per file)."""
        self.store.open(body.dataset, body.version, body.part)
        return Checked()

    def _check_parts(self, body: CheckParts) -> CheckedParts:
        """:meth:`_check` for many partitions at once; a damaged one is quarantined (and reported) as by a read."""
        failed = []
        for part in body.parts:
            try:
                self.store.verify(body.dataset, body.version, part)
            except (OSError, FlightpartError):
                failed.append(part)
        return CheckedParts(tuple(failed))

    def _scrub(self, _: Scrub) -> ScrubReport:
        return self.scrub()

INTEGRITY_ACTIONS = (
    Action(PartPlace, Integrity._check, "verify a partition's checksum before a reader on this host maps it", "locate",
           changes_state=False),
    Action(CheckParts, Integrity._check_parts, "verify the checksums of many partitions of one version before a reader "
           "on this host maps them; answers which failed", "locate", changes_state=False),
    Action(Scrub, Integrity._scrub, "check every stored file against its checksum now; report damaged and missing ones",
           "catalog"),
)
"""The integrity actions, for the node's action table."""
