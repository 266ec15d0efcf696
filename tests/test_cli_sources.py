"""`flightpart put` reads files, directories, globs and stdin as they stream, in bounded memory, cut by
--partition-size."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

HWM = ("import atexit, runpy, sys\n"
       "atexit.register(lambda: sys.stderr.write(next(l for l in open('/proc/self/status') if "
       "l.startswith('VmHWM'))))\nsys.argv = ['flightpart', *sys.argv[1:]]\n"
       "runpy.run_module('flightpart', run_name='__main__')\n")


def cli(*args, stdin: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "flightpart", *args], input=stdin, capture_output=True, timeout=300)
    if check:
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert b"Traceback" not in done.stderr, done.stderr.decode()[-2000:]
    return done


def peak_kib(*args) -> int:
    """VmHWM of a fresh `flightpart ARGS` process, in KiB."""
    done = subprocess.run([sys.executable, "-c", HWM, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stderr.strip().splitlines()[-1].split()[1])


def read_back(uri: str, name: str) -> pa.Table:
    out = cli("get", name, "-o", "-", "--catalog", uri).stdout
    return pa.ipc.open_stream(out).read_all()


def test_a_parquet_file_is_cut_into_partitions_of_the_size_asked(cluster, tmp_path):
    rows = 1_000_000
    table = pa.table({"k": np.arange(rows), "x": np.random.default_rng(2).random(rows), "y": np.ones(rows)})
    pq.write_table(table, tmp_path / "t.parquet")
    cli("put", "sized", str(tmp_path / "t.parquet"), "--partition-size", "4M", "--catalog", cluster.uri)
    grid = json.loads(cli("show", "sized", "--json", "--catalog", cluster.uri).stdout)
    assert 5 <= len(grid["partitions"]) <= 7, len(grid["partitions"])  # 24 MB of data in about 4 MiB partitions
    assert sum(p["shape"][0] for p in grid["partitions"]) == rows
    assert len({p["nodes"][0] for p in grid["partitions"]}) == 3  # round-robin over the three nodes
    assert read_back(cluster.uri, "sized").sort_by("k").equals(table)


def test_a_hive_directory_keeps_its_partition_columns(cluster, tmp_path):
    for year, values in ((2024, [1, 2]), (2025, [3])):
        (tmp_path / "trips" / f"year={year}").mkdir(parents=True)
        pq.write_table(pa.table({"v": values}), tmp_path / "trips" / f"year={year}" / "part-0.parquet")
    cli("put", "hive", str(tmp_path / "trips"), "--catalog", cluster.uri)
    got = read_back(cluster.uri, "hive").sort_by("v")
    assert got.column("v").to_pylist() == [1, 2, 3] and got.column("year").to_pylist() == [2024, 2024, 2025]


def test_a_glob_of_gzipped_csv_keeps_nulls_and_empty_strings_apart(cluster, tmp_path):
    (tmp_path / "a.csv.gz").write_bytes(gzip.compress(b'zone,fare\n"Hell\'s Kitchen",1.5\n,2.5\n"",3.5\n'))
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(b"zone,fare\nMidtown,4.5\n"))
    cli("put", "csvs", str(tmp_path / "*.csv.gz"), "--catalog", cluster.uri)
    got = read_back(cluster.uri, "csvs").sort_by("fare")
    assert got.column("zone").to_pylist() == ["Hell's Kitchen", None, "", "Midtown"]
    # and out again as CSV, then in: the nulls are still nulls
    cli("get", "csvs", "-o", str(tmp_path / "out.csv"), "--catalog", cluster.uri)
    cli("put", "csvs-again", str(tmp_path / "out.csv"), "--catalog", cluster.uri)
    assert (read_back(cluster.uri, "csvs-again").sort_by("fare").column("zone").to_pylist()
            == got.column("zone").to_pylist())


def test_stdin_takes_an_arrow_stream_from_get_and_json_lines(cluster, tmp_path):
    table = pa.table({"a": list(range(1000)), "b": [str(k) for k in range(1000)]})
    pq.write_table(table, tmp_path / "src.parquet")
    cli("put", "piped-src", str(tmp_path / "src.parquet"), "--catalog", cluster.uri)
    stream = cli("get", "piped-src", "-o", "-", "--catalog", cluster.uri).stdout
    cli("put", "piped", "-", "--catalog", cluster.uri, stdin=stream)
    assert read_back(cluster.uri, "piped").sort_by("a").equals(table)
    lines = b"".join(json.dumps({"a": k, "b": None if k % 2 else "x"}).encode() + b"\n" for k in range(10))
    cli("put", "jsonl", "-", "--format", "json", "--catalog", cluster.uri, stdin=lines)
    got = read_back(cluster.uri, "jsonl").sort_by("a")
    assert got.column("b").to_pylist() == ["x", None] * 5


def test_append_streams_a_source_larger_than_a_partition_and_a_small_one_whole(cluster, tmp_path):
    base = pa.table({"k": np.arange(1000), "x": np.zeros(1000)})
    more = pa.table({"k": np.arange(1000, 301_000), "x": np.ones(300_000)})  # 4.8 MB: five 1 MiB partitions
    pq.write_table(base, tmp_path / "base.parquet")
    pq.write_table(more, tmp_path / "more.parquet")
    pq.write_table(base.slice(0, 2), tmp_path / "two.parquet")
    cli("put", "grown", str(tmp_path / "base.parquet"), "--catalog", cluster.uri)
    cli("append", "grown", str(tmp_path / "more.parquet"), "--partition-size", "1M", "--catalog", cluster.uri)
    shown = json.loads(cli("show", "grown", "--json", "--catalog", cluster.uri).stdout)
    assert len(shown["partitions"]) >= 5 and sum(p["shape"][0] for p in shown["partitions"]) == 301_000
    assert read_back(cluster.uri, "grown").sort_by("k").equals(pa.concat_tables([base, more]))
    before = json.loads(cli("ls", "--json", "--catalog", cluster.uri).stdout)
    version = next(d["version"] for d in before if d["name"] == "grown")
    out = cli("append", "grown", str(tmp_path / "two.parquet"), "--catalog", cluster.uri).stdout.decode()
    assert f"grown v{version + 1}: 301,002 rows" in out  # a small source goes whole: the very next version


def test_an_unreadable_source_is_refused_and_nothing_is_published(cluster, tmp_path):
    (tmp_path / "notes.txt").write_text("a,b\n")
    unknown = cli("put", "bad", str(tmp_path / "notes.txt"), "--catalog", cluster.uri, check=False)
    assert unknown.returncode == 2 and b"--format" in unknown.stderr and b".parquet" in unknown.stderr
    (tmp_path / "torn.csv").write_text("a,b\n1,2\n3\n")
    torn = cli("put", "bad", str(tmp_path / "torn.csv"), "--catalog", cluster.uri, check=False)
    assert torn.returncode != 0 and b"torn.csv" in torn.stderr
    missing = cli("put", "bad", str(tmp_path / "nothing-*.parquet"), "--catalog", cluster.uri, check=False)
    assert missing.returncode == 2 and b"no file matches" in missing.stderr
    stdin_parquet = cli("put", "bad", "-", "--format", "parquet", "--catalog", cluster.uri, stdin=b"PAR1", check=False)
    assert stdin_parquet.returncode == 2 and b"seek" in stdin_parquet.stderr
    listed = json.loads(cli("ls", "--json", "--catalog", cluster.uri).stdout)
    assert "bad" not in {d["name"] for d in listed}


@pytest.mark.slow
def test_putting_a_parquet_file_keeps_the_cli_memory_bounded_whatever_its_size(cluster, tmp_path):
    grown = {}
    base = peak_kib("ls", "--catalog", cluster.uri)
    for rows in (3_000_000, 12_000_000):  # 96 MB and 384 MB as Arrow
        rng = np.random.default_rng(rows)
        table = pa.table({f"f{k}": rng.random(rows) for k in range(4)})
        path = tmp_path / f"big-{rows}.parquet"
        pq.write_table(table, path, row_group_size=256 * 1024)
        nbytes = table.nbytes
        del table
        name = f"big-{rows}"
        peak = peak_kib("put", name, str(path), "--partition-size", "16M", "--catalog", cluster.uri)
        grown[rows] = (peak - base) * 1024
        shown = json.loads(cli("show", name, "--json", "--catalog", cluster.uri).stdout)
        assert (sum(p["shape"][0] for p in shown["partitions"]) == rows
                and len(shown["partitions"]) >= nbytes // (20 << 20))
    # a whole-file read grew the process by more than the data; a stream holds a few partitions whatever the file's size
    small, big = grown[3_000_000], grown[12_000_000]
    assert big < small * 1.5 + (32 << 20), (f"the put grew the process by {small >> 20} MiB for 96 MB, "
                                            f"{big >> 20} MiB for 384 MB")
    assert big < 384_000_000 // 2


def on_a_terminal(*args: str) -> str:
    """`flightpart ARGS` with stderr on a pseudo-terminal (as a user at a shell sees it): what it drew there."""
    import os
    import pty

    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "160", "TERM": "xterm"}
    with subprocess.Popen([sys.executable, "-m", "flightpart", *args], stdout=subprocess.DEVNULL, stderr=follower,
                          env=env) as proc:
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            drawn += chunk
        assert proc.wait(timeout=300) == 0, drawn.decode(errors="replace")[-2000:]
    os.close(leader)
    return drawn.decode(errors="replace")


def test_put_and_get_on_a_terminal_show_bytes_speed_and_time_left(cluster, tmp_path):
    rows = 4_000_000
    pq.write_table(pa.table({"k": np.arange(rows), "x": np.random.default_rng(3).random(rows)}), tmp_path / "t.parquet")
    put = on_a_terminal("put", "shown", str(tmp_path / "t.parquet"), "--partition-size", "8M", "--catalog", cluster.uri)
    assert "put shown" in put and "MB" in put and "/s" in put, put[-600:]
    got = on_a_terminal("get", "shown", "-o", str(tmp_path / "back.parquet"), "--catalog", cluster.uri, "--client-host",
                        "127.0.0.9")
    assert "get shown" in got and "MB" in got and "/s" in got, got[-600:]
    assert re.search(r"\d:\d\d:\d\d", got)  # the time left: the total is known for a read without --where
    assert pq.read_table(tmp_path / "back.parquet").num_rows == rows
