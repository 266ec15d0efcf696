"""``flightpart bench``: flightpart against raw Flight, Dask and Ray, side by side.

Everything runs on this machine: a catalog and three nodes on 127.0.0.2-4
(the client plays node 1's host), a minimal pyarrow Flight server as the raw
baseline, a Dask LocalCluster with three workers and a local Ray. Each case
warms up, then alternates its contenders (A B A B ...) so that drift of the
machine hits all of them, and reports medians and ratios.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight

from flightpart.frames import rechunk
from flightpart.io.layout import partition_relpath
from flightpart.tiling import grid_cells

from .guardian import Guardian
from .measure import MIB, Case, Group, alternate, moved_by_nodes, only, thaw

GIB = 1 << 30


def bench_table(nbytes: int, seed: int = 0) -> pa.Table:
    """About ``nbytes`` of float64 columns and a string column."""
    rng = np.random.default_rng(seed)
    words = pa.array([f"item-{k:05d}" for k in range(5000)])
    per_row = 4 * 8 + 10 + 8  # four float64, ~10 string bytes, an offset
    rows = max(1, nbytes // per_row)
    columns = {f"f{k}": rng.random(rows) for k in range(4)}
    columns["label"] = pc.take(words, pa.array(rng.integers(0, len(words), rows)))
    return pa.table(columns)


def sales_table(nbytes: int, seed: int = 0) -> pa.Table:
    """About ``nbytes`` of a sales-like table: sorted order ids and days, repeated store and product names, small
    integers, prices with cents. What real tables look like to a compressor (random floats do not shrink)."""
    rng = np.random.default_rng(seed)
    per_row = 8 + 4 + 4 + 9 + 4 + 13 + 2 + 8  # ids, days, store and product names with offsets, quantity, price
    rows = max(1, nbytes // per_row)
    stores = pa.array([f"store-{k:03d}" for k in range(200)])
    products = pa.array([f"product-{k:05d}" for k in range(5000)])
    return pa.table({
        "order_id": np.arange(rows, dtype=np.int64),
        "day": np.sort(rng.integers(0, 365, rows)).astype(np.int32),
        "store": pc.take(stores, pa.array(rng.integers(0, len(stores), rows))),
        "product": pc.take(products, pa.array(rng.zipf(1.3, rows) % len(products))),
        "quantity": rng.integers(1, 10, rows).astype(np.int16),
        "price": np.round(rng.gamma(2.0, 10.0, rows), 2),
    })


DATA_KINDS = {"floats": bench_table, "sales": sales_table}


def bench_data(kind: str, nbytes: int) -> pa.Table:
    """The bench's table of ``kind`` ("floats" or "sales"), the same in every process that asks."""
    return DATA_KINDS[kind](nbytes)


def _children() -> set[int]:
    """This process's child processes now (each system the harness starts is told apart by what it added)."""
    return {child.pid for child in psutil.Process().children()}


class Harness:
    """Starts and stops everything the cases need."""

    def __init__(self, root: str, table: pa.Table, *, with_dask: bool = True, with_ray: bool = True):
        from flightpart.client import connect
        from flightpart.local.cluster import LocalCluster

        self.root = root
        self.table = table
        self.guardian = Guardian()  # killed in the middle, the bench leaves nothing running, frozen or on the disk
        self.guardian.remove(root)
        self.cluster = LocalCluster(root, nodes=3, heartbeat=1.0)
        # a busy machine may take long over a call (a commit of 10,000 partitions): the bench waits, not fails
        self.client = connect(self.cluster.uri, host="127.0.0.2", timeout=600)
        self.flightpart = Group("flightpart", [self.cluster.catalog.pid, *(node.pid for node in self.cluster.nodes)])
        self.raw = Group("raw pyarrow Flight")
        self.groups = [self.flightpart, self.raw]
        self.dask = None
        self.ray = None
        if with_dask:
            import dask
            import distributed

            # its scheduler runs in this process and is never frozen: frozen workers must not be retired as lost
            dask.config.set({"distributed.scheduler.worker-ttl": None})
            before = _children()
            self._dask_cluster = distributed.LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=None,
                                                          memory_limit=0, silence_logs=50)
            self.dask = distributed.Client(self._dask_cluster)
            self.groups.append(Group("dask", sorted(_children() - before)))
        if with_ray:
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            # Ray is frozen while other systems are timed; its driver (this process) must not give up on a GCS that
            # does not answer for the length of a case (Ray's default: 60 s, then it ends the driver)
            for setting in ("RAY_gcs_rpc_server_reconnect_timeout_s", "RAY_gcs_server_request_timeout_seconds"):
                os.environ.setdefault(setting, "3600")
            import ray

            before = _children()
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                     object_store_memory=max(3 * table.nbytes + 256 * MIB, 512 * MIB))
            self.ray = ray
            self.groups.append(Group("ray", sorted(_children() - before)))
        self.baseline = None
        self.baseline_uri: str | None = None
        for g in self.groups:
            g.watcher = self.guardian.watch
            self.guardian.watch(g.members())

    def group(self, name: str) -> Group:
        """The group of processes of the system ``name``."""
        return next(g for g in self.groups if g.name == name)

    def systems(self, needs: dict[str, str]) -> tuple[list[Group], dict[str, list[Group]]]:
        """What :func:`alternate` freezes and thaws: every group, and for each contender the one it runs on
        (by name: ``flightpart``, ``raw pyarrow Flight``, ``dask`` or ``ray``)."""
        return self.groups, {contender: [self.group(name)] for contender, name in needs.items()}

    @contextlib.contextmanager
    def only(self, name: str = "flightpart") -> Iterator[None]:
        """One system running, the others frozen, for a case with one contender system."""
        only(self.groups, [self.group(name)])
        try:
            yield
        finally:
            thaw(self.groups)

    def start_baseline(self, path: str) -> str:
        proc = subprocess.Popen([sys.executable, "-m", "flightpart.bench.baseline", "127.0.0.3", path],
                                stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError("the baseline Flight server did not start")
        self.baseline = proc
        self.baseline_uri = line.split()[2]
        self.raw.pids.append(proc.pid)
        self.guardian.watch([proc.pid])
        return self.baseline_uri

    def close(self) -> None:
        thaw(self.groups)
        self.client.close()
        if self.baseline is not None:
            self.baseline.terminate()
            self.baseline.wait(30)
        if self.dask is not None:
            self.dask.close()
            self._dask_cluster.close()
        if self.ray is not None:
            self.ray.shutdown()
        self.cluster.stop()
        self.guardian.close()


def case_remote(h: Harness, runs: int) -> Case:
    from flightpart.wire import GetNodeInfo

    ds = h.client.put("bench-remote", h.table, tiling=(1, 1), nodes=["127.0.0.3"])
    ref, get = ds.__partitioned__["partitions"][(0, 0)]["data"], ds.__partitioned__["get"]
    info = h.client.pool.action(ref.replicas[0][0], GetNodeInfo())
    path = os.path.join(info.data_dir, partition_relpath("bench-remote", ds.version, (0, 0)))
    uri = h.start_baseline(path)
    raw = flight.connect(uri)
    with h.only("raw pyarrow Flight"):
        sizes = {s: min(alternate({"raw": lambda s=s: raw.do_get(flight.Ticket(str(s).encode())).read_all()}, 2)["raw"])
                 for s in (256 * 1024, 512 * 1024, MIB, 4 * MIB, 32 * MIB)}
    best = min(sizes, key=sizes.get)
    cpu: dict[str, list[float]] = {}
    raw_name = f"raw pyarrow Flight ({best // 1024} KiB batches)"
    times = alternate({
        "flightpart get (streamed)": lambda: get(ref),
        raw_name: lambda: raw.do_get(flight.Ticket(str(best).encode())).read_all(),
    }, runs, cpu=cpu, systems=h.systems({"flightpart get (streamed)": "flightpart", raw_name: "raw pyarrow Flight"}))
    return judged_read(Case("remote partition read", ">= 0.95x raw Flight at <= 1.05x its client CPU per GB",
                            h.table.nbytes, times, cpu=cpu,
                            extra={"baseline_batch_bytes": best,
                                   "baseline_by_batch_seconds": {str(k): v for k, v in sizes.items()}}))


def judged_read(case: Case) -> Case:
    """A remote read (flightpart first, raw Flight second in ``case.times``) judged by its goal: at least 0.95x raw
    Flight's speed at no more than 1.05x its client CPU."""
    case.ratio = tuple(case.times)  # type: ignore[assignment]
    cpu_ratio = case.cpu_ratio()
    case.met = case.speed_ratio() >= 0.95 and cpu_ratio is not None and cpu_ratio <= 1.05
    return case


PARTITION_SIZES = (MIB, 16 * MIB, 128 * MIB)
"""The smaller partitions a remote read is timed at, beside the whole table (:func:`case_remote_sizes`)."""


def case_remote_sizes(h: Harness, runs: int) -> list[Case]:
    """The remote read of partitions of 1, 16 and 128 MiB (the first rows of the table, each a dataset of its own)
    against raw Flight streaming the same rows from memory at its best batch size for them. A small read is mostly
    fixed costs, so it is timed many times (a run is about a millisecond); both servers run and Dask and Ray are
    frozen, since switching processes around each run would cost far more than the read."""
    if h.baseline_uri is None:
        raise RuntimeError("the remote case starts the baseline server first")
    raw = flight.connect(h.baseline_uri)
    per_row = h.table.nbytes / h.table.num_rows

    def raw_read(batch: int, rows: int) -> Callable[[], pa.Table]:
        return lambda: raw.do_get(flight.Ticket(f"{batch}:{rows}".encode())).read_all()

    cases = []
    only(h.groups, [h.group("flightpart"), h.group("raw pyarrow Flight")])
    try:
        for size in (s for s in PARTITION_SIZES if s < h.table.nbytes):
            rows = int(size / per_row)
            name = f"bench-remote-{size // MIB}mib"
            ds = h.client.put(name, h.table.slice(0, rows), tiling=(1, 1), nodes=["127.0.0.3"])
            ref, get = ds.__partitioned__["partitions"][(0, 0)]["data"], ds.__partitioned__["get"]
            sizes = {b: min(alternate({"raw": raw_read(b, rows)}, 5)["raw"]) for b in (MIB, 4 * MIB, 32 * MIB)
                     if b <= size}
            best = min(sizes, key=sizes.get)
            raw_name = f"raw pyarrow Flight ({best // 1024} KiB batches)"
            cpu: dict[str, list[float]] = {}
            times = alternate({
                "flightpart get (streamed)": lambda get=get, ref=ref: get(ref),
                raw_name: raw_read(best, rows),
            }, max(runs, min(101, (2 << 30) // size)), cpu=cpu)
            cases.append(judged_read(Case(f"remote partition read, {size // MIB} MiB",
                                          ">= 0.95x raw Flight at <= 1.05x its client CPU", int(rows * per_row), times,
                                          cpu=cpu, extra={"baseline_batch_bytes": best, "rows": rows})))
            h.client.drop(name, ds.version)
    finally:
        thaw(h.groups)
        raw.close()
    return cases


def case_local(h: Harness, runs: int) -> Case:
    ds = h.client.put("bench-local", h.table, tiling=(1, 1), nodes=["127.0.0.2"])
    d = ds.__partitioned__
    ref = d["partitions"][(0, 0)]["data"]
    get = d["get"]
    process = psutil.Process()
    pool_before, rss_before = pa.total_allocated_bytes(), process.memory_info().rss
    probe = get(ref)
    copied = pa.total_allocated_bytes() - pool_before
    rss_growth = process.memory_info().rss - rss_before
    del probe
    contenders: dict[str, Callable[[], Any]] = {"flightpart get (local mmap)": lambda: get(ref)}
    needs = {"flightpart get (local mmap)": "flightpart"}
    if h.ray is not None:
        ray_ref = h.ray.put(h.table)
        contenders["ray.get (same node)"] = lambda: h.ray.get(ray_ref)
        needs["ray.get (same node)"] = "ray"
    if h.dask is not None:
        future = h.dask.scatter(h.table, workers=[sorted(h.dask.scheduler_info()["workers"])[0]])
        contenders["dask client.gather (from a worker)"] = lambda: h.dask.gather(future)
        needs["dask client.gather (from a worker)"] = "dask"
    times = alternate(contenders, runs, systems=h.systems(needs))
    case = Case("local partition read", "constant time (< 5 ms for 1 GiB), 0 bytes copied, no slower than ray.get",
                h.table.nbytes, times, extra={"arrow_pool_bytes_allocated": copied, "rss_growth_bytes": rss_growth})
    ours = case.median("flightpart get (local mmap)")
    limit = 5e-3 * max(1.0, h.table.nbytes / GIB)
    case.met = copied == 0 and ours < max(limit, 5e-3) and (h.ray is None
                                                            or ours <= case.median("ray.get (same node)") * 1.05)
    if h.ray is not None:
        case.ratio = ("flightpart get (local mmap)", "ray.get (same node)")
    return case


def case_whole(h: Harness, runs: int) -> Case:
    ds = h.client.put("bench-whole", h.table, tiling=(3, 1))
    parts = [h.table.slice(c.start[0], c.shape[0]) for c in grid_cells(ds.shape, (3, 1))]
    contenders: dict[str, Callable[[], Any]] = {
        "flightpart to_arrow()": lambda: h.client.open("bench-whole").to_arrow()}
    needs = {"flightpart to_arrow()": "flightpart"}
    if h.dask is not None:
        workers = sorted(h.dask.scheduler_info()["workers"])
        futures = [h.dask.scatter(p, workers=[w]) for p, w in zip(parts, workers)]
        contenders["dask client.gather (3 workers)"] = lambda: h.dask.gather(futures)
        needs["dask client.gather (3 workers)"] = "dask"
    if h.ray is not None:
        refs = [h.ray.put(p) for p in parts]
        contenders["ray.get (3 refs)"] = lambda: h.ray.get(refs)
        needs["ray.get (3 refs)"] = "ray"
    times = alternate(contenders, runs, systems=h.systems(needs))
    case = Case("whole dataset read (3 nodes, 1 local)", ">= 2x Dask", h.table.nbytes, times)
    if h.dask is not None:
        case.ratio = ("flightpart to_arrow()", "dask client.gather (3 workers)")
        case.met = case.speed_ratio() >= 2.0
    return case


def case_put(h: Harness, runs: int) -> Case:
    if h.baseline_uri is None:
        raise RuntimeError("the remote case starts the baseline server first")
    raw = flight.connect(h.baseline_uri)
    batched = rechunk(h.table, MIB)

    def raw_put():
        writer, _ = raw.do_put(flight.FlightDescriptor.for_path("raw"), batched.schema)
        writer.write_table(batched)
        writer.close()

    names: list[str] = []

    def fp_put():
        names.append(f"bench-put-{len(names)}")
        return h.client.put(names[-1], h.table, tiling=(3, 1))

    ours, theirs = "flightpart put (3 nodes, fsync)", "raw Flight do_put (1 server, memory)"
    times = alternate({ours: fp_put, theirs: raw_put}, runs,
                      systems=h.systems({ours: "flightpart", theirs: "raw pyarrow Flight"}), rewarm=False)
    for name in names:
        h.client.drop(name)
    case = Case("put", ">= 0.9x raw Flight do_put", h.table.nbytes, times)
    case.ratio = tuple(times)  # type: ignore[assignment]
    case.met = case.speed_ratio() >= 0.9
    return case


def case_open(h: Harness, runs: int, partitions: int) -> Case:
    small = pa.table({"a": np.arange(partitions, dtype=np.int64)})
    t0 = time.perf_counter()
    h.client.put("bench-open", small, tiling=(partitions, 1))
    put_s = time.perf_counter() - t0
    times = alternate({f"client.open ({partitions} partitions)": lambda: h.client.open("bench-open")}, runs)
    size = len(pickle.dumps(h.client.open("bench-open").__partitioned__))
    case = Case("open", "< 200 ms and < 300 pickled bytes per partition (10,000 partitions)", 0, times,
                extra={"partitions": partitions, "pickled_bytes": size,
                       "pickled_bytes_per_partition": size / partitions, "put_seconds": put_s})
    case.met = case.median(next(iter(times))) < 0.2 and size / partitions < 300
    return case


def case_filter(h: Harness, runs: int) -> Case:
    """A 1 % filter evaluated on the nodes, against reading everything and filtering at the client (and DuckDB both
    ways)."""
    import duckdb

    from flightpart.client import connect

    h.client.put("bench-filter", h.table, tiling=(12, 1))
    expr = pc.field("f0") < 0.01
    remote = connect(h.cluster.uri, host="127.0.0.9")  # a host of its own: every partition crosses a socket
    ds = remote.open("bench-filter")
    near = ds.filter(expr)
    con = duckdb.connect()
    contenders = {
        "flightpart ds.filter(f0 < 0.01) on the nodes": lambda: near.to_arrow(),
        "read everything, filter at the client": lambda: ds.to_arrow().filter(expr),
        "DuckDB over ds.filter(...).to_duckdb()": lambda: near.to_duckdb(con).to_arrow_table(),
        "DuckDB: ds.to_duckdb().filter('f0 < 0.01')": lambda: ds.to_duckdb(con).filter("f0 < 0.01").to_arrow_table(),
    }
    moved = {}
    for name, fn in contenders.items():
        before = moved_by_nodes(h)
        fn()
        after = moved_by_nodes(h)
        moved[name] = {k: after[k] - before[k] for k in after}
    times = alternate(contenders, runs)
    remote.close()
    case = Case("selective filter (1 %, 3 remote nodes)", ">= 3x reading everything and filtering at the client",
                h.table.nbytes, times, extra={"moved": moved})
    case.ratio = ("flightpart ds.filter(f0 < 0.01) on the nodes", "read everything, filter at the client")
    case.met = case.speed_ratio() >= 3.0
    return case


def case_repartition(h: Harness, runs: int) -> Case:
    """(3, 1) -> (6, 2) built by the nodes, against reading everything into one client and putting it back."""
    from flightpart.client import connect
    from flightpart.io.transfer import TRAFFIC

    source = h.client.put("bench-repartition", h.table, tiling=(3, 1)).version
    remote = connect(h.cluster.uri, host="127.0.0.9")  # a host of its own: the client's reads cross a socket too

    def on_nodes() -> None:
        remote.repartition("bench-repartition", tiling=(6, 2))

    def through_client() -> None:
        remote.put("bench-repartition", remote.open("bench-repartition", source).to_arrow(), tiling=(6, 2))

    contenders = {"flightpart repartition on the nodes": on_nodes, "read into one client, put back": through_client}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    through: dict[str, int] = {}
    for k in range(runs + 1):  # the first round warms up; each run starts from the same source version
        for name, fn in contenders.items():
            gc.collect()
            before = TRAFFIC.snapshot()
            t0 = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - t0
            after = TRAFFIC.snapshot()
            through[name] = sum(after[key] - before[key] for key in after)
            if k:
                times[name].append(elapsed)
            remote.drop("bench-repartition", remote.versions("bench-repartition")[-1])
    remote.close()
    h.client.drop("bench-repartition")
    case = Case("repartition (3, 1) -> (6, 2), 3 nodes", ">= 1.5x reading into one client and putting back",
                h.table.nbytes, times, extra={"bytes_through_client": through})
    case.ratio = ("flightpart repartition on the nodes", "read into one client, put back")
    case.met = case.speed_ratio() >= 1.5 and through["flightpart repartition on the nodes"] == 0
    return case


_PEAK = """
import json, sys, time
import flightpart as fp
def peak():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
with fp.connect(sys.argv[1], host="127.0.0.9") as client:
    ds = client.open("bench-stream")
    base = peak()
    t0 = time.perf_counter()
    rows = sum(b.num_rows for b in ds.to_batches()) if sys.argv[2] == "batches" else ds.to_arrow().num_rows
    print(json.dumps({"seconds": time.perf_counter() - t0, "growth": peak() - base, "rows": rows}))
"""


def case_stream(h: Harness, runs: int) -> Case:
    """Peak memory of a reader process: to_batches() against to_arrow(), each in a fresh process."""
    import json

    h.client.put("bench-stream", h.table, tiling=(24, 1))
    times: dict[str, list[float]] = {"flightpart to_batches()": [], "flightpart to_arrow()": []}
    growth: dict[str, list[int]] = {k: [] for k in times}
    for _ in range(runs):
        for name, how in (("flightpart to_batches()", "batches"), ("flightpart to_arrow()", "arrow")):
            out = subprocess.run([sys.executable, "-c", _PEAK, h.cluster.uri, how], capture_output=True, text=True,
                                 timeout=600)
            if out.returncode != 0:
                raise RuntimeError(f"the {how} reader failed: {out.stderr[-500:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            times[name].append(result["seconds"])
            growth[name].append(result["growth"])
    peak = {k: statistics.median(v) for k, v in growth.items()}
    case = Case("streaming read (peak memory of the reader)", "to_batches() peak growth < 25 % of the dataset",
                h.table.nbytes, times, extra={"peak_growth_bytes": peak,
                                              "peak_growth_share": {k: v / h.table.nbytes for k, v in peak.items()}})
    case.met = peak["flightpart to_batches()"] < 0.25 * h.table.nbytes
    return case


def run_bench(size: int, *, quick: bool = False, runs: int | None = None, open_partitions: int = 10_000,
              with_dask: bool = True, with_ray: bool = True, log: Callable[[str], None] = print) -> dict:
    runs = runs or (5 if quick else 7)
    table = bench_table(size)
    started, memory = time.perf_counter(), psutil.virtual_memory()
    cases: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="flightpart-bench-") as root:
        h = Harness(root, table, with_dask=with_dask, with_ray=with_ray)
        try:
            from .queries import case_queries
            from .sql_queries import case_flight_sql

            for fn in (case_remote, case_local, case_whole, case_put):  # each freezes what it does not measure
                log(f"running: {fn.__name__[5:]} ...")
                cases.append(fn(h, runs))
                if fn is case_remote:
                    log("running: remote_sizes ...")
                    cases.extend(case_remote_sizes(h, runs))
            for fn in (case_filter, case_repartition, case_stream, case_queries, case_flight_sql):
                log(f"running: {fn.__name__[5:]} ...")
                with h.only("flightpart"):  # flightpart against what runs in this process (DuckDB, a client)
                    cases.append(fn(h, runs))
            log("running: open ...")
            with h.only("flightpart"):
                cases.append(case_open(h, runs, open_partitions))
        finally:
            h.close()
    return {
        "size_bytes": table.nbytes, "quick": quick, "runs": runs, "seconds": time.perf_counter() - started,
        "machine": {"cpus": os.cpu_count(), "memory_bytes": memory.total, "python": sys.version.split()[0],
                    "pyarrow": pa.__version__,
                    # a put writes new files: with the page cache full they cost the kernel's reclaim too
                    "free_bytes_at_start": memory.free, "page_cache_bytes_at_start": getattr(memory, "cached", None)},
        "cases": [c.as_json() for c in cases],
    }


def render(result: dict) -> None:
    """A table of medians, throughput and ratios."""
    from rich.console import Console
    from rich.table import Table

    where = f", links: {result['network']}" if result.get("network") else ""
    t = Table(title=f"flightpart bench: {result['size_bytes'] / MIB:,.0f} MiB, {result['runs']} runs per contender, "
                    f"{result['seconds']:.0f} s{where}")
    for col in ("case", "contender", "median", "GB/s", "CPU s/GB", "ratio", "goal", "met"):
        t.add_column(col)
    blank = ("",) * 6
    for case in result["cases"]:
        first = True
        cpu = case.get("cpu_seconds_per_gb", {})
        for who, median in case["median_seconds"].items():
            gbps = case["throughput_gbps"].get(who)
            ratio = ""
            if first and case["speed_ratio"] is not None:
                ratio = f"{case['speed_ratio']:.2f}x vs {case['ratio_of'][1]}"
            met = "" if not first or case["met"] is None else ("[green]yes[/]" if case["met"] else "[red]no[/]")
            t.add_row(case["case"] if first else "", who, f"{median * 1e3:,.2f} ms", f"{gbps:.2f}" if gbps else "",
                      f"{cpu[who]:.2f}" if who in cpu else "", ratio, case["goal"] if first else "", met)
            first = False
        extras = {k: v for k, v in case.items()
                  if k in ("pickled_bytes_per_partition", "arrow_pool_bytes_allocated", "rss_growth_bytes")}
        for k, v in extras.items():
            t.add_row("", f"  {k}", f"{v:,.0f}", *blank)
        if case.get("share_of_link_rate") is not None:
            t.add_row("", f"  share of the link rate, {case.get('share_of_link_rate_of', 'flightpart')}",
                      f"{case['share_of_link_rate']:.2f}", *blank)
        if case.get("streams_compressed"):
            t.add_row("", "  streams the nodes sent compressed", f"{case['streams_compressed']:,}", *blank)
        for who, moved in case.get("moved", {}).items():
            t.add_row("", f"  moved by {who}", f"{moved['bytes_sent'] / MIB:,.1f} MiB", *blank)
        for who, grown in case.get("peak_growth_bytes", {}).items():
            t.add_row("", f"  peak memory growth, {who}", f"{grown / MIB:,.0f} MiB", *blank)
    Console(width=max(Console().width, 160)).print(t)


def as_markdown(result: dict) -> str:
    """The run as docs/benchmarks.md shows it: one row per contender, the ratio and goal on each case's first."""
    lines = [f"{result['size_bytes'] / MIB:,.0f} MiB, {result['runs']} runs per contender, {result['seconds']:.0f} s, "
             f"{result['machine']['cpus']} CPUs, pyarrow {result['machine']['pyarrow']}.", "",
             "| case | contender | median | GB/s | CPU s/GB | ratio | goal | met |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for case in result["cases"]:
        cpu = case.get("cpu_seconds_per_gb", {})
        for k, (who, median) in enumerate(case["median_seconds"].items()):
            gbps = case.get("throughput_gbps", {}).get(who)
            first = k == 0
            ratio = f"{case['speed_ratio']:.2f}x vs {case['ratio_of'][1]}" if first and case.get("speed_ratio") else ""
            if ratio and case.get("cpu_ratio"):
                ratio += f" at {case['cpu_ratio']:.2f}x its CPU"
            met = "" if not first or case.get("met") is None else ("yes" if case["met"] else "**no**")
            lines.append(f"| {case['case'] if first else ''} | {who} | {median * 1e3:,.2f} ms | "
                         f"{f'{gbps:.2f}' if gbps else ''} | {f'{cpu[who]:.2f}' if who in cpu else ''} | {ratio} | "
                         f"{case['goal'] if first else ''} | {met} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: str) -> None:
    """A bar chart of the medians, one panel per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = result["cases"]
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 4.2))
    for ax, case in zip(axes, cases):
        names = list(case["median_seconds"])
        values = [case["median_seconds"][n] * 1e3 for n in names]
        colours = ["#1f77b4" if n.startswith(("flightpart", "client.open")) else "#bbbbbb" for n in names]
        ax.bar(range(len(names)), values, color=colours)
        ax.set_xticks(range(len(names)), [n.replace(" (", "\n(") for n in names], fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("median ms, log scale (lower is better)")
        for k, v in enumerate(values):
            ax.annotate(f"{v:,.2f}" if v < 10 else f"{v:,.0f}", (k, v), ha="center", va="bottom", fontsize=7)
        ax.set_title(case["case"], fontsize=9)
    fig.suptitle(f"flightpart bench, {result['size_bytes'] / MIB:,.0f} MiB")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
