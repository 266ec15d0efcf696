"""`flightpart bench --quick` runs and writes every case's medians and ratios.

A smoke test only: no thresholds, a noisy machine must not fail the build.
The goals are judged in docs/benchmarks.md from full runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from flightpart.bench.scale import GOALS


@pytest.mark.slow
@pytest.mark.timeout(900)  # the bench is given 600 s below; a loaded machine must not time the test out first
def test_quick_bench_writes_every_figure(tmp_path):
    out, png = tmp_path / "out.json", tmp_path / "bench.png"
    done = subprocess.run([sys.executable, "-m", "flightpart", "bench", "--quick", "--runs", "3", "--json", str(out),
                           "--plot", str(png)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    cases = {c["case"]: c for c in result["cases"]}
    assert list(cases) == ["remote partition read", "remote partition read, 1 MiB", "remote partition read, 16 MiB",
                           "local partition read", "whole dataset read (3 nodes, 1 local)", "put",
                           "selective filter (1 %, 3 remote nodes)", "repartition (3, 1) -> (6, 2), 3 nodes",
                           "streaming read (peak memory of the reader)",
                           "analytical queries (5 questions, 3 remote nodes)",
                           "SQL over Flight (20 queries through ADBC, 3 nodes)", "open"]
    for case in cases.values():
        assert case["median_seconds"] and all(v > 0 for v in case["median_seconds"].values())
        many = case["case"].startswith("remote partition read, ")  # a small read is timed many more times
        assert all(len(runs) == 3 or (many and len(runs) > 3) for runs in case["runs_seconds"].values())
        assert isinstance(case["met"], bool)
    for name in ("remote partition read", "remote partition read, 1 MiB", "remote partition read, 16 MiB",
                 "local partition read", "whole dataset read (3 nodes, 1 local)", "put"):
        assert cases[name]["speed_ratio"] > 0
    remote = cases["remote partition read"]  # the reader's CPU beside the raw client's, per GB, judged by the goal
    assert remote["cpu_ratio"] > 0 and len(remote["cpu_seconds_per_gb"]) == 2
    assert all(v > 0 for v in remote["cpu_seconds_per_gb"].values())
    assert cases["local partition read"]["arrow_pool_bytes_allocated"] == 0
    moved = cases["selective filter (1 %, 3 remote nodes)"]["moved"]
    assert (moved["flightpart ds.filter(f0 < 0.01) on the nodes"]["bytes_sent"]
            < moved["read everything, filter at the client"]["bytes_sent"] / 20)
    repartition = cases["repartition (3, 1) -> (6, 2), 3 nodes"]
    through = repartition["bytes_through_client"]
    assert through["flightpart repartition on the nodes"] == 0  # every row read and sent back by the client:
    assert through["read into one client, put back"] > 1.9 * repartition["bytes"]
    assert all(v > 0 for v in cases["streaming read (peak memory of the reader)"]["peak_growth_bytes"].values())
    queries = cases["analytical queries (5 questions, 3 remote nodes)"]
    assert queries["wrong_answers"] == [] and queries["met"]  # every engine answers as DuckDB over the Parquet file
    assert queries["moved"]["flightpart ds.aggregate / filter"]["bytes_sent"] < queries["bytes"] / 10
    sql = cases["SQL over Flight (20 queries through ADBC, 3 nodes)"]
    assert sql["wrong_answers"] == [] and sql["met"] and len(sql["queries"]) == 20
    assert sql["queries"]["count distinct per group"]["rows_sent"] < sql["rows"] / 10  # one row per pair and partition
    assert sql["queries"]["group by with every aggregate"]["rows_sent"] < sql["rows"] / 10  # the same, with 5 more
    assert cases["open"]["partitions"] == 10_000 and cases["open"]["pickled_bytes_per_partition"] > 0
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "flightpart bench" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_scale_bench_writes_every_size_and_goal(tmp_path):
    out, png = tmp_path / "scale.json", tmp_path / "scale.png"
    done = subprocess.run([sys.executable, "-m", "flightpart", "bench", "--scale", "--quick", "--json", str(out),
                           "--plot", str(png)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["partitions"] for r in result["partitions"]] == [200, 2_000]
    for row in result["partitions"]:  # the bench itself checks the data read back equals what was put
        assert all(row[k] > 0 for k in ("put_seconds", "commit_seconds", "open_seconds", "read_seconds"))
        assert 0 < row["node_maps"] <= 256  # bounded by the node's map cache, not by the partitions
    for row in result["nodes"]:
        assert row["alive_after"] == row["simulated_nodes"] + 1  # every simulated node's heartbeats arrived
        assert row["heartbeats_per_second"] > 0.8 * row["simulated_nodes"] / 2
        assert 0 < row["catalog_cpu_share"] < 2
    assert result["frozen"]["frozen_nodes"] == 3 and result["frozen"]["abort_seconds"] > 0
    assert [r["columns"] for r in result["columns"]] == [500, 2_000]
    assert all(r["put_seconds"] > 0 and r["read_seconds"] > 0 for r in result["columns"])
    goals = {g["goal"]: g for g in result["goals"]}
    # one per partitions goal, then catalog CPU under heartbeats, frozen nodes, wide tables and 100,000 partitions
    assert len(goals) == len(GOALS) + 4 and all(g["met"] in (True, False, None) for g in goals.values())
    assert all(row["first_open_seconds"] > 0 and row["first_open_catalog_cpu_seconds"] >= 0
               for row in result["partitions"])
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "goals" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_network_bench_runs_on_loopback_and_a_shaped_link_and_leaves_no_namespace(tmp_path):
    from flightpart.local import netcluster

    reason = netcluster.unavailable()
    rates = "loopback" if reason else "loopback,1gbit"
    out, png = tmp_path / "net.json", tmp_path / "net.png"
    bench = subprocess.Popen([sys.executable, "-m", "flightpart", "bench", "--network", rates, "--size", "12M",
                              "--runs", "1", "--json", str(out), "--plot", str(png)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    _stdout, stderr = bench.communicate(timeout=600)
    assert bench.returncode == 0, stderr[-3000:]
    # every namespace the bench made (named after its PID) is gone, Dask and reader processes included
    assert not [ns for ns in netcluster.namespaces() if ns.startswith(f"{netcluster.PREFIX}{bench.pid}c")]
    runs = json.loads(out.read_text())["network_runs"]
    assert [r["network"] for r in runs] == rates.split(",") and png.stat().st_size > 0
    for run in runs:
        cases = {c["case"]: c for c in run["cases"]}
        assert list(cases) == ["remote partition read (floats)", "whole dataset read (floats), 3 nodes, 1 local",
                               "remote partition read (sales)", "whole dataset read (sales), 3 nodes, 1 local"]
        for case in cases.values():
            # every contender timed and its CPU counted (reader and servers, from /proc)
            assert set(case["cpu_seconds_per_gb"]) == set(case["median_seconds"])
            assert all(v > 0 for v in case["median_seconds"].values())
            assert all(v >= 0 for v in case["cpu_seconds_per_gb"].values())
        # /proc counts CPU in 10 ms ticks: one contender's read of 12 MiB may take none; the run's reads do
        assert any(v > 0 for case in cases.values() for v in case["cpu_seconds_per_gb"].values())
        if run["network"] == "1gbit":
            # the reader measured a slow link and the nodes compressed the sales table's streams
            assert cases["remote partition read (sales)"]["streams_compressed"] > 0
            assert cases["remote partition read (sales)"]["share_of_link_rate"] > 0
        else:
            assert cases["remote partition read (sales)"]["streams_compressed"] == 0  # never over loopback


def test_each_contender_runs_with_the_other_systems_frozen_and_all_run_again_after(tmp_path):
    """The plain bench's rule (as ``--network``'s): while one system is timed, every other one's processes (and
    what they started: a Ray worker under its raylet) are stopped; afterwards all run."""
    import psutil

    from flightpart.bench.measure import Group, alternate

    procs = [subprocess.Popen(["sh", "-c", "sleep 600 & wait"]) for _ in range(2)]
    try:
        groups = [Group("a", [procs[0].pid]), Group("b", [procs[1].pid])]
        for g in groups:  # the shell's own child is found as a member
            while len(g.members()) < 2:
                time.sleep(0.05)

        def states(g: Group) -> set[str]:
            return {psutil.Process(pid).status() for pid in g.members()}

        seen: dict[str, list[tuple[set[str], set[str]]]] = {"A": [], "B": []}
        contenders = {"A": lambda: seen["A"].append((states(groups[0]), states(groups[1]))),
                      "B": lambda: seen["B"].append((states(groups[0]), states(groups[1])))}
        alternate(contenders, 3, systems=(groups, {"A": [groups[0]], "B": [groups[1]]}))
        stopped = psutil.STATUS_STOPPED
        assert all(stopped not in mine and theirs == {stopped} for mine, theirs in seen["A"]), seen["A"]
        assert all(mine == {stopped} and stopped not in theirs for mine, theirs in seen["B"]), seen["B"]
        assert len(seen["A"]) == 1 + 2 * 3  # a warm-up, then one before each timed run
        assert all(stopped not in states(g) for g in groups)
    finally:
        for p in procs:
            for pid in Group("", [p.pid]).members()[::-1]:
                try:
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(10)


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def _wait_until_gone(pids: list[int], seconds: float = 60) -> list[int]:
    """The pids still running after ``seconds`` (the watcher's SIGTERM wait, then its SIGKILL, fit well inside)."""
    deadline = time.monotonic() + seconds
    while (left := [pid for pid in pids if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


_KILLED_BENCH = """
import json, os, sys, time
from flightpart.bench.run import Harness, bench_table
from flightpart.bench.measure import only
root = sys.argv[1]
h = Harness(root, bench_table(1 << 20), with_dask=False, with_ray=False)
h.client.put("left", h.table, tiling=(2, 1))
only(h.groups, [h.group("raw pyarrow Flight")])  # the cluster frozen, as while raw Flight is timed
print(json.dumps({"frozen": h.group("flightpart").members()}), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_bench_killed_in_the_middle_leaves_nothing_frozen_running_or_on_the_disk(tmp_path):
    import psutil

    root = tmp_path / "bench-root"
    root.mkdir()
    bench = subprocess.Popen([sys.executable, "-c", _KILLED_BENCH, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        frozen = json.loads(bench.stdout.readline())["frozen"]
        deadline = time.monotonic() + 60  # a SIGSTOP lands when the process is next scheduled: late on a loaded machine
        while not all(psutil.Process(pid).status() == psutil.STATUS_STOPPED
                      for pid in frozen) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(frozen) >= 4 and all(psutil.Process(pid).status() == psutil.STATUS_STOPPED for pid in frozen)
        assert any(root.rglob("*.arrow"))
        bench.kill()
        bench.wait(30)
        assert _wait_until_gone(frozen) == [], "the bench's daemons outlived it"
        deadline = time.monotonic() + 30
        while root.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not root.exists(), "the bench's folder of partitions was left on the disk"
    finally:
        bench.kill()


def test_the_watcher_stops_only_what_it_was_told_and_nothing_once_the_bench_said_done(tmp_path):
    from flightpart.bench.guardian import WATCHER_ARGV, Guardian, clean_up

    told, kept = (subprocess.Popen(["sleep", "600"]) for _ in range(2))
    folder = tmp_path / "work"
    folder.mkdir()
    try:
        # a pid given to another process since (its start time differs) is left alone
        clean_up({kept.pid: psutil_start(kept.pid) + 1.0}, [])
        assert _running(kept.pid)
        # the bench said done: the watcher leaves without touching anything
        guardian = Guardian()
        guardian.watch([told.pid])
        guardian.remove(str(folder))
        guardian.close()
        assert _running(told.pid) and folder.exists()
        # the bench died (its pipe ended without done): what it was told is stopped, even frozen, and removed
        os.kill(told.pid, signal.SIGSTOP)
        watcher = subprocess.Popen(WATCHER_ARGV, stdin=subprocess.PIPE, text=True, stderr=subprocess.PIPE)
        _out, err = watcher.communicate(f"pid {told.pid} {psutil_start(told.pid)!r}\nfolder {folder}\n", timeout=60)
        assert watcher.returncode == 0 and err == "", err
        told.wait(30)
        assert not folder.exists() and _running(kept.pid)
    finally:
        for p in (told, kept):
            p.kill()
            p.wait(10)


def test_a_watcher_killed_from_outside_costs_the_bench_its_safety_net_not_its_run(tmp_path, caplog):
    import psutil

    from flightpart.bench.guardian import Guardian

    guardian = Guardian()
    os.kill(guardian.pid, signal.SIGKILL)
    watcher = psutil.Process(guardian.pid)
    deadline = time.monotonic() + 60
    while watcher.status() != psutil.STATUS_ZOMBIE:  # its end of the pipe closed (not reaped: the bench's child)
        assert time.monotonic() < deadline, "the watcher did not die of SIGKILL"
        time.sleep(0.02)
    with caplog.at_level("WARNING", logger="flightpart.bench"):
        guardian.watch([os.getpid()])
        guardian.remove(str(tmp_path))
        guardian.namespaces()
        guardian.close()
    assert caplog.text.count("watcher") == 1 and "is gone" in caplog.text
    assert tmp_path.exists()


def test_the_watcher_removes_the_namespaces_of_a_dead_bench(tmp_path):
    from flightpart.bench.guardian import WATCHER_ARGV
    from flightpart.local import netcluster

    reason = netcluster.unavailable()
    if reason is not None:
        pytest.skip(reason)
    gone = subprocess.Popen(["true"])
    gone.wait(30)
    owned = f"{netcluster.PREFIX}{gone.pid}c0-h1"  # a namespace a bench made, whose process has since ended
    subprocess.run(["ip", "netns", "add", owned], check=True)
    try:
        assert owned in netcluster.namespaces()
        watcher = subprocess.Popen(WATCHER_ARGV, stdin=subprocess.PIPE, text=True, stderr=subprocess.PIPE)
        _out, err = watcher.communicate("namespaces\n", timeout=60)
        assert watcher.returncode == 0 and err == "", err
        assert owned not in netcluster.namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", owned], capture_output=True)


def psutil_start(pid: int) -> float:
    import psutil

    return psutil.Process(pid).create_time()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sql_bench_times_every_query_against_duckdb_and_roapi_and_compares(tmp_path):
    from flightpart.bench.sql_mix import SQL_MIX, roapi_binary

    out, again, md, png = tmp_path / "sql.json", tmp_path / "again.json", tmp_path / "sql.md", tmp_path / "sql.png"
    done = subprocess.run([sys.executable, "-m", "flightpart", "bench", "--sql", "--quick", "--runs", "2", "--json",
                           str(out), "--plot", str(png)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    contenders = ["flightpart (ADBC)", *(["roapi (ADBC)"] if roapi_binary() else []), "DuckDB on the Parquet files"]
    assert ([c["case"] for c in result["cases"]]
            == [f"SQL: {q}" for q in SQL_MIX] + ["SQL: geometric mean of 13 queries"])
    for case in result["cases"]:
        assert list(case["median_seconds"]) == contenders and all(v > 0 for v in case["median_seconds"].values())
        assert all(len(runs) == 2 for runs in case["runs_seconds"].values())
    goals = {g["goal"]: g for g in result["goals"]}
    assert goals["every answer equal to DuckDB's"]["met"], goals["every answer equal to DuckDB's"]
    assert all(isinstance(g["met"], bool) or (g["met"] is None and not roapi_binary()) for g in goals.values())
    assert png.read_bytes()[:4] == b"\x89PNG"
    # a saved run is shown and compared again, and a plain run is refused as the comparison
    shown = subprocess.run([sys.executable, "-m", "flightpart", "bench", "--sql", "--from-json", str(out), "--compare",
                            str(out), "--markdown", str(md), "--json", str(again)], capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "| goal | value | met |" in md.read_text() and json.loads(again.read_text())["history"]
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"cases": []}))
    refused = subprocess.run([sys.executable, "-m", "flightpart", "bench", "--sql", "--from-json", str(out),
                              "--compare", str(plain)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "not a bench --sql run" in refused.stderr
