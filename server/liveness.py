"""When a node was last alive, by the catalog's clock: when its heartbeat was sent, not when it was handled.

A heartbeat can wait before the catalog handles it: in the catalog's UDP socket or gRPC's queue while the catalog
was stopped (SIGSTOP, a paused VM) or starved. Such a beat says the node was alive when it sent it, no more. Noted as
handled, a node that died while its catalog was frozen came back alive for ``--dead-after`` when the catalog thawed
and handled the beats it had queued (over Flight as over UDP: ``tests/test_udp_heartbeats.py``).

Each beat carries the node's clock. The least of (our clock - its clock) over a node's beats is the two clocks'
offset plus the shortest trip; a beat later than that by more than :data:`LATE_SECONDS` was sent that much before it
was handled, and counts from then. A node whose clock steps back looks late on every beat: a run of beats that agree
on their delay and arrive over more than :data:`LATE_SECONDS` (a queue's backlog arrives at once, each beat an
interval later than the one before) sets the offset anew. A clock that steps forward lowers the least at once.
"""

from __future__ import annotations

import time

LATE_SECONDS = 1.0
"""A beat this much later than its node's beats usually are counts from when it was sent."""
_RUN, _RUN_SECONDS = 16, 60.0
"""Late beats kept per node (at most, and at most this old) to tell a clock that stepped back, whatever its node's
heartbeat interval, from a queue's backlog."""


class SentTimes:
    """Per node, the offset between its clock and ours, and when each beat was sent in our clock. Not thread-safe:
    the catalog's state calls it under its lock."""

    def __init__(self) -> None:
        self.late = 0  # beats counted from when they were sent, having waited
        self._least: dict[str, float] = {}
        self._runs: dict[str, list[tuple[float, float]]] = {}

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
        arrived = time.monotonic() if arrived is None else arrived
        run = [(t, d) for t, d in self._runs.get(node_id, ())[-(_RUN - 1):] if arrived - t <= _RUN_SECONDS]
        run.append((arrived, delay))
        self._runs[node_id] = run
        delays = [d for _, d in run]
        if arrived - run[0][0] > LATE_SECONDS and max(delays) - min(delays) < LATE_SECONDS / 4:
            self._least[node_id] = delay  # its clock moved back: this is its offset now
            del self._runs[node_id]
            return now
        self.late += 1
        return now - (delay - least)
