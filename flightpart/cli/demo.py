"""``flightpart demo``: the main job on one machine.

A catalog and three nodes on 127.0.0.2-4 (each address plays a host); a
client on node 1's host puts a dataset, opens it, reads every partition and
shows which were read zero-copy and which were streamed, with the bytes the
nodes sent. Everything it starts is stopped at the end.
"""

from __future__ import annotations

import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute


def demo_table(size_mb: int, seed: int = 0) -> pa.Table:
    """About ``size_mb`` MB of float64 columns plus an id and a category."""
    rng = np.random.default_rng(seed)
    rows = max(1, size_mb * 1_000_000 // (8 * 8))
    columns = {"id": np.arange(rows, dtype=np.int64)}
    for k in range(6):
        columns[f"x{k}"] = rng.random(rows)
    columns["category"] = pa.DictionaryArray.from_arrays(
        rng.integers(0, 4, rows, dtype=np.int32), ["a", "b", "c", "d"]).cast(pa.dictionary(pa.int32(), pa.string()))
    return pa.table(columns)


def run_demo(size_mb: int = 300) -> int:
    from rich.console import Console
    from rich.table import Table

    from flightpart.client import connect
    from flightpart.local.cluster import LocalCluster

    from .grid_view import render_grid

    console = Console()
    with tempfile.TemporaryDirectory(prefix="flightpart-demo-") as root:
        console.print("[bold]starting[/] a catalog and 3 nodes on 127.0.0.2, 127.0.0.3, 127.0.0.4 ...")
        with LocalCluster(root, nodes=3) as cluster:
            table = demo_table(size_mb)
            with connect(cluster.uri, host="127.0.0.2") as client:
                t0 = time.perf_counter()
                ds = client.put("demo", table, tiling=(6, 1))
                put_s = time.perf_counter() - t0
                console.print(f"put {table.nbytes / 1e6:,.0f} MB as {ds!r} in {put_s:.2f} s")
                render_grid(ds, client.nodes(), console)

                ds = client.open("demo")
                d = ds.__partitioned__
                uris = [n.uri for n in cluster.nodes]
                report = Table("partition", "node", "rows", "MB", "read", "bytes sent by nodes", "ms",
                               title="read from 127.0.0.2 (node 1's host)")
                total_rows, checksum = 0, 0.0
                for pos, part in sorted(d["partitions"].items()):
                    before = {u: client.stats(u).values["bytes_sent"] for u in uris}
                    t0 = time.perf_counter()
                    got = d["get"](part["data"])
                    ms = (time.perf_counter() - t0) * 1e3
                    sent = sum(client.stats(u).values["bytes_sent"] - before[u] for u in uris)
                    ip = part["location"][0][0]
                    mode = "[green]zero-copy (mmap)[/]" if ip == "127.0.0.2" else "[yellow]streamed[/]"
                    report.add_row(str(pos), ip, f"{got.num_rows:,}", f"{got.nbytes / 1e6:,.1f}", mode, f"{sent:,}",
                                   f"{ms:,.1f}")
                    total_rows += got.num_rows
                    checksum += float(pa.compute.sum(got.column("x0")).as_py())
                console.print(report)
                t0 = time.perf_counter()
                whole = ds.to_arrow()
                read_s = time.perf_counter() - t0
                ok = whole.num_rows == table.num_rows and whole.equals(table)
                console.print(f"to_arrow(): {whole.nbytes / 1e6:,.0f} MB in {read_s:.2f} s; "
                              f"equal to what was put: [{'green' if ok else 'red'}]{ok}[/]")
        console.print("[bold]stopped[/] every process the demo started")
    return 0 if ok else 1
