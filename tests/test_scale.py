"""Costs that grow no faster than the work: liveness in memory, paged node replies, fan-out with short deadlines.

Speed itself is measured by ``flightpart bench --scale`` (docs/limits.md);
these tests check the mechanisms and the deadlines a user relies on.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import numpy as np
import pyarrow as pa

import flightpart as fp
from flightpart.server.catalog_state import CatalogState, PartRecord
from flightpart.server.node import NodeServer
from flightpart.tools.cluster import LocalCluster

from helpers import put_raw, wait_until


def test_heartbeats_are_kept_in_memory_and_written_in_batches(tmp_path):
    state = CatalogState(tmp_path / "c.sqlite", dead_after=5.0)
    for k in range(50):
        state.register_node(f"n{k}", f"grpc://10.0.0.{k}:1", f"10.0.0.{k}", k, None, [])
    writes = state._db.total_changes
    for _ in range(20):
        for k in range(50):
            assert state.heartbeat(f"n{k}", 1 << 30, False)
    assert state._db.total_changes == writes  # 1,000 heartbeats, no write to the database
    assert all(n.alive for n in state.nodes())
    state.flush_heartbeats()
    assert state._db.total_changes == writes + 50  # one row per node, in one transaction
    assert not state.heartbeat("stranger")  # an unknown node is told to register
    state.must_register("n3")
    assert not state.heartbeat("n3")
    state.register_node("n3", "grpc://10.0.0.3:1", "10.0.0.3", 3, None, [])
    assert state.heartbeat("n3")
    state.close()
    again = CatalogState(tmp_path / "c.sqlite", dead_after=5.0)  # a restart starts from the last flush
    assert again.heartbeat("n7") and len(again.nodes()) == 50
    again.close()


def test_a_node_silent_past_the_retirement_time_is_forgotten_and_its_replicas_count_as_lost(tmp_path):
    state = CatalogState(tmp_path / "c.sqlite", dead_after=1.0)
    for k in range(3):
        state.register_node(f"n{k}", f"grpc://10.0.0.{k}:1", f"10.0.0.{k}", k, None, [])
    nodes = {n.node_id: n for n in state.nodes()}
    v = state.begin("d")
    schema = pa.schema([("a", pa.int64())]).serialize().to_pybytes()
    state.commit("d", v, schema, (10, 1), (1, 1), [PartRecord((0, 0), (0, 0), (10, 1), 80, [nodes["n0"], nodes["n1"]])])
    time.sleep(0.3)
    for k in (1, 2):
        state.heartbeat(f"n{k}")
    assert state.retire_dead(0.2) == ["n0"]
    assert [n.node_id for n in state.version("d").parts[0].nodes] == ["n1"]
    assert not state.heartbeat("n0") and len(state.nodes()) == 2
    state.close()


def test_list_reads_the_node_table_once(tmp_path):
    state = CatalogState(tmp_path / "c.sqlite")
    state.register_node("n0", "grpc://10.0.0.1:1", "10.0.0.1", 1, None, [])
    node = state.nodes()[0]
    schema = pa.schema([("a", pa.int64())]).serialize().to_pybytes()
    for k in range(30):
        v = state.begin(f"d{k}")
        state.commit(f"d{k}", v, schema, (1, 1), (1, 1), [PartRecord((0, 0), (0, 0), (1, 1), 8, [node])])
    calls = []
    original = state.nodes
    state.nodes = lambda: calls.append(1) or original()  # type: ignore[method-assign]
    assert len(state.datasets()) == 30 and len(calls) == 1
    state.close()


def test_a_commit_reads_held_partitions_page_by_page(monkeypatch):
    monkeypatch.setattr(NodeServer, "HELD_PAGE_BYTES", 3_000)  # a page of a few dozen partitions
    table = pa.table({"a": np.arange(3_000), "s": pa.array([f"v{k % 7}" for k in range(3_000)])})
    with fp.connect() as client:
        ds = client.put("paged", table, tiling=(600, 1))
        assert ds.to_arrow().equals(table)
        node = client.nodes()[0]["uri"]
        first = client.pool.action(node, "held", {"dataset": "paged", "version": ds.version})
        assert first["more"] and len(first["partitions"]) < 100 and len(first["schemas"]) == 1
        assert all("schema" not in p or p["schema"] is None for p in first["partitions"])


def test_drop_and_abort_with_three_frozen_nodes_finish_within_their_deadline(tmp_path):
    with LocalCluster(tmp_path, nodes=4, first_ip=121) as c, fp.connect(c.uri, host="127.0.0.9") as client:
        table = pa.table({"a": np.arange(4_000)})
        client.put("frozen", table, tiling=(4, 1))
        pending = client.pool.action(c.uri, "begin", {"dataset": "half"})["version"]
        for k, node in enumerate(c.nodes):
            put_raw(node.uri, ["half", str(pending), str(k), "0"], table.slice(k * 1000, 1000))
        frozen = c.nodes[1:]
        for node in frozen:
            os.kill(node.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            client.pool.action(c.uri, "abort", {"dataset": "half", "version": pending})
            abort_s = time.monotonic() - t0
            t0 = time.monotonic()
            client.drop("frozen")
            drop_s = time.monotonic() - t0
        finally:
            for node in frozen:
                os.kill(node.pid, signal.SIGCONT)
        assert abort_s < 5 and drop_s < 5, (abort_s, drop_s)
        # the frozen nodes missed the orders: their next heartbeat is refused, they register again and delete the files

        def leftovers() -> list:
            return [p for p in tmp_path.rglob("*.arrow") if "/frozen/" in str(p) or "/half/" in str(p)]

        wait_until(lambda: not leftovers(), 30, "the frozen nodes to delete the dropped and aborted files")


def test_a_catalog_back_after_a_long_outage_does_not_retire_nodes_that_could_not_reach_it(tmp_path):
    state = CatalogState(tmp_path / "c.sqlite", dead_after=1.0)
    state.register_node("n0", "grpc://10.0.0.1:1", "10.0.0.1", 1, None, [])
    state.close()
    with sqlite3.connect(tmp_path / "c.sqlite") as db:  # the catalog was down for two days
        db.execute("UPDATE nodes SET last_heartbeat=?", (time.time() - 2 * 86400,))
    again = CatalogState(tmp_path / "c.sqlite", dead_after=1.0)
    assert again.retire_dead(86400.0) == []  # silence is counted from when this catalog could hear the node
    assert not again.nodes()[0].alive
    assert again.retire_dead(0.0) == ["n0"]
    again.close()
