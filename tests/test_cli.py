"""The flightpart command against a real cluster."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq


def cli(*args, env=None, check=True):
    return subprocess.run([sys.executable, "-m", "flightpart", *args], capture_output=True, text=True, timeout=120,
                          check=check, env=env)


def test_put_ls_show_get_rm_nodes(cluster, tmp_path):
    src = tmp_path / "in.parquet"
    table = pa.table({"a": list(range(300)), "b": [float(k) for k in range(300)]})
    pq.write_table(table, src)
    uri = cluster.uri
    out = cli("put", "clidata", str(src), "--tiling", "3x1", "--catalog", uri)
    assert "clidata v1: 300 rows x 2 columns" in out.stdout
    listed = json.loads(cli("ls", "--json", "--catalog", uri).stdout)
    assert ({"name": "clidata", "version": 1, "shape": [300, 2], "partition_tiling": [3, 1]}.items()
            <= next(d for d in listed if d["name"] == "clidata").items())
    grid = json.loads(cli("show", "clidata", "--json", "--catalog", uri).stdout)
    assert [p["shape"] for p in grid["partitions"]] == [[100, 2]] * 3
    shown = cli("show", "clidata", "--catalog", uri).stdout
    assert "127.0.0.2" in shown and "100 rows" in shown
    dst = tmp_path / "out.arrow"
    cli("get", "clidata", "-o", str(dst), "--catalog", uri)
    with pa.memory_map(str(dst)) as f:
        assert pa.ipc.open_file(f).read_all().equals(table)
    nodes = json.loads(cli("nodes", "--json", "--catalog", uri).stdout)
    assert sorted(n["ip"] for n in nodes if n["alive"])[:3] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    stats = json.loads(cli("stats", cluster.nodes[0].uri, "--json").stdout)
    assert {"bytes_sent", "batches_sent", "partitions_served"} <= stats.keys()
    assert "dropped clidata" in cli("rm", "clidata", "--catalog", uri).stdout
    gone = cli("show", "clidata", "--catalog", uri, check=False)
    assert gone.returncode == 1 and "Error [DATASET_NOT_FOUND]: no dataset named 'clidata'" in gone.stderr
    assert "Traceback" not in gone.stderr


def test_version_and_help():
    import flightpart

    assert cli("--version").stdout.strip() == f"flightpart, version {flightpart.__version__}"
    assert "serve" in cli("--help").stdout


def test_a_chatty_daemon_keeps_running_past_a_pipe_full_of_logs(tmp_path):
    """Logs go to a file, not an unread pipe: 64 KiB of them must not block the daemon."""
    from flightpart.local.cluster import Daemon

    # a catalog nobody answers: the heartbeat thread logs a failure every millisecond
    node = Daemon(["--log-level", "DEBUG", "serve", "--host", "127.0.0.91", "--port", "0", "--data-dir", str(tmp_path),
                   "--catalog", "grpc://127.0.0.91:1", "--heartbeat", "0.001"])
    try:
        import time

        deadline = time.monotonic() + 60
        while len(node.log()) < 3 * 65536 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(node.log()) >= 3 * 65536, "the daemon stopped logging"
        import flightpart as fp

        assert fp.connect("grpc://127.0.0.1:1").pool.action(node.uri, fp.wire.GetNodeInfo()).ip == "127.0.0.91"
    finally:
        node.stop()


def test_repartition_append_rebalance(cluster, tmp_path):
    import flightpart as fp

    uri = cluster.uri
    table = pa.table({"a": list(range(300)), "b": [float(k) for k in range(300)]})
    more = tmp_path / "more.parquet"
    pq.write_table(pa.table({"a": [300, 301], "b": [300.0, 301.0]}), more)
    with fp.connect(uri) as client:
        client.put("clishape", table, tiling=(3, 1))
    assert "clishape v2: 300 rows x 2 columns in a 4x2 grid" in cli("repartition", "clishape", "--tiling", "4x2",
                                                                    "--catalog", uri).stdout
    assert "clishape v3: 302 rows x 2 columns in a 6x2 grid" in cli("append", "clishape", str(more), "--catalog",
                                                                    uri).stdout
    cli("rebalance", "clishape", "--catalog", uri)
    assert "is balanced already; nothing moved" in cli("rebalance", "clishape", "--catalog", uri).stdout
    bad = cli("repartition", "clishape", "--tiling", "4x9", "--catalog", uri, check=False)
    assert bad.returncode != 0 and "Error [USAGE]: tiling (4, 9)" in bad.stderr and "Traceback" not in bad.stderr
    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"a": ["x"], "b": [1.0]}), wrong)
    bad = cli("append", "clishape", str(wrong), "--catalog", uri, check=False)
    assert bad.returncode != 0 and "Error [SCHEMA_MISMATCH]" in bad.stderr and "Traceback" not in bad.stderr
    with fp.connect(uri) as client:
        assert client.open("clishape").to_arrow().equals(pa.concat_tables([table, pq.read_table(more)]))
