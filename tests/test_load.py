"""32 concurrent clients, 30 reads each, against a 3-node dataset: no errors, no leaks."""

from __future__ import annotations

import threading

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightpart as fp

from helpers import run_threads

CLIENTS, ROUNDS = 32, 30


@pytest.mark.slow
def test_32_clients_30_rounds_checksums_and_flat_memory(new_cluster):
    table = pa.table({"id": np.arange(150_000), "x": np.random.default_rng(7).random(150_000)})
    expected = (table.num_rows, pc.sum(table.column("x")).as_py())
    with new_cluster(3, process=True) as c:
        with fp.connect(c.uri) as client:
            client.put("load", table, tiling=(6, 1))
        servers = [psutil.Process(n.pid) for n in c.nodes]
        rss: dict[int, list[int]] = {5: [], ROUNDS: []}
        errors: list[BaseException] = []
        bad: list[tuple] = []
        barrier = threading.Barrier(CLIENTS, action=lambda: None)
        round_done = threading.Barrier(CLIENTS, action=lambda: record())
        current = [0]

        def record():
            current[0] += 1
            if current[0] in rss:
                rss[current[0]] = [p.memory_info().rss for p in servers]

        def worker():
            try:
                with fp.connect(c.uri, host="127.0.0.99") as mine:
                    barrier.wait()
                    for _ in range(ROUNDS):
                        got = mine.open("load").to_arrow()
                        checksum = (got.num_rows, pc.sum(got.column("x")).as_py())
                        if checksum != expected:
                            bad.append(checksum)
                        round_done.wait()
            except BaseException as exc:
                errors.append(exc)
                barrier.abort()
                round_done.abort()

        run_threads(worker, CLIENTS, 600)
    assert not errors, repr(errors[0])
    assert not bad
    for before, after in zip(rss[5], rss[ROUNDS]):
        assert after <= before * 1.10, (f"server RSS grew from {before} to {after} bytes between round 5 "
                                        f"and round {ROUNDS}")
