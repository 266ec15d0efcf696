"""What every bench case is made of: a :class:`Case` (timings per contender, the goal it is judged by), the
alternating timer, and the nodes' own counters of what moved."""

from __future__ import annotations

import gc
import os
import signal
import statistics
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

MIB = 1 << 20
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process, all its threads."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass
class Group:
    """The processes of one contender system: frozen together (with every process they started since) while
    another system is measured, so their idle CPU never taxes it on a small machine."""

    name: str
    pids: list[int] = field(default_factory=list)
    watcher: Callable[[list[int]], None] | None = None
    """Told the members each time the group is signalled (the bench's :class:`~flightpart.bench.guardian.Guardian`:
    a process frozen here is thawed and stopped should the bench be killed)."""

    def members(self) -> list[int]:
        """The group's processes and their descendants as they are now (a Ray worker started since counts)."""
        found = list(self.pids)
        for pid in self.pids:
            try:
                found += [child.pid for child in psutil.Process(pid).children(recursive=True)]
            except psutil.Error:
                pass
        return found

    def signal(self, sig: int) -> None:
        """``sig`` to every member; a SIGSTOP returns once each one has stopped (it lands only when the process
        is next scheduled), or after :data:`STOP_WAIT` seconds."""
        members = self.members()
        if self.watcher is not None:
            self.watcher(members)
        for pid in members:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):  # gone, or its pid already another user's process
                pass
        if sig == signal.SIGSTOP:
            _wait_stopped(members)

    def cpu(self) -> float:
        """CPU seconds the group's own processes have used so far."""
        return sum(cpu_seconds(pid) for pid in self.pids)


STOP_WAIT = 2.0
"""Seconds :meth:`Group.signal` waits for stopped processes to be seen stopped."""


def _wait_stopped(pids: list[int]) -> None:
    deadline = time.monotonic() + STOP_WAIT
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                    break
            except psutil.Error:
                break
            time.sleep(0.001)


def only(groups: Sequence[Group], active: Collection[Group]) -> None:
    """The ``active`` groups running, every other one frozen."""
    for g in groups:
        g.signal(signal.SIGCONT if any(g is a for a in active) else signal.SIGSTOP)


def thaw(groups: Sequence[Group]) -> None:
    """Every group running again."""
    for g in groups:
        g.signal(signal.SIGCONT)


@dataclass
class Case:
    """One benchmark case: timings per contender and what it is judged by."""

    name: str
    goal: str
    nbytes: int
    times: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    ratio: tuple[str, str] | None = None  # (ours, baseline): ratio = baseline median / ours median (speed ratio)
    met: bool | None = None
    cpu: dict[str, list[float]] = field(default_factory=dict)  # CPU seconds per run, where measured (the reader's
    # process in the plain bench; the contender's readers and servers in the network bench)

    def cpu_per_gb(self, who: str) -> float:
        """Median CPU seconds per GB moved, for ``who``."""
        return statistics.median(self.cpu[who]) / (self.nbytes / 1e9)

    def cpu_ratio(self) -> float | None:
        """Our CPU over the baseline's (below 1 means flightpart spends less), where both were measured."""
        if not self.ratio or not all(who in self.cpu for who in self.ratio):
            return None
        ours, base = self.ratio
        spent = statistics.median(self.cpu[base])
        return statistics.median(self.cpu[ours]) / spent if spent > 0 else None  # /proc counts in 10 ms ticks

    def median(self, who: str) -> float:
        return statistics.median(self.times[who])

    def speed_ratio(self) -> float | None:
        if not self.ratio:
            return None
        ours, base = self.ratio
        return self.median(base) / self.median(ours)

    def as_json(self) -> dict:
        return {
            "case": self.name, "goal": self.goal, "bytes": self.nbytes, "met": self.met,
            "median_seconds": {k: self.median(k) for k in self.times},
            "runs_seconds": self.times,
            "throughput_gbps": {k: self.nbytes / self.median(k) / 1e9 for k in self.times if self.nbytes},
            "speed_ratio": self.speed_ratio(), "ratio_of": list(self.ratio) if self.ratio else None,
            **({"cpu_seconds_per_gb": {k: self.cpu_per_gb(k) for k in self.cpu}, "runs_cpu_seconds": self.cpu,
                "cpu_ratio": self.cpu_ratio()} if self.cpu and self.nbytes else {}),
            **self.extra,
        }


def alternate(contenders: dict[str, Callable[[], Any]], runs: int, warmup: int = 1,
              cpu: dict[str, list[float]] | None = None,
              systems: tuple[Sequence[Group], dict[str, Collection[Group]]] | None = None,
              rewarm: bool = True) -> dict[str, list[float]]:
    """Warm each contender up, then time them in turn, A B A B ...; ``cpu`` (when given) collects this process's
    CPU seconds per run (every thread's: a reader's gRPC threads are its cost too).

    ``systems`` (every group, and the groups each contender needs): each
    contender runs with only its own groups' processes running, the others
    frozen, and warmed up again right before each timed run (a process that
    sat frozen pays page faults on its first run: see ``bench --network``);
    ``rewarm=False`` skips those warm-ups (where each run writes a dataset of its own, as a put does).
    """
    groups, needs = systems if systems is not None else ((), {})

    def switch(name: str) -> None:
        if systems is not None:
            only(groups, needs.get(name, ()))

    try:
        for name, fn in contenders.items():
            switch(name)
            for _ in range(warmup):
                fn()
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(runs):
            for name, fn in contenders.items():
                if systems is not None and len(contenders) > 1:
                    switch(name)
                    if rewarm:
                        fn()
                gc.collect()
                c0, t0 = time.process_time(), time.perf_counter()
                result = fn()
                times[name].append(time.perf_counter() - t0)
                if cpu is not None:
                    cpu.setdefault(name, []).append(time.process_time() - c0)
                del result
        return times
    finally:
        thaw(groups)


def moved_by_nodes(h: Any) -> dict[str, int]:
    """Bytes and rows the harness's nodes have sent, summed (their own counters)."""
    per_node = [h.client.stats(n.uri).values for n in h.cluster.nodes]
    return {k: sum(s[k] for s in per_node) for k in ("bytes_sent", "rows_sent")}
