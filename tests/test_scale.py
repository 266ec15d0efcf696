"""Costs that grow no faster than the work: liveness in memory, paged node replies, fan-out with short deadlines.

Speed itself is measured by ``flightpart bench --scale`` (docs/limits.md);
these tests check the mechanisms and the deadlines a user relies on.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart.io.layout import MANIFEST
from flightpart.io.transfer import streams_of
from flightpart.server.catalog import CatalogServer
from flightpart.server.node import NodeServer
from flightpart.server.settings import CatalogSettings, NodeSettings
from flightpart.server.state import CatalogState
from flightpart.server.state.records import PartRecord, Registration

from helpers import code_of, finished_within, free_port, put_raw, raw_action, wait_until


def test_heartbeats_are_kept_in_memory_and_written_in_batches(tmp_path):
    state = CatalogState(tmp_path / "c.sqlite", dead_after=5.0)
    for k in range(50):
        state.register_node(Registration(f"n{k}", f"grpc://10.0.0.{k}:1", f"10.0.0.{k}", k, None, []))
    writes = state.rows_written
    for _ in range(20):
        for k in range(50):
            assert state.heartbeat(f"n{k}", 1 << 30, False)
    assert state.rows_written == writes  # 1,000 heartbeats, no write to the database
    assert all(n.alive for n in state.nodes())
    state.flush_heartbeats()
    assert state.rows_written == writes + 51  # one row per node and the time of the flush, in one transaction
    assert not state.heartbeat("stranger")  # an unknown node is told to register
    state.must_register("n3")
    assert not state.heartbeat("n3")
    state.register_node(Registration("n3", "grpc://10.0.0.3:1", "10.0.0.3", 3, None, []))
    assert state.heartbeat("n3")
    state.close()
    again = CatalogState(tmp_path / "c.sqlite", dead_after=5.0)  # a restart starts from the last flush
    assert again.heartbeat("n7") and len(again.nodes()) == 50
    again.close()


def test_a_node_silent_past_the_retirement_time_is_forgotten_and_its_replicas_count_as_lost(tmp_path):
    state = CatalogState(tmp_path / "c.sqlite", dead_after=1.0)
    for k in range(3):
        state.register_node(Registration(f"n{k}", f"grpc://10.0.0.{k}:1", f"10.0.0.{k}", k, None, []))
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
    state.register_node(Registration("n0", "grpc://10.0.0.1:1", "10.0.0.1", 1, None, []))
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
        node = client.nodes()[0].uri
        first = raw_action(client, "held", {"dataset": "paged", "version": ds.version}, uri=node)  # the reply's JSON
        assert first["more"] and len(first["partitions"]) < 100 and len(first["schemas"]) == 1
        assert all("schema" not in p or p["schema"] is None for p in first["partitions"])


@pytest.mark.slow  # a fault test bound by a deadline: in the slow tier, which CI runs
def test_drop_and_abort_with_three_frozen_nodes_finish_within_their_deadline(new_cluster):
    with new_cluster(4, process=True) as c, fp.connect(c.uri, host="127.0.0.9") as client:
        table = pa.table({"a": np.arange(4_000)})
        client.put("frozen", table, tiling=(4, 1))
        pending = client.call(fp.wire.Begin("half")).version
        for k, node in enumerate(c.nodes):
            put_raw(node.uri, ["half", str(pending), str(k), "0"], table.slice(k * 1000, 1000))
        frozen = c.nodes[1:]
        for node in frozen:
            os.kill(node.pid, signal.SIGSTOP)
        try:
            # each waits for a frozen node at most the catalog's 2 s fan-out timeout; without it, for the call's
            # deadline (minutes): 60 s tells the two apart on a loaded machine
            aborted = finished_within(lambda: client.call(fp.wire.Abort("half", pending)), 60)
            dropped = finished_within(lambda: client.drop("frozen"), 60)
        finally:
            for node in frozen:
                os.kill(node.pid, signal.SIGCONT)
        assert "value" in aborted and "value" in dropped, (aborted, dropped)
        # the frozen nodes missed the orders: their next heartbeat is refused, they register again and delete the files

        def leftovers() -> list:
            return [p for p in c.root.rglob("*.arrow") if "/frozen/" in str(p) or "/half/" in str(p)]

        wait_until(lambda: not leftovers(), 30, "the frozen nodes to delete the dropped and aborted files")


def test_a_catalog_back_after_a_long_outage_does_not_retire_nodes_that_could_not_reach_it(tmp_path):
    state = CatalogState(tmp_path / "c.sqlite", dead_after=1.0)
    state.register_node(Registration("n0", "grpc://10.0.0.1:1", "10.0.0.1", 1, None, []))
    state.close()
    with sqlite3.connect(tmp_path / "c.sqlite") as db:  # the catalog was down for two days
        db.execute("UPDATE nodes SET last_heartbeat=?", (time.time() - 2 * 86400,))
    again = CatalogState(tmp_path / "c.sqlite", dead_after=1.0)
    assert again.retire_dead(86400.0) == []  # silence is counted from when this catalog could hear the node
    assert not again.nodes()[0].alive
    assert again.retire_dead(0.0) == ["n0"]
    again.close()


# --------------------------------------------------------------------------- several partitions per put stream


@pytest.mark.slow  # a load test (thousands of partitions): in the slow tier, which CI runs
def test_small_partitions_travel_several_to_a_stream():
    table = pa.table({"a": np.arange(30_000), "s": pa.array([f"v{k % 11}" for k in range(30_000)])})
    with fp.connect(timeout=300) as client:  # thousands of partitions in one put: a busy machine is slow
        node = client.nodes()[0].uri
        ds = client.put("many", table, tiling=(3_000, 1))
        stats = client.stats(node).values
        assert stats["partitions_stored"] == 3_000 and stats["put_streams"] <= 2
        assert ds.to_arrow().equals(table)
        assert ds.count_rows(pc.field("a") < 25) == 25  # statistics came with every partition
        big = pa.table({"a": np.arange(12_000_000)})  # 96 MB in 3 partitions: larger than a stream's share, one each
        client.put("large", big, tiling=(3, 1))
        assert client.stats(node).values["put_streams"] - stats["put_streams"] == 3


def test_streams_of_keeps_one_schema_one_column_group_and_a_bounded_size():
    small = pa.table({"a": np.arange(10)})
    tagged = small.replace_schema_metadata({"k": "v"})
    tables = {(0, 0): small, (1, 0): small, (0, 1): small, (2, 0): tagged, (3, 0): tagged, (4, 0): small}
    assert streams_of([(0, 0), (1, 0), (0, 1), (2, 0), (3, 0), (4, 0)], tables) == [
        [(0, 0), (1, 0)], [(0, 1)], [(2, 0), (3, 0)], [(4, 0)]]
    assert streams_of([(0, 0), (1, 0), (4, 0)], tables, max_bytes=small.nbytes * 2) == [[(0, 0), (1, 0)], [(4, 0)]]
    assert streams_of([(0, 0), (1, 0), (4, 0)], tables, max_parts=1) == [[(0, 0)], [(1, 0)], [(4, 0)]]


def _several(node: str, name: str, steps: list) -> None:
    """A hand-made put stream of several partitions: ("header", part), ("batch", table), ("trailer", rows), ("raw",
    bytes)."""
    schema = pa.schema([("a", pa.int64())])
    writer, reader = flight.connect(node).do_put(flight.FlightDescriptor.for_path(name, "1", "parts"), schema)
    for kind, value in steps:
        if kind == "batch":
            writer.write_table(value)
        else:
            body = {"header": lambda v: {"part": list(v)}, "trailer": lambda v: {"rows": v}}.get(kind)
            writer.write_metadata(pa.py_buffer(json.dumps(body(value)).encode() if body else value))
    writer.done_writing()
    while reader.read() is not None:
        pass
    writer.close()


@pytest.mark.parametrize("lie, code, stored", [
    ("batch before header", "INVALID_REQUEST", []),
    ("header not JSON", "INVALID_REQUEST", [(0, 0)]),
    ("rows miscounted", "INVALID_REQUEST", [(0, 0)]),
    ("stream ends before the trailer", "INVALID_REQUEST", [(0, 0)]),
    ("partition sent twice", "VERSION_CONFLICT", [(0, 0)]),
])
def test_a_lying_stream_of_several_partitions_stores_only_complete_ones(new_cluster, lie, code, stored):
    block = pa.table({"a": np.arange(100, dtype="int64")})
    good = [("header", (0, 0)), ("batch", block), ("trailer", 100)]
    steps = {
        "batch before header": [("batch", block)],
        "header not JSON": [*good, ("raw", b"{part")],
        "rows miscounted": [*good, ("header", (1, 0)), ("batch", block), ("trailer", 99)],
        "stream ends before the trailer": [*good, ("header", (1, 0)), ("batch", block)],
        "partition sent twice": [*good, ("header", (0, 0)), ("batch", block), ("trailer", 100)],
    }[lie]
    with new_cluster(1, process=True) as c:
        with pytest.raises(flight.FlightError) as info:
            _several(c.nodes[0].uri, "lies", steps)
        assert code_of(info.value) == code
        version_dir = c.root / f"node-{c.ips[0]}" / "datasets" / "lies" / "v1"
        files = sorted(p.name for p in version_dir.glob("*")) if version_dir.exists() else []
        assert files == [n for i, j in stored for n in (f"{i}_{j}.arrow", f"{i}_{j}.stats.json")]  # no temporary
        _several(c.nodes[0].uri, "after", [("header", (0, 0)), ("batch", block), ("trailer", 100)])  # still serving
        assert c.nodes[0].proc.poll() is None


# --------------------------------------------------------------------------- registration in pages


@pytest.mark.slow  # a fault test over several registrations: in the slow tier, which CI runs
def test_a_node_registers_in_pages_and_gets_missed_seals_over_several_registrations(tmp_path, monkeypatch):
    monkeypatch.setattr(NodeServer, "REGISTER_PAGE_BYTES", 4_000)  # a few dozen partitions per page
    monkeypatch.setattr(CatalogServer, "REPLY_BYTES", 1)  # one manifest per answer
    pages: list[int] = []
    original = CatalogState.register_node

    def counting(self, page):
        pages.append(len(page.held))
        return original(self, page)

    monkeypatch.setattr(CatalogState, "register_node", counting)
    port = free_port()
    catalog = CatalogServer(CatalogSettings.in_process("127.0.0.131", port=port))
    node = NodeServer(NodeSettings.in_process("127.0.0.131", data_dir=tmp_path / "node", catalog=catalog.uri,
                                                heartbeat=0.2))
    tables = {f"d{k}": pa.table({"a": np.arange(k, 2_000 + k), "s": pa.array([f"s{x % 5}" for x in range(2_000)])})
              for k in range(3)}
    try:
        wait_until(node.registered.is_set, 10, "the node to register")
        with fp.connect(catalog.uri, host="127.0.0.131") as client:
            for name, table in tables.items():
                client.put(name, table, tiling=(200, 1))
        catalog.shutdown()
        pages.clear()
        # a catalog that lost its state: rebuilt from the node's manifests
        catalog = CatalogServer(CatalogSettings.in_process("127.0.0.131", port=port))
        wait_until(lambda: len(catalog.state.datasets()) == 3 and node.registered.is_set(), 20, "the rebuild")
        assert len(pages) > 10 and sum(pages) == 600  # every partition told once, no page near the body limit
        with fp.connect(catalog.uri, host="127.0.0.131") as client:
            for name, table in tables.items():
                assert client.open(name).to_arrow().equals(table)
            manifests = [tmp_path / "node" / "datasets" / name / "v1" / MANIFEST for name in tables]
            for manifest in manifests:
                manifest.unlink()  # seals this node never got
            pages.clear()
            monkeypatch.setattr(NodeServer, "REGISTER_PAGE_BYTES", 4 << 20)  # all three versions in one page
            catalog.state.must_register(node.node_id)
            wait_until(lambda: all(m.exists() for m in manifests), 20, "every seal, one per registration")
            assert pages == [600, 600, 600]  # three registrations: each answer carried one manifest
            for name, table in tables.items():
                assert client.open(name).to_arrow().equals(table)
    finally:
        node.shutdown()
        catalog.shutdown()


@pytest.mark.slow  # a node killed mid-stream: a long fault test, in the slow tier CI runs
def test_a_node_killed_in_the_middle_of_a_stream_of_several_partitions_loses_nothing_published(new_cluster):
    import threading

    with new_cluster(1, process=True) as c, fp.connect(c.uri, host="127.0.0.9") as client:
        kept = pa.table({"a": np.arange(1_000)})
        client.put("kept", kept, tiling=(10, 1))
        node_dir = c.root / f"node-{c.ips[0]}"
        outcome: list[BaseException] = []

        def put() -> None:
            try:
                client.put("cut", pa.table({"a": np.arange(200_000)}), tiling=(20_000, 1))
            except BaseException as exc:
                outcome.append(exc)

        sender = threading.Thread(target=put)
        sender.start()
        wait_until(lambda: len(list(node_dir.glob("datasets/cut/v*/*.arrow"))) > 200, 60,
                   "the node to store part of the stream")
        c.nodes[0].kill()  # kill -9 while the stream is still arriving
        sender.join(120)
        assert not sender.is_alive() and outcome, "the put must fail, not hang or succeed"
        assert {d.name for d in client.list()} == {"kept"}  # nothing of the cut put was published
        c.nodes.clear()
        c.add_node(c.ips[0], heartbeat=0.3, data_dir=node_dir)
        wait_until(lambda: not list(node_dir.glob("datasets/cut/v*")), 30,
                   "the restarted node to delete the aborted version (files and temporaries)")
        assert client.open("kept").to_arrow().equals(kept)  # what was published before is intact
