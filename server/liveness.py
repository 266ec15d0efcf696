"""When a node was last alive, by the catalog's clock: when its heartbeat was sent, not when it was handled
(a beat may wait in a queue while the catalog is frozen; decision 0022).

Each beat carries the node's clock. The least of (our clock - its clock) over a node's beats is the clocks'
offset plus the shortest trip; a beat later than that by more than :data:`LATE_SECONDS` counts from when it was
sent. A clock step that shrinks the delay lowers the least at once. One that makes every beat late is told from
a backlog by pace: a backlog is handled in a burst, a stepped clock's beats at the pace they were sent. So a run
of late beats spanning at least :data:`LATE_SECONDS` of the node's clock, handled over about as long (within a
quarter, or half a second), sets the offset anew.
"""

from __future__ import annotations

import time

LATE_SECONDS = 1.0
"""A beat this much later than its node's beats usually are counts from when it was sent."""
_RUN = 32
"""Late beats kept per node (the newest), to tell a stepped clock from a backlog."""


class SentTimes:
    """Per node, the offset between its clock and ours, and when each beat was sent; used under the state's lock."""

    def __init__(self) -> None:
        self.late = 0  # beats counted from when they were sent, having waited
        self._least: dict[str, float] = {}
        # per node, late beats: (handled, its clock, delay)
        self._runs: dict[str, list[tuple[float, float, float]]] = {}

    def sent_at(self, node_id: str, now: float, skew: float | None, arrived: float | None = None) -> float:
        """When a beat handled ``now`` was sent, in our clock; ``skew``: its clock minus ours (None: counts from
        now); ``arrived``: a monotonic time of handling."""
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
