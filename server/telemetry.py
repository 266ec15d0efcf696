"""What a daemon records of every call: a latency histogram per RPC, refusals by reason, one log line per event.

:func:`flightpart.server.base.boundary` opens a :class:`Call` per RPC; one named with :func:`describe` ends with
an INFO line, any other with a DEBUG line. A stream is timed until gRPC reports it complete.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from typing import Any

log = logging.getLogger("flightpart.calls")

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (seconds) of the latency histograms: heartbeats take well under a millisecond, a large get minutes."""

_current = threading.local()


class Call:
    """One RPC in flight: what it is, who asked, and what its handler said it did."""

    __slots__ = ("rpc", "peer", "started", "event", "fields", "outcome")

    def __init__(self, rpc: str, peer: str) -> None:
        self.rpc = rpc
        self.peer = peer
        self.started = time.perf_counter()
        self.event: str | None = None
        self.fields: dict[str, Any] = {}
        self.outcome = "ok"


class Histogram:
    """Counts per bucket (not cumulative), their sum and count; thread-safe through its owner's lock."""

    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BUCKETS) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect_left(BUCKETS, seconds)] += 1
        self.count += 1
        self.total += seconds


class Telemetry:
    """A daemon's latency histograms (by RPC) and refusals (by reason)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._histograms: dict[str, Histogram] = {}
        self._measures: dict[str, Histogram] = {}
        self._refusals: dict[str, int] = {}
        self._decisions: dict[tuple[str, str], int] = {}

    def decided(self, action: str, outcome: str) -> None:
        """Count one decision on access (:mod:`.audit`): ``action`` allowed or refused (``outcome``)."""
        with self._lock:
            key = (action, outcome)
            self._decisions[key] = self._decisions.get(key, 0) + 1

    def decisions(self) -> dict[tuple[str, str], int]:
        """Decisions on access so far, by (action, outcome)."""
        with self._lock:
            return dict(self._decisions)

    def refused(self, reason: str) -> None:
        with self._lock:
            self._refusals[reason] = self._refusals.get(reason, 0) + 1

    def finish(self, call: Call, error: BaseException | None = None) -> None:
        """Record the call's latency and write its log line."""
        seconds = time.perf_counter() - call.started
        with self._lock:
            histogram = self._histograms.get(call.rpc)
            if histogram is None:
                histogram = self._histograms[call.rpc] = Histogram()
            histogram.observe(seconds)
        if error is not None and call.outcome == "ok":
            call.outcome = "broken"
        if call.event is None:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s from %s: %s in %.4f s", call.rpc, call.peer, call.outcome, seconds,
                          extra={"rpc": call.rpc, "peer": call.peer, "outcome": call.outcome,
                                 "seconds": round(seconds, 6)})
            return
        level = logging.INFO if call.outcome == "ok" else logging.WARNING
        if not log.isEnabledFor(level):  # the line is not written (the default level is WARNING): nothing to format
            return
        f = call.fields
        version = f"v{f['version']}" if f.get("version") is not None else "(every version)"
        what = f"{call.event} {f.get('dataset')} {version}" + (f" {tuple(f['part'])}" if f.get("part") else "")
        sizes = ", ".join(f"{f[k]:,} {k}" for k in ("bytes", "rows", "partitions") if f.get(k) is not None)
        log.log(level, "%s%s in %.3f s, peer %s%s", what, f": {sizes}" if sizes else "", seconds, call.peer,
                "" if call.outcome == "ok" else f" ({call.outcome}: {error})",
                extra={"event": call.event, **f, "seconds": round(seconds, 6), "peer": call.peer,
                       "outcome": call.outcome})

    def histograms(self) -> dict[str, tuple[list[int], float, int]]:
        """``{rpc: (counts per bucket, sum of seconds, count)}``; the last bucket is +Inf."""
        with self._lock:
            return {rpc: (list(h.buckets), h.total, h.count) for rpc, h in self._histograms.items()}

    def observe(self, what: str, seconds: float) -> None:
        """Count ``seconds`` in the histogram of ``what`` (a duration that is not one call's, e.g. a SQL query's)."""
        with self._lock:
            histogram = self._measures.get(what)
            if histogram is None:
                histogram = self._measures[what] = Histogram()
            histogram.observe(seconds)

    def measures(self) -> dict[str, tuple[list[int], float, int]]:
        """``{what: (counts per bucket, sum of seconds, count)}`` of :meth:`observe`; the last bucket is +Inf."""
        with self._lock:
            return {what: (list(h.buckets), h.total, h.count) for what, h in self._measures.items()}

    def refusals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._refusals)


def begin(rpc: str, context: Any) -> tuple[Call, Call | None]:
    """Open the call being handled on this thread (for :func:`describe`), stacked on the current one."""
    call = Call(rpc, _peer(context))
    previous = getattr(_current, "call", None)
    _current.call = call
    return call, previous


def end(previous: Call | None) -> None:
    """Close this thread's current call (:func:`begin`), back to the one it stacked on."""
    _current.call = previous


def describe(event: str, **fields: Any) -> None:
    """Name what the call being handled did (``put``, ``get``, ``commit``, ``drop``) for its INFO line."""
    call = getattr(_current, "call", None)
    if call is not None:
        call.event = event
        call.fields.update(fields)


def _peer(context: Any) -> str:
    try:
        return context.peer() if context is not None else "this process"
    except Exception:  # a context without a peer (in-process calls)
        return "unknown"
