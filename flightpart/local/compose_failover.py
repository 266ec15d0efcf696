"""The failover compose cluster's client (docker/compose-ha.yaml), in two steps docker/e2e.sh runs around a kill.

Step ``put``: put version 1 of ``ha`` and print the leading catalog. Step ``after`` (the leader killed
meanwhile): put version 2 through the same catalogs, print the new leader and the versions, read both back;
exits non-zero when anything differs.
"""

from __future__ import annotations

import os
import sys
import time

import pyarrow as pa

from flightpart.client import connect


def table(version: int) -> pa.Table:
    return pa.table({"version": pa.array([version] * 10_000, pa.int64()), "row": pa.array(range(10_000), pa.int64())})


def main(step: str) -> int:
    with connect(os.environ["FLIGHTPART_CATALOG"], timeout=30) as client:
        if step == "put":
            client.put("ha", table(1))
            print(f"leader {client.leadership().leader}")
            return 0
        started = time.monotonic()
        written = client.put("ha", table(2))
        print(f"put accepted after {time.monotonic() - started:.1f} s")
        print(f"leader {client.leadership().leader}")
        print(f"versions {client.versions('ha')}")
        ok = client.open("ha", 1).to_arrow().equals(table(1)) and written.to_arrow().equals(table(2))
    print("read equals what was put:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "put"))
