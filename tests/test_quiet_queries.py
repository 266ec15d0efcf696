"""Queries over partitions streamed from other hosts print nothing on stderr (no Acero alignment warnings)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

READER = textwrap.dedent("""
    import sys
    import numpy as np, pyarrow as pa
    import flightpart as fp
    rng = np.random.default_rng(0)
    rows = 200_000
    table = pa.table({"k": pa.array(rng.integers(0, 5, rows)).cast(pa.int32()), "s": [f"z{i % 7}" for i in range(rows)],
                      "v": rng.random(rows), "b": pa.array(rng.integers(0, 2, rows)).cast(pa.int8())})
    with fp.connect(sys.argv[1]) as client:
        ds = client.put("quiet", table, tiling=(4, 1))
        got = ds.aggregate([("v", "sum"), ("v", "mean"), ("b", "count")], by=["s"]).sort_by("s")
        want = table.group_by("s").aggregate([("v", "sum"), ("v", "mean"), ("b", "count")]).sort_by("s")
        assert got.column("b_count").equals(want.column("b_count")), (got, want)
        assert ds.filter("v > 0.5").count_rows() == int(np.sum(table.column("v").to_numpy() > 0.5))
    print("ok")
""")


def test_an_aggregate_over_streamed_partitions_says_nothing_on_stderr(cluster):
    """The reader runs on 127.0.0.1, every node on another address: every partition arrives over Flight."""
    done = subprocess.run([sys.executable, "-c", READER, cluster.uri], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
    assert "poorly aligned" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip() == "", done.stderr[-2000:]
