"""When a node was last alive, by the catalog's clock: when its heartbeat was sent, not when it was handled.

A heartbeat can wait before the catalog handles it: in the catalog's UDP socket or gRPC's queue while the catalog
was stopped (SIGSTOP, a paused VM) or starved. Such a beat says the node was alive when it sent it, no more. Noted as
handled, a node that died while its catalog was frozen came back alive for ``--dead-after`` when the catalog thawed
and handled the beats it had queued (over Flight as over UDP: ``tests/test_udp_heartbeats.py``).

Each beat carries the node's clock. The least of (our clock - its clock) over a node's beats is the two clocks'
offset plus the shortest trip; a beat later than that by more than :data:`LATE_SECONDS` was sent that much before it
was handled, and counts from then. Either clock may step, which makes every beat of a node look late (or early) by
the step. A clock that steps so the delay shrinks lowers the least at once. One that makes every beat late is told
from a queue's backlog by the pace of the late beats: a backlog is handled in a burst, each beat an interval later on
the node's clock than the one before; beats of a stepped clock are handled at the pace they were sent. A run of late
beats spanning at least :data:`LATE_SECONDS` of the node's clock, handled over about as long (a quarter of it, or
half a second, either way: jitter does not add up), sets the offset anew, whatever the node's heartbeat interval.
"""

from __future__ import annotations

import time

LATE_SECONDS = 1.0
"""A beat this much later than its node's beats usually are counts from when it was sent."""
_RUN = 32
"""Late beats kept per node (the newest), to tell a stepped clock from a backlog."""


class SentTimes:
    """Per node, the offset between its clock and ours, and when each beat was sent in our clock. Not thread-safe:
    the catalog's state calls it under its lock."""

    def __init__(self) -> None:
        self.late = 0  # beats counted from when they were sent, having waited
        self._least: dict[str, float] = {}
        self._runs: dict[str, list[tuple[float, float, float]]] = {}  # per node, late beats: (handled, its clock, delay)

    def sent_at(self, node_id: str, now: float, skew: float | None, arrived: float | None = None) -> float:
        """When a beat handled ``now`` was sent, in our clock; ``skew``: its clock minus ours when handled (None: the
        beat carried no clock, and counts from now); ``arrived``: a monotonic time of handling (now's, unless told)."""
        if skew is None:
            return now
        delay = -skew
        least = self._least.get(node_id)
        if least is None or delay <= least + LATE_SECONDS:
            if least is None or delay < least:
                self._least[node_id] = delay
            self._runs.pop(node_id, None)
            return now
        handled = time.monotonic() if arrived is None else arrived
        run = self._runs.setdefault(node_id, [])
        run.append((handled, now - delay, delay))  # now - delay: the node's clock when it sent the beat
        del run[:-_RUN]
        sent_span, handled_span = run[-1][1] - run[0][1], run[-1][0] - run[0][0]
        if sent_span >= LATE_SECONDS and abs(handled_span - sent_span) <= max(LATE_SECONDS / 2, sent_span / 4):
            self._least[node_id] = min(d for _, _, d in run)  # a clock stepped: the offset is this run's
            del self._runs[node_id]
            return now
        self.late += 1
        return now - (delay - least)

    def forget(self, node_id: str) -> None:
        """A node retired: a node of that id later starts afresh."""
        self._least.pop(node_id, None)
        self._runs.pop(node_id, None)
