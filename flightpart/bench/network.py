"""``flightpart bench --network RATE``: the cases that locality and the transport decide, on hosts with real links.

The catalog, three nodes, a client host and the Dask workers run on a
:class:`~flightpart.local.netcluster.NetCluster`: network namespaces whose
links are shaped to RATE (``1gbit``, ``10gbit``, any ``tc`` rate), or the
loopback aliases of this machine (``loopback``). Each Dask worker shares a
node's host, the raw Flight baseline serves from node 2's host, and every
reader is a process of its own on the host it plays (see
:mod:`flightpart.bench.driver`).

Each contender is measured with only its own processes running: the
others are frozen (SIGSTOP) while it runs, so idle daemons of one system
never tax another on a small machine. Beside every time the bench reports
CPU seconds per GB: the reader and the processes that served it, from
``/proc``, which does not depend on the number of cores.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pyarrow as pa

from flightpart.local.netcluster import Host, NetCluster, rate_bits, unavailable

from .guardian import Guardian
from .measure import MIB, Case, Group, only, thaw

BASELINE_BATCHES = (MIB, 4 * MIB, 32 * MIB)


class Driver:
    """A reader process on a host (:mod:`flightpart.bench.driver`), one JSON command per line."""

    def __init__(self, host: Host, kind: str, log_dir: Path, env: dict | None = None, **start: object):
        self.log = open(log_dir / f"driver-{kind}-{host.ip}.log", "w")
        self.proc = host.popen([sys.executable, "-m", "flightpart.bench.driver", kind], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.pid = self.proc.pid
        self._answer("start")
        self.send("start", **start)

    def _answer(self, what: str) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the bench reader {self.proc.args[-1]} died during {what}; see {self.log.name}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{what} failed in the bench reader: {answer['error']}\n{answer.get('trace', '')}")
        return answer

    def send(self, op: str, **args: object) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return self._answer(op)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.log.close()


@dataclass
class Contender:
    group: Group
    run: Callable[[], dict]


def measure(groups: Sequence[Group], contenders: dict[str, Contender], runs: int) -> tuple[dict, dict]:
    """The contenders in turn (A B A B ...), each with every other group frozen and warmed up right before.

    The warm-up run before every timed one matters: a process that sat
    frozen while others ran has had its allocator hand freed memory back,
    and whichever contender ran first after a switch would otherwise pay
    page faults the others do not (measured: up to 3x the CPU of the same
    read). Returns (seconds, CPU seconds) per contender and run.
    """
    times: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(runs):
        for name, contender in contenders.items():
            only(groups, [contender.group])
            contender.run()
            gc.collect()
            before = contender.group.cpu()
            answer = contender.run()
            times[name].append(answer["seconds"])
            cpu[name].append(contender.group.cpu() - before)
    thaw(groups)
    return times, cpu


class NetworkBench:
    """The namespace (or loopback) cluster with flightpart, raw Flight and Dask on it, and the data in place."""

    def __init__(self, root: Path, rate: str, size: int, kinds: Sequence[str], log: Callable[[str], None],
                 guardian: Guardian | None = None):
        self.loopback = rate == "loopback"
        self.rate = rate
        self.size = size
        self.kinds = list(kinds)
        self.root = root
        self.drivers: list[Driver] = []
        self.servers: list[subprocess.Popen] = []
        self.guardian = guardian
        self.net = NetCluster(root / "cluster", nodes=3, rate=None if self.loopback else rate, loopback=self.loopback,
                              dead_after=3600.0)
        try:
            self._start(log)
        except BaseException:
            self.close()
            raise

    def _driver(self, host: Host, kind: str, group: Group, **start: object) -> Driver:
        driver = Driver(host, kind, self.root, **start)
        self.drivers.append(driver)
        self._joined(group, driver.pid)
        return driver

    def _server(self, host: Host, argv: list[str], group: Group, **kwargs) -> subprocess.Popen:
        proc = host.popen(argv, **kwargs)
        self.servers.append(proc)
        self._joined(group, proc.pid)
        return proc

    def _joined(self, group: Group, pid: int) -> None:
        """``pid`` one of ``group``'s processes, and told to the bench's watcher as it starts."""
        group.pids.append(pid)
        if self.guardian is not None:
            self.guardian.watch([pid])

    def _start(self, log: Callable[[str], None]) -> None:
        net = self.net
        self.far = net.add_host()  # a client host of its own: every partition crosses its link
        self.near = net.node_hosts[0]  # node 1's host: one partition of three is local
        ips = [h.ip for h in net.node_hosts]
        self.fp = Group("flightpart", [d.proc.pid for d in net.daemons])
        self.raw = Group("raw pyarrow Flight")
        self.dask = Group("dask")
        self.groups = [self.fp, self.raw, self.dask]
        if self.guardian is not None:
            for group in self.groups:
                group.watcher = self.guardian.watch  # a frozen member is thawed and stopped should the bench die
            self.guardian.watch(self.fp.pids)
        self.fp_far = self._driver(self.far, "flightpart", self.fp, catalog=net.uri)
        self.fp_near = self._driver(self.near, "flightpart", self.fp, catalog=net.uri)
        log(f"[{self.rate}] putting {len(self.kinds)} x 2 datasets of {self.size / MIB:,.0f} MiB ...")
        for kind in self.kinds:
            self.fp_far.send("put", name=f"remote-{kind}", kind=kind, nbytes=self.size, tiling=[1, 1], nodes=ips[1:],
                             replicas=2)
            self.fp_far.send("put", name=f"whole-{kind}", kind=kind, nbytes=self.size, tiling=[3, 1], nodes=ips,
                             replicas=1)
        self.raw_far: dict[str, Driver] = {}
        for kind in self.kinds:
            path = self.fp_far.send("partition_file", name=f"remote-{kind}", ip=ips[1])["path"]
            server = self._server(net.node_hosts[1], [sys.executable, "-m", "flightpart.bench.baseline", ips[1], path],
                                  self.raw, stdout=subprocess.PIPE, text=True)
            line = server.stdout.readline()
            if not line.startswith("READY"):
                raise RuntimeError("the baseline Flight server did not start")
            self.raw_far[kind] = self._driver(self.far, "raw", self.raw, uri=line.split()[2])
        log(f"[{self.rate}] starting Dask (scheduler on the catalog's host, a worker on each node's host) ...")
        scheduler_file = str(self.root / "scheduler.json")
        quiet = {"stdout": subprocess.DEVNULL, "stderr": open(self.root / "dask.log", "w")}
        self._server(net.catalog_host,
                     [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", net.catalog_host.ip,
                      "--port", "0", "--scheduler-file", scheduler_file, "--no-dashboard"], self.dask, **quiet)
        deadline = time.monotonic() + 60
        while not os.path.exists(scheduler_file):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Dask scheduler did not start; see {self.root / 'dask.log'}")
            time.sleep(0.2)
        for host in net.node_hosts:
            self._server(host, [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", scheduler_file,
                                "--host", host.ip, "--nthreads", "1", "--no-nanny", "--memory-limit", "0",
                                "--no-dashboard"],
                         self.dask, **quiet)
        self.dask_far = self._driver(self.far, "dask", self.dask, scheduler_file=scheduler_file)
        self.dask_near = self._driver(self.near, "dask", self.dask, scheduler_file=scheduler_file)
        deadline = time.monotonic() + 60
        while len(self.dask_far.send("workers")["hosts"]) < 3:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Dask workers did not join; see {self.root / 'dask.log'}")
            time.sleep(0.5)
        log(f"[{self.rate}] scattering the same tables to the Dask workers ...")
        for kind in self.kinds:
            self.dask_far.send("scatter", name=f"remote-{kind}", kind=kind, nbytes=self.size, parts=1, ips=[ips[1]])
            self.dask_near.send("scatter", name=f"whole-{kind}", kind=kind, nbytes=self.size, parts=3, ips=ips)

    def close(self) -> None:
        thaw(getattr(self, "groups", []))
        for driver in self.drivers:
            driver.stop()
        for proc in self.servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        self.net.stop()

    # ------------------------------------------------------------------ cases

    def link_bytes_per_second(self) -> float | None:
        return None if self.loopback else rate_bits(self.rate) / 8

    def _case(self, name: str, goal: str, nbytes: int, contenders: dict[str, Contender], runs: int) -> Case:
        times, cpu = measure(self.groups, contenders, runs)
        return Case(name, goal, nbytes, times, cpu=cpu, extra={"link": self.rate})

    def case_remote(self, kind: str, runs: int) -> Case:
        name = f"remote-{kind}"
        raw = self.raw_far[kind]
        only(self.groups, [self.raw])
        tried = {b: min(raw.send("read", batch=b)["seconds"] for _ in range(2)) for b in BASELINE_BATCHES}
        best = min(tried, key=tried.get)
        thaw(self.groups)
        contenders = {
            "flightpart get (streamed)": Contender(self.fp, lambda: self.fp_far.send("read", name=name)),
            "flightpart, compression off": Contender(self.fp,
                                                     lambda: self.fp_far.send("read", name=name, compression="off")),
            "flightpart, 4 streams per partition": Contender(self.fp,
                                                             lambda: self.fp_far.send("read", name=name, streams=4)),
        }
        contenders[f"raw pyarrow Flight ({best // 1024} KiB batches)"] = Contender(
            self.raw, lambda: raw.send("read", batch=best))
        contenders["dask client.gather (1 worker)"] = Contender(self.dask,
                                                                lambda: self.dask_far.send("read", name=name))
        before = self.fp_far.send("compressed")["streams_compressed"]
        link = self.link_bytes_per_second()
        if link is None:
            goal = "CPU s/GB <= raw Flight's and <= 0.5x Dask's"
        elif kind == "floats":
            goal = ">= 0.9 of the link rate, uncompressed (compression off)"
        else:
            goal = "above the link rate (compressed)"
        case = self._case(f"remote partition read ({kind})", goal, self.size, contenders, runs)
        case.extra["streams_compressed"] = self.fp_far.send("compressed")["streams_compressed"] - before
        case.extra["baseline_batch_bytes"] = best
        case.extra["reader_allocator"] = self.fp_far.send("allocator")["allocator"]  # with default settings
        ours, raw_name, dask_name = "flightpart get (streamed)", next(n for n in contenders if n.startswith("raw")), \
            "dask client.gather (1 worker)"
        case.ratio = (ours, raw_name)
        judged = "flightpart, compression off" if kind == "floats" else ours
        rate = self.size / case.median(judged)
        if link is not None:
            case.extra["share_of_link_rate"] = rate / link
            case.extra["share_of_link_rate_of"] = judged
            case.met = rate >= 0.9 * link if kind == "floats" else rate > link
        elif kind == "floats":
            cpu = {who: case.cpu_per_gb(who) for who in case.cpu}
            case.met = cpu[ours] <= cpu[raw_name] and cpu[ours] <= 0.5 * cpu[dask_name]
        return case

    def case_whole(self, kind: str, runs: int) -> Case:
        name = f"whole-{kind}"
        contenders = {
            "flightpart to_arrow()": Contender(self.fp, lambda: self.fp_near.send("read", name=name)),
            "dask client.gather (3 workers)": Contender(self.dask, lambda: self.dask_near.send("read", name=name)),
        }
        case = self._case(f"whole dataset read ({kind}), 3 nodes, 1 local", ">= 2x Dask", self.size, contenders, runs)
        case.ratio = tuple(contenders)  # type: ignore[assignment]
        case.met = case.speed_ratio() >= 2.0
        return case


def run_network_bench(rate: str, size: int = 256 * MIB, *, runs: int = 5, kinds: Sequence[str] = ("floats", "sales"),
                      log: Callable[[str], None] = print) -> dict:
    """Every network case at one link ``rate`` (or ``"loopback"``); the result as :func:`flightpart.bench.run.render`
    shows it."""
    if rate != "loopback":
        rate_bits(rate)  # a clear error for a rate tc would not take
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(f"bench --network {rate} needs network namespaces: {reason} (try --network loopback)")
    started = time.perf_counter()
    cases: list[Case] = []
    guardian = Guardian()  # killed in the middle, the bench leaves no process, namespace or folder behind
    with tempfile.TemporaryDirectory(prefix="flightpart-netbench-") as tmp:
        guardian.remove(tmp)
        if rate != "loopback":
            guardian.namespaces()
        try:
            bench = NetworkBench(Path(tmp), rate, size, kinds, log, guardian)
        except BaseException:
            guardian.close()  # the bench stopped what it had started
            raise
        try:
            for kind in kinds:
                log(f"[{rate}] running: remote partition read ({kind}) ...")
                cases.append(bench.case_remote(kind, runs))
                log(f"[{rate}] running: whole dataset read ({kind}) ...")
                cases.append(bench.case_whole(kind, runs))
        finally:
            bench.close()
            guardian.close()
    return {
        "network": rate, "size_bytes": size, "runs": runs, "quick": False, "seconds": time.perf_counter() - started,
        "machine": {"cpus": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total,
                    "python": sys.version.split()[0], "pyarrow": pa.__version__},
        "cases": [c.as_json() for c in cases],
    }


def _label(who: str) -> str:
    return "raw pyarrow Flight" if who.startswith("raw pyarrow Flight") else who


def plot_network(runs: Sequence[dict], path: str) -> None:
    """Throughput (top) and CPU seconds per GB (bottom) of every contender, per case, grouped by link."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [c["case"] for c in runs[0]["cases"]]
    fig, axes = plt.subplots(2, len(names), figsize=(4.6 * len(names), 7.5), squeeze=False)
    colours = plt.get_cmap("tab10")
    for col, name in enumerate(names):
        who = list(dict.fromkeys(_label(w) for run in runs for c in run["cases"] if c["case"] == name
                                 for w in c["median_seconds"]))
        width = 0.8 / len(who)
        for row, metric in enumerate(("throughput_gbps", "cpu_seconds_per_gb")):
            ax = axes[row][col]
            for k, contender in enumerate(who):
                values = []
                for run in runs:
                    case = next(c for c in run["cases"] if c["case"] == name)
                    by_label = {_label(w): v for w, v in case[metric].items()}
                    values.append(by_label.get(contender, 0.0))
                ax.bar([x + k * width for x in range(len(runs))], values, width, color=colours(k), label=contender)
            ax.set_xticks([x + 0.4 - width / 2 for x in range(len(runs))], [r["network"] for r in runs])
            ax.set_ylabel("GB/s (higher is better)" if row == 0 else "CPU s per GB (lower is better)", fontsize=8)
            if row == 0:
                ax.set_title(name, fontsize=9)
                ax.legend(fontsize=6)
    fig.suptitle(f"flightpart bench --network, {runs[0]['size_bytes'] / MIB:,.0f} MiB per dataset "
                 "(each contender with only its own processes running)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
