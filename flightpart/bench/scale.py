"""``flightpart bench --scale``: how flightpart's costs grow with partitions, nodes and datasets.

Each case runs at several sizes so the growth shows, not one point:

* **partitions**: one dataset of P one-column partitions on three real nodes
  (127.0.0.2-4): put, commit (timed at the client), the first open by a
  reader (and the catalog's CPU in it), open, ``validate``,
  the ``to_dask`` graph, the read back (checked equal) and the most memory
  maps any node keeps;
* **nodes**: N simulated nodes register with a real catalog and heartbeat
  every 2 s from sender processes; the catalog's CPU share and the bytes it
  writes to disk are read from ``/proc`` over a window, then ``list`` and
  ``nodes`` are timed with D datasets on one real node;
* **frozen**: ``abort`` and ``drop`` while three of four real nodes are
  stopped with SIGSTOP;
* **columns**: one dataset of C int64 columns and 100 rows on three real
  nodes: put, open and read back (checked equal), for tables ten thousand
  columns wide (every per-column step must be linear in columns).

Speed goals are checked here, never in timed unit tests.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa

from .guardian import Guardian

GOALS = {
    "put_seconds": (50_000, 45.0),
    "commit_seconds": (50_000, 5.0),
    "open_seconds": (50_000, 1.0),
    "to_dask_seconds": (50_000, 2.0),
    "validate_seconds": (50_000, 2.0),
    "node_maps": (50_000, 5_000),
    "first_open_catalog_cpu_seconds": (50_000, 0.5),
    "read_seconds": (100_000, 10.0),
}
"""Per partitions case: (size the goal is stated at, upper bound)."""
CATALOG_CPU_GOAL = (4_000, 0.5)
"""Simulated nodes heartbeating every 2 s: the catalog's share of one core stays under this."""
FROZEN_GOAL_SECONDS = 5.0
COLUMNS_GOAL = (10_000, 10.0)
"""A table this many columns wide (100 rows) is put and read back in under this many seconds."""
COLUMN_ROWS = 100
HEARTBEAT_SECONDS = 2.0

FULL = {"partitions": [1_000, 10_000, 50_000, 100_000], "nodes": [500, 2_000, 4_000], "datasets": 1_000, "window": 20.0,
        "columns": [1_000, 5_000, 10_000]}
QUICK = {"partitions": [200, 2_000], "nodes": [50, 200], "datasets": 30, "window": 6.0, "columns": [500, 2_000]}


class _Timed:
    """Wraps a client's ``call`` to time one action (the commit, inside a put)."""

    def __init__(self, client: Any, request: type):
        self.client, self.request, self.seconds = client, request, 0.0
        self.original = client.call

    def __enter__(self) -> _Timed:
        def call(body: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return self.original(body, *args, **kwargs)
            finally:
                if isinstance(body, self.request):
                    self.seconds += time.perf_counter() - t0

        self.client.call = call
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.call = self.original


def _seconds(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, out


def _daemons(cluster: Any) -> list[int]:
    """The pids of a local cluster's catalog and nodes."""
    return [cluster.catalog.pid, *(node.pid for node in cluster.nodes)]


def _watch(guardian: Guardian | None, pids: list[int]) -> None:
    """``pids`` told to the bench's watcher, which stops them should the bench be killed (no watcher: nothing)."""
    if guardian is not None:
        guardian.watch(pids)


def case_partitions(root: Path, sizes: list[int], log: Callable[[str], None],
                    guardian: Guardian | None = None) -> list[dict]:
    """One dataset of P partitions on three nodes, for each P."""
    from flightpart import protocol
    from flightpart.client import connect
    from flightpart.local.cluster import LocalCluster
    from flightpart.wire import Commit

    rows = []
    with LocalCluster(root / "partitions", nodes=3) as cluster, connect(cluster.uri, host="127.0.0.2") as client:
        _watch(guardian, _daemons(cluster))
        _wait_alive(client, 3)
        import dask.dataframe  # noqa: F401  (imported once, outside the timings)

        for p in sizes:
            log(f"  {p:,} partitions ...")
            table = pa.table({"a": np.arange(p * 10, dtype=np.int64)})
            catalog = psutil.Process(cluster.catalog.pid)
            cpu0 = sum(catalog.cpu_times()[:2])
            with _Timed(client, Commit) as commit:
                put_s, _ = _seconds(client.put, "scale", table, tiling=(p, 1))
            catalog_cpu = sum(catalog.cpu_times()[:2]) - cpu0
            with connect(cluster.uri, host="127.0.0.2") as reader:  # the first open by anyone but the writer
                cpu0 = sum(catalog.cpu_times()[:2])
                first_open_s, _ = _seconds(reader.open, "scale")
                first_open_cpu = sum(catalog.cpu_times()[:2]) - cpu0
            open_s, ds = _seconds(client.open, "scale")
            validate_s, _ = _seconds(protocol.validate, ds.__partitioned__, require_pickle=True)
            dask_s, ddf = _seconds(ds.to_dask)
            read_s, back = _seconds(ds.to_arrow)
            if not back.equals(table) or ddf.npartitions != p:
                raise AssertionError(f"{p} partitions: the data read back differs from what was put")
            maps = max(client.stats(n.uri).values["maps_open"] for n in cluster.nodes)
            client.drop("scale")
            rows.append({"partitions": p, "put_seconds": put_s, "commit_seconds": commit.seconds,
                         "catalog_cpu_seconds_in_put": catalog_cpu, "first_open_seconds": first_open_s,
                         "first_open_catalog_cpu_seconds": first_open_cpu, "open_seconds": open_s,
                         "validate_seconds": validate_s, "to_dask_seconds": dask_s, "read_seconds": read_s,
                         "node_maps": maps})
    return rows


def case_columns(root: Path, sizes: list[int], log: Callable[[str], None],
                 guardian: Guardian | None = None) -> list[dict]:
    """One dataset of C columns and :data:`COLUMN_ROWS` rows on three nodes, for each C."""
    from flightpart.client import connect
    from flightpart.local.cluster import LocalCluster

    rows = []
    with LocalCluster(root / "columns", nodes=3) as cluster, connect(cluster.uri, host="127.0.0.2") as client:
        _watch(guardian, _daemons(cluster))
        _wait_alive(client, 3)
        for c in sizes:
            log(f"  {c:,} columns ...")
            table = pa.table({f"c{k}": np.arange(COLUMN_ROWS, dtype=np.int64) + k for k in range(c)})
            put_s, _ = _seconds(client.put, "wide", table)
            open_s, ds = _seconds(client.open, "wide")
            read_s, back = _seconds(ds.to_arrow)
            if not back.equals(table):
                raise AssertionError(f"{c} columns: the data read back differs from what was put")
            client.drop("wide")
            rows.append({"columns": c, "rows": COLUMN_ROWS, "bytes": table.nbytes, "put_seconds": put_s,
                         "open_seconds": open_s, "read_seconds": read_s})
    return rows


def _wait_alive(client: Any, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while sum(1 for x in client.nodes() if x.alive) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {n} nodes alive after {timeout}s")
        time.sleep(0.1)


def _simulated(k: int) -> tuple[str, str]:
    """(node id, uri) of simulated node ``k``: an address in 198.18.0.0/15 nobody answers on."""
    return f"sim-{k:05d}", f"grpc://198.18.{k // 250}.{k % 250 + 1}:9"


def _beat(uri: str, first: int, last: int, interval: float, until: float, sent: Any, in_datagrams: Any) -> None:
    """A sender process: heartbeats of simulated nodes [first, last), each every ``interval`` seconds, sent as a
    node sends them (in a datagram, over Flight when the catalog does not take that)."""
    from flightpart.io.connections import ConnectionPool
    from flightpart.server.beats import ANSWER_SECONDS, DatagramBeats
    from flightpart.wire import Heartbeat

    pool = ConnectionPool()
    datagrams = DatagramBeats(None, timeout=ANSWER_SECONDS)  # as a node sends them
    ids = [_simulated(k)[0] for k in range(first, last)]
    count = taken = 0
    while time.time() < until:
        round_start = time.time()
        for k, node_id in enumerate(ids):  # spread over the interval, not in a burst
            target = round_start + interval * k / max(1, len(ids))
            if (delay := target - time.time()) > 0:
                time.sleep(delay)
            beat = Heartbeat(node_id, 1 << 40, False, int(time.time() * 1000))
            if datagrams.beat(uri, beat):
                taken += 1
            else:
                pool.action(uri, beat, timeout=10)
            count += 1
        if (rest := round_start + interval - time.time()) > 0:
            time.sleep(rest)
    with sent.get_lock():
        sent.value += count
        in_datagrams.value += taken


def case_nodes(root: Path, sizes: list[int], datasets: int, window: float, log: Callable[[str], None],
               guardian: Guardian | None = None) -> list[dict]:
    """N simulated nodes heartbeating every 2 s against one catalog; then ``list`` and ``nodes`` with D datasets."""
    from flightpart.client import connect
    from flightpart.local.cluster import LocalCluster
    from flightpart.version import __version__
    from flightpart.wire import RegisterNode

    rows = []
    for n in sizes:
        log(f"  {n:,} simulated nodes ...")
        with LocalCluster(root / f"nodes-{n}", nodes=1, first_ip=2, dead_after=10.0) as cluster, \
                connect(cluster.uri, host="127.0.0.2") as client:
            _watch(guardian, _daemons(cluster))
            _wait_alive(client, 1)
            for k in range(n):
                node_id, uri = _simulated(k)
                client.pool.action(cluster.uri,
                                   RegisterNode(node_id, uri, uri[7:].rsplit(":", 1)[0], 1, None, __version__))
            catalog = psutil.Process(cluster.catalog.pid)
            ctx = multiprocessing.get_context("spawn")
            sent, in_datagrams = ctx.Value("l", 0), ctx.Value("l", 0)
            senders = max(1, min(4, n // 500))
            until = time.time() + window
            procs = [ctx.Process(target=_beat, args=(cluster.uri, n * s // senders, n * (s + 1) // senders,
                                                     HEARTBEAT_SECONDS, until, sent, in_datagrams))
                     for s in range(senders)]
            for proc in procs:
                proc.start()
            _watch(guardian, [proc.pid for proc in procs])
            # senders started, spread, and past their first round (a catalog takes a node's datagrams after one
            # beat of it over Flight): the window measures the steady state
            time.sleep(min(2.0 + HEARTBEAT_SECONDS, window / 4))
            cpu0, io0, t0 = sum(catalog.cpu_times()[:2]), catalog.io_counters().write_bytes, time.perf_counter()
            time.sleep(max(0.0, until - time.time() - 0.5))
            cpu1, io1, t1 = sum(catalog.cpu_times()[:2]), catalog.io_counters().write_bytes, time.perf_counter()
            for proc in procs:
                proc.join()
            alive = sum(1 for x in client.nodes() if x.alive)
            for d in range(datasets):
                client.put(f"d{d:05d}", pa.table({"a": [d]}), tiling=(1, 1), nodes=[cluster.nodes[0].uri])
            list_s, listed = _seconds(client.list)
            nodes_s, known = _seconds(client.nodes)
            if len(listed) != datasets or len(known) != n + 1:
                raise AssertionError(f"list returned {len(listed)} of {datasets} datasets, nodes "
                                     f"{len(known)} of {n + 1}")
            rows.append({"simulated_nodes": n, "heartbeats_per_second": sent.value / window,
                         "share_in_datagrams": in_datagrams.value / max(1, sent.value),
                         "catalog_cpu_share": (cpu1 - cpu0) / (t1 - t0),
                         "catalog_write_bytes_per_30s": (io1 - io0) * 30 / (t1 - t0),
                         "alive_after": alive, "datasets": datasets, "list_seconds": list_s, "nodes_seconds": nodes_s})
    return rows


def case_frozen(root: Path, log: Callable[[str], None], guardian: Guardian | None = None) -> dict:
    """``abort`` and ``drop`` with three of four nodes stopped (SIGSTOP)."""
    import pyarrow.flight as flight

    from flightpart.client import connect
    from flightpart.errors import DatasetNotFound
    from flightpart.io.transfer import PutCall, send_partition
    from flightpart.local.cluster import LocalCluster
    from flightpart.wire import Abort, Begin

    log("  abort and drop with 3 frozen nodes ...")
    with LocalCluster(root / "frozen", nodes=4) as cluster, connect(cluster.uri, host="127.0.0.9") as client:
        _watch(guardian, _daemons(cluster))  # three of them are frozen below: a killed bench must not leave them so
        _wait_alive(client, 4)
        table = pa.table({"a": np.arange(4_000)})
        client.put("frozen", table, tiling=(4, 1))
        begun = client.call(Begin("half"))
        pending = begun.version
        for k, node in enumerate(cluster.nodes):
            send_partition(client.pool, node.uri, "half", pending, (k, 0), table.slice(k * 1000, 1000),
                           PutCall(grant=begun.grant))
        frozen = cluster.nodes[1:]
        for node in frozen:
            os.kill(node.pid, signal.SIGSTOP)
        try:
            abort_s, _ = _seconds(lambda: client.call(Abort("half", pending)))
            drop_s, _ = _seconds(lambda: client.drop("frozen"))
        finally:
            for node in frozen:
                os.kill(node.pid, signal.SIGCONT)
        try:
            client.open("frozen")
            raise AssertionError("a dropped dataset still opens")
        except (DatasetNotFound, flight.FlightError):
            pass
    return {"frozen_nodes": 3, "abort_seconds": abort_s, "drop_seconds": drop_s}


def _at(rows: list[dict], key: str, size_key: str, size: int) -> float | None:
    return next((r[key] for r in rows if r[size_key] == size), None)


def goals(result: dict) -> list[dict]:
    """Each goal with the measured value at its size (None when that size was not run)."""
    out = []
    for key, (size, bound) in GOALS.items():
        value = _at(result["partitions"], key, "partitions", size)
        out.append({"goal": f"{key} at {size:,} partitions < {bound:,}", "value": value,
                    "met": None if value is None else value < bound})
    size, bound = CATALOG_CPU_GOAL
    value = _at(result["nodes"], "catalog_cpu_share", "simulated_nodes", size)
    out.append({"goal": f"catalog CPU share with {size:,} nodes heartbeating every {HEARTBEAT_SECONDS:g} s < {bound}",
                "value": value, "met": None if value is None else value < bound})
    frozen = result["frozen"]
    worst = max(frozen["abort_seconds"], frozen["drop_seconds"])
    out.append({"goal": f"abort and drop with 3 frozen nodes < {FROZEN_GOAL_SECONDS:g} s", "value": worst,
                "met": worst < FROZEN_GOAL_SECONDS})
    size, bound = COLUMNS_GOAL
    put_s, read_s = (_at(result["columns"], key, "columns", size) for key in ("put_seconds", "read_seconds"))
    value = None if put_s is None or read_s is None else put_s + read_s
    out.append({"goal": f"put and read of {size:,} columns x {COLUMN_ROWS} rows < {bound:g} s", "value": value,
                "met": None if value is None else value < bound})
    largest = max(r["partitions"] for r in result["partitions"])
    out.append({"goal": "100,000 partitions put and read back", "value": largest, "met": largest >= 100_000 or None})
    return out


def run_scale(*, quick: bool = False, log: Callable[[str], None] = print) -> dict:
    """Every scale case at its sizes (``quick``: small sizes, a smoke test)."""
    sizes = QUICK if quick else FULL
    started = time.perf_counter()
    guardian = Guardian()  # killed in the middle, the bench leaves no daemon running or frozen, nothing on the disk
    with tempfile.TemporaryDirectory(prefix="flightpart-scale-") as tmp:
        guardian.remove(tmp)
        root = Path(tmp)
        try:
            log("running: partitions ...")
            partitions = case_partitions(root, sizes["partitions"], log, guardian)
            log("running: nodes ...")
            nodes = case_nodes(root, sizes["nodes"], sizes["datasets"], sizes["window"], log, guardian)
            log("running: frozen ...")
            frozen = case_frozen(root, log, guardian)
            log("running: columns ...")
            columns = case_columns(root, sizes["columns"], log, guardian)
        finally:
            guardian.close()
    result = {"quick": quick, "seconds": time.perf_counter() - started, "machine": {"cpus": os.cpu_count()},
              "partitions": partitions, "nodes": nodes, "frozen": frozen, "columns": columns}
    result["goals"] = goals(result)
    return result


def render_scale(result: dict) -> None:
    """The measured rows and the goals, as tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(140, Console().width))
    for key, title in (("partitions", "one dataset on 3 nodes"), ("nodes", "simulated nodes heartbeating every 2 s"),
                       ("columns", f"one wide dataset ({COLUMN_ROWS} rows) on 3 nodes")):
        rows = result.get(key)
        if not rows:
            continue
        t = Table(title=f"flightpart bench --scale: {title}")
        for col in rows[0]:
            t.add_column(col.replace("_", " "))
        for r in rows:
            t.add_row(*(f"{v:,.3f}" if isinstance(v, float) else f"{v:,}" for v in r.values()))
        console.print(t)
    t = Table(title=f"goals ({result['seconds']:.0f} s in all)")
    for col in ("goal", "measured", "met"):
        t.add_column(col)
    for g in result["goals"]:
        value = g["value"]
        shown = "not run" if value is None else (f"{value:,.3f}" if isinstance(value, float) else f"{value:,}")
        met = {True: "[green]yes[/]", False: "[red]no[/]", None: "[yellow]not run[/]"}[g["met"]]
        t.add_row(g["goal"], shown, met)
    console.print(t)


def plot_scale(result: dict, path: str) -> None:
    """Log-log growth: seconds against partitions, and the catalog's CPU share against nodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    rows = result["partitions"]
    sizes = [r["partitions"] for r in rows]
    for key in ("put_seconds", "commit_seconds", "read_seconds", "to_dask_seconds", "open_seconds", "validate_seconds"):
        left.plot(sizes, [max(r[key], 1e-4) for r in rows], marker="o", label=key.replace("_seconds", ""))
    left.plot(sizes, [sizes[0] and rows[0]["put_seconds"] * s / sizes[0] for s in sizes], ls=":", color="grey",
              label="linear from the first put")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("partitions in one dataset (3 nodes)")
    left.set_ylabel("seconds, log scale")
    left.legend(fontsize=7)
    left.set_title("cost per dataset size", fontsize=9)
    nodes = result["nodes"]
    counts = [r["simulated_nodes"] for r in nodes]
    right.plot(counts, [r["catalog_cpu_share"] for r in nodes], marker="o", label="catalog CPU (share of a core)")
    right.plot(counts, [r["list_seconds"] for r in nodes], marker="s",
               label=f"list, {nodes[0]['datasets']:,} datasets (s)")
    right.axhline(CATALOG_CPU_GOAL[1], ls=":", color="grey", label="goal: half a core")
    right.set_xlabel("nodes heartbeating every 2 s")
    right.legend(fontsize=7)
    right.set_title("cost per cluster size", fontsize=9)
    fig.suptitle("flightpart bench --scale")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
