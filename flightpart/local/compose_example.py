"""The compose cluster's client: put a dataset if missing, read it from node 1's host.

It shares node 1's network and data volume, so node 1's partitions are memory-mapped and the others
streamed. Prints one line per partition; exits non-zero if what it read differs from what was put.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow as pa

from flightpart.client import connect
from flightpart.io.hosts import host_addresses


def example_table(rows: int = 300_000) -> pa.Table:
    rng = np.random.default_rng(42)
    return pa.table({"id": np.arange(rows), "value": rng.random(rows), "group": rng.integers(0, 10, rows)})


def main() -> int:
    catalog = os.environ["FLIGHTPART_CATALOG"]
    host = os.environ.get("FLIGHTPART_HOST")
    table = example_table(int(os.environ.get("EXAMPLE_ROWS", "300000")))
    with connect(catalog, host=host) as client:
        fp_nodes = [n for n in client.nodes() if n.alive]
        print(f"{len(fp_nodes)} live nodes: {', '.join(sorted(n.uri for n in fp_nodes))}")
        if "example" not in [d.name for d in client.list()]:
            client.put("example", table, tiling=(len(fp_nodes), 1))
        ds = client.open("example")
        d = ds.__partitioned__
        for pos, part in sorted(d["partitions"].items()):
            ip = part["location"][0][0]
            mode = "zero-copy" if ip in host_addresses(host) else "streamed"
            got = d["get"](part["data"])
            print(f"partition {pos}: {got.num_rows} rows from {ip}: {mode}")
        ok = ds.to_arrow().equals(table)
    print("read equals what was put:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
