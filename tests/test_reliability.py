"""Replicas, failover, crashes and restarts, with real processes killed by SIGKILL."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.local.cluster import LocalCluster

from helpers import free_port, wait_until


def table_of(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(rows), "x": rng.random(rows), "y": rng.random(rows)})


@pytest.fixture
def small_cluster(tmp_path):
    with LocalCluster(tmp_path, nodes=3, first_ip=12, heartbeat=0.3, dead_after=1.5, catalog_port=free_port()) as c:
        yield c


def test_replicas_survive_kill_9_during_reads_then_dead_node_repair(small_cluster):
    c = small_cluster
    table = table_of(300_000)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        ds = client.put("replicated", table, tiling=(6, 1), replicas=2)
        d = ds.__partitioned__
        assert all(len(p["location"]) == 2 for p in d["partitions"].values())
        victim = c.nodes[1]
        results, errors = [], []

        def reader():
            for _ in range(8):
                try:
                    results.append(client.open("replicated").to_arrow().equals(table))
                except Exception as exc:
                    errors.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        victim.kill()
        for t in threads:
            t.join(120)
        assert not errors, errors[:1]
        assert results and all(results)

        # the catalog notices the missed heartbeats
        dead_ip = "127.0.0.13"
        wait_until(lambda: any(n["ip"] == dead_ip and not n["alive"] for n in client.nodes()), what="node marked dead")
        for part in client.open("replicated").__partitioned__["partitions"].values():
            assert part["location"][0][0] != dead_ip  # live replicas first

        report = client.repair()
        assert report["lost"] == [] and len(report["copied"]) == 4  # 6 parts x 2 replicas, 4 were on the dead node
        live = {n["ip"] for n in client.nodes() if n["alive"]}
        for part in client.open("replicated").__partitioned__["partitions"].values():
            assert len({ip for ip, _ in part["location"] if ip in live}) == 2
        assert client.open("replicated").to_arrow().equals(table)


def test_kill_9_during_a_put_publishes_nothing_and_a_retry_succeeds(small_cluster):
    c = small_cluster
    table = table_of(4_000_000, seed=1)  # ~96 MB, so the put is still running when the node dies
    victim = c.nodes[2]
    with fp.connect(c.uri) as client:
        failure = []

        def put():
            try:
                client.put("crashy", table, tiling=(24, 1))
            except Exception as exc:
                failure.append(exc)

        t = threading.Thread(target=put)
        t.start()
        wait_until(lambda: client.stats(victim.uri)["bytes_received"] > 0 or not t.is_alive(), what="the put to start")
        victim.kill()
        t.join(120)
        assert failure, "the put succeeded although a node died during it"
        assert isinstance(failure[0], fp.FlightpartError), repr(failure[0])
        assert "crashy" not in [d["name"] for d in client.list()]
        with pytest.raises(fp.DatasetNotFound):
            client.open("crashy")
        # restart the node on its directory: no temporary or unpublished partition is left
        data_dir = c.root / "node-127.0.0.14"
        c.nodes.remove(victim)
        restarted = c.add_node("127.0.0.14", heartbeat=0.3, data_dir=data_dir)
        wait_until(lambda: not list(data_dir.rglob("*.arrow")), what="the node to drop the aborted version")
        # none left behind: a temporary the restarted node is writing right now (its marker, renamed at once) may show
        wait_until(lambda: not list(data_dir.rglob(".tmp-*")), what="no temporary file left in the node's directory")
        ds = client.put("crashy", table, tiling=(24, 1))
        assert client.open("crashy").to_arrow().equals(table)
        assert restarted.uri in {r[0] for p in ds.__partitioned__["partitions"].values() for r in p["data"].replicas}


def test_catalog_restart_keeps_datasets_versions_and_nodes(small_cluster):
    c = small_cluster
    with fp.connect(c.uri) as client:
        client.put("kept", table_of(1000, seed=2))
        v2 = client.put("kept", table_of(500, seed=3))
        nodes_before = sorted(n["node_id"] for n in client.nodes())
    c.catalog.kill()
    c.catalog = c.start_catalog()
    with fp.connect(c.uri) as client:
        assert client.versions("kept") == [1, 2]
        assert sorted(n["node_id"] for n in client.nodes()) == nodes_before
        wait_until(lambda: all(n["alive"] for n in client.nodes()), what="nodes to heartbeat again")
        assert client.open("kept").to_arrow().equals(table_of(500, seed=3))
        assert client.open("kept", 1).to_arrow().equals(table_of(1000, seed=2))
        assert v2.version == 2


def test_a_reader_keeps_its_version_and_drop_frees_every_file(small_cluster):
    c = small_cluster
    first, second = table_of(3000, seed=4), table_of(2000, seed=5)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put("vers", first, tiling=(3, 1))
        reader = client.open("vers")
        client.put("vers", second, tiling=(3, 1))
        assert reader.version == 1 and reader.to_arrow().equals(first)
        assert client.open("vers").to_arrow().equals(second)
        client.drop("vers", 1)
        for k in range(3):
            assert not (c.root / f"node-127.0.0.{12 + k}" / "datasets" / "vers" / "v1").exists()
        with pytest.raises(fp.DatasetNotFound, match="v1 was dropped"):
            reader.to_arrow()  # a clear error, never other data
        with pytest.raises(fp.DatasetNotFound, match="has no version 1"):
            client.open("vers", 1)
        assert client.open("vers").to_arrow().equals(second)


def test_a_daemon_stops_on_sigterm_while_a_call_waits_on_a_stopped_node(tmp_path):
    """A repair copying from a holder that was SIGSTOPped waits on it with no end; SIGTERM still stops the catalog.

    Without a bound the catalog's shutdown waits for that call for as long as the holder stays stopped, and a
    supervisor's stop looks like a hang. SIGQUIT prints the stacks, leaving the daemon serving; SIGTERM stops it
    after its grace period, saying what it did not wait for; the caller gets an error, not a hang.
    """
    c = LocalCluster(tmp_path, nodes=3, first_ip=46, heartbeat=0.3, dead_after=1.5)
    holder, lost = c.nodes[0], c.nodes[1]
    try:
        with fp.connect(c.uri, host="127.0.0.99") as client:
            client.put("mirrored", table_of(50_000), tiling=(1, 1), replicas=2, nodes=["127.0.0.46", "127.0.0.47"])
            lost.kill()
            wait_until(lambda: any(n["ip"] == "127.0.0.47" and not n["alive"] for n in client.nodes()), what="a dead node")
            os.kill(holder.pid, signal.SIGSTOP)
            failed: list[BaseException] = []

            def repair() -> None:
                try:
                    client.repair()
                except BaseException as exc:  # what the caller saw is the assertion
                    failed.append(exc)

            repairing = threading.Thread(target=repair, daemon=True)
            repairing.start()
            wait_until(lambda: any(n["ip"] == "127.0.0.46" and not n["alive"] for n in client.nodes()),
                       what="the stopped holder marked dead while the repair waits on it")
            assert repairing.is_alive()  # the copy from the stopped holder has not come back

            c.catalog.proc.send_signal(signal.SIGQUIT)
            wait_until(lambda: "most recent call first" in c.catalog.log(), what="the catalog's stacks in its log")
            assert "_repair" in c.catalog.log() and c.catalog.proc.poll() is None
            assert {n["ip"] for n in client.nodes()} >= {"127.0.0.46", "127.0.0.48"}  # still answering

            c.catalog.proc.send_signal(signal.SIGTERM)
            assert c.catalog.proc.wait(120) == 0
            assert "still in flight" in c.catalog.log()
            repairing.join(120)
            assert not repairing.is_alive() and failed and isinstance(failed[0], fp.FlightpartError)
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        c.stop()
