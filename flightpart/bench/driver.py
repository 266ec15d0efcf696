"""One reader process of ``flightpart bench --network``, run on a host of the cluster.

The bench starts one per contender and host (``python -m
flightpart.bench.driver KIND``, KIND: ``flightpart``, ``raw`` or
``dask``) and sends it one JSON command per line; it answers one JSON line
per command. A reader of its own means the bench can count its CPU from
``/proc`` with the processes that served it, and freeze it while other
contenders run. Every driver makes its data from the same seeds, so no
table crosses between processes except the way being measured.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from flightpart.tiling import grid_cells

from .run import bench_data


class FlightpartReader:
    """Puts the bench's datasets and reads them with ``to_arrow()`` under a chosen compression and stream count."""

    def __init__(self, catalog: str):
        from flightpart.client import connect

        self.connect = connect
        self.catalog = catalog
        self.clients: dict[tuple[str, int], Any] = {}

    def client(self, compression: str = "auto", streams: int = 1) -> Any:
        key = (compression, streams)
        if key not in self.clients:
            self.clients[key] = self.connect(self.catalog, compression=compression, streams_per_partition=streams)
        return self.clients[key]

    def put(self, name: str, kind: str, nbytes: int, tiling: list[int], nodes: list[str] | None, replicas: int) -> dict:
        ds = self.client().put(name, bench_data(kind, nbytes), tiling=tuple(tiling), nodes=nodes, replicas=replicas)
        return {"version": ds.version, "nbytes": ds.nbytes}

    def partition_file(self, name: str, ip: str) -> dict:
        """The path of partition (0, 0) on the node at ``ip`` (the raw baseline serves the same bytes)."""
        from flightpart.io.layout import partition_relpath
        from flightpart.wire import GetNodeInfo

        client = self.client()
        ds = client.open(name)
        ref = ds.__partitioned__["partitions"][(0, 0)]["data"]
        uri = next(uri for uri, node_ip, _pid in ref.replicas if node_ip == ip)
        info = client.pool.action(uri, GetNodeInfo())
        return {"path": f"{info.data_dir}/{partition_relpath(name, ds.version, (0, 0))}"}

    def read(self, name: str, compression: str = "auto", streams: int = 1) -> dict:
        table = self.client(compression, streams).open(name).to_arrow()
        return {"nbytes": table.nbytes, "rows": table.num_rows}

    def allocator(self) -> dict:
        """What this reader's allocator decided on its first read, and why (with the bench's default settings)."""
        from flightpart.io.allocator import tuning_state

        return {"allocator": tuning_state()}

    def compressed(self) -> dict:
        client = self.client()
        sent = sum(client.stats(n.uri).values.get("streams_compressed", 0) for n in client.nodes())
        return {"streams_compressed": sent}


class RawReader:
    """A plain pyarrow Flight client of the baseline server."""

    def __init__(self, uri: str):
        import pyarrow.flight as flight

        self.flight = flight
        self.conn = flight.connect(uri)

    def read(self, batch: int) -> dict:
        table = self.conn.do_get(self.flight.Ticket(str(batch).encode())).read_all()
        return {"nbytes": table.nbytes, "rows": table.num_rows}


class DaskReader:
    """A Dask client that scatters the bench's tables to chosen workers and gathers them."""

    def __init__(self, scheduler_file: str):
        import distributed

        self.client = distributed.Client(scheduler_file=scheduler_file, timeout=60)
        self.futures: dict[str, list] = {}

    def workers(self) -> dict:
        """The hosts of the workers that joined so far."""
        return {"hosts": sorted(info["host"] for info in self.client.scheduler_info(n_workers=-1)["workers"].values())}

    def scatter(self, name: str, kind: str, nbytes: int, parts: int, ips: list[str]) -> dict:
        table = bench_data(kind, nbytes)
        workers = {info["host"]: address
                   for address, info in self.client.scheduler_info(n_workers=-1)["workers"].items()}
        pieces = [table.slice(c.start[0], c.shape[0])
                  for c in grid_cells((table.num_rows, table.num_columns), (parts, 1))]
        self.futures[name] = [self.client.scatter(p, workers=[workers[ip]], direct=True) for p, ip in zip(pieces, ips)]
        return {}

    def read(self, name: str) -> dict:
        tables = self.client.gather(self.futures[name])
        return {"nbytes": sum(t.nbytes for t in tables), "rows": sum(t.num_rows for t in tables)}


KINDS: dict[str, Callable[..., Any]] = {"flightpart": FlightpartReader, "raw": RawReader, "dask": DaskReader}


def main() -> None:
    kind = sys.argv[1]
    reader: Any = None
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        try:
            if op == "start":
                reader = KINDS[kind](**command)
                answer: dict = {}
            else:
                t0 = time.perf_counter()
                answer = getattr(reader, op)(**command)
                answer["seconds"] = time.perf_counter() - t0
        except Exception as exc:  # the bench reports it and stops
            answer = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
