"""Replicas, failover, crashes and restarts, with real processes killed by SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp

from helpers import free_port, wait_until


def table_of(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(rows), "x": rng.random(rows), "y": rng.random(rows)})


@pytest.fixture
def small_cluster(new_cluster):
    with new_cluster(3, process=True, heartbeat=0.3, dead_after=1.5, catalog_port=free_port()) as c:
        yield c


@pytest.mark.slow  # a long fault test: behind the marker CI still runs
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
        dead_ip = c.ips[1]
        wait_until(lambda: any(n.ip == dead_ip and not n.alive for n in client.nodes()), what="node marked dead")
        for part in client.open("replicated").__partitioned__["partitions"].values():
            assert part["location"][0][0] != dead_ip  # live replicas first

        report = client.repair()
        assert report["lost"] == [] and len(report["copied"]) == 4  # 6 parts x 2 replicas, 4 were on the dead node
        live = {n.ip for n in client.nodes() if n.alive}
        for part in client.open("replicated").__partitioned__["partitions"].values():
            assert len({ip for ip, _ in part["location"] if ip in live}) == 2
        assert client.open("replicated").to_arrow().equals(table)


@pytest.mark.slow  # a fault test (a node killed, two repairs raced): in the slow tier, which CI runs
def test_two_repairs_at_once_copy_each_lost_replica_once(new_cluster):
    """Two operators (or a cron and an operator) run repair together: the second waits for the first and copies only
    what is still missing, so no partition gets a third replica and no copy is made or reported twice."""
    with new_cluster(4, process=True, heartbeat=0.3, dead_after=1.5, catalog_port=free_port()) as c:
        table = table_of(2_000_000, seed=3)  # 8 partitions of ~6 MB: each copy takes long enough for the two to overlap
        with fp.connect(c.uri, host="127.0.0.99") as client:
            client.put("twice", table, tiling=(8, 1), replicas=2)
            dead_ip = c.ips[1]
            on_dead = [key for key, p in client.open("twice").__partitioned__["partitions"].items()
                       if dead_ip in {ip for ip, _ in p["location"]}]
            assert on_dead
            c.nodes[1].kill()
            wait_until(lambda: any(n.ip == dead_ip and not n.alive for n in client.nodes()),
                       what="node marked dead")
            start = threading.Barrier(2)
            reports: list[dict] = []

            def repair() -> None:
                with fp.connect(c.uri) as own:
                    start.wait()
                    reports.append(own.repair())

            threads = [threading.Thread(target=repair) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            assert len(reports) == 2 and all(not r["lost"] and not r["failed"] for r in reports), reports
            copied = sorted(tuple(copy["part"]) for r in reports for copy in r["copied"])
            assert copied == sorted(on_dead), reports  # each lost replica copied once, by one of the two
            live = {n.ip for n in client.nodes() if n.alive}
            for part in client.open("twice").__partitioned__["partitions"].values():
                assert len({ip for ip, _ in part["location"] if ip in live}) == 2, part  # not a third copy
            assert client.open("twice").to_arrow().equals(table)


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
        # frozen first, so its share cannot be done before it dies (a put of this size on an idle machine had finished
        # between the first bytes it saw and the kill): it dies with the put still running, as a crash mid-put does
        os.kill(victim.pid, signal.SIGSTOP)
        t.start()
        others = [n for n in c.nodes if n is not victim]
        wait_until(lambda: any(client.stats(n.uri).values["bytes_received"] > 0 for n in others) or not t.is_alive(),
                   what="the put to start")
        victim.kill()
        t.join(120)
        assert failure, "the put succeeded although a node died during it"
        assert isinstance(failure[0], fp.FlightpartError), repr(failure[0])
        assert "crashy" not in [d.name for d in client.list()]
        with pytest.raises(fp.DatasetNotFound):
            client.open("crashy")
        # restart the node on its directory: no temporary or unpublished partition is left
        data_dir = c.root / f"node-{c.ips[2]}"
        c.nodes.remove(victim)
        restarted = c.add_node(c.ips[2], heartbeat=0.3, data_dir=data_dir)
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
        nodes_before = sorted(n.node_id for n in client.nodes())
    c.catalog.kill()
    c.catalog = c.start_catalog()
    with fp.connect(c.uri) as client:
        assert client.versions("kept") == [1, 2]
        assert sorted(n.node_id for n in client.nodes()) == nodes_before
        wait_until(lambda: all(n.alive for n in client.nodes()), what="nodes to heartbeat again")
        assert client.open("kept").to_arrow().equals(table_of(500, seed=3))
        assert client.open("kept", 1).to_arrow().equals(table_of(1000, seed=2))
        assert v2.version == 2


@pytest.mark.slow  # waits out a dead_after on purpose
def test_writes_right_after_a_catalog_restart_find_their_live_nodes(new_cluster):
    """A restarted catalog's recorded heartbeats are older than ``dead_after``: until each node beats again it had
    called live nodes dead, so an append at once was told its partitions' holders were gone (``run repair``) and a
    put placed on fewer nodes. Now the node list waits until every node was heard from or stayed silent too long;
    a drop then skips the nodes not heard from yet but has them register again, so they learn it. The stats, which
    do not wait, count such a node as unknown, not dead."""
    with new_cluster(2, process=True, heartbeat=2.0, dead_after=4.0, catalog_port=free_port()) as c:
        with fp.connect(c.uri) as client:
            client.put("grown", table_of(200, seed=4), tiling=(2, 1))
        time.sleep(5.0)  # the registrations the database holds are now older than dead_after
        for write in ("append", "put"):
            c.catalog.kill()
            c.catalog = c.start_catalog()
            with fp.connect(c.uri) as client:
                # the stats do not wait: a node not heard from yet is "unknown", not dead
                stats = client.call(fp.wire.GetStats()).values
                assert stats["nodes_dead"] == 0 and stats["nodes_alive"] + stats["nodes_unknown"] == 2, stats
                if write == "append":
                    assert client.append("grown", table_of(100, seed=5)).version == 2
                    assert client.open("grown").to_arrow().num_rows == 300
                else:
                    placed = client.put("spread", table_of(400, seed=6), tiling=(4, 1))
                    holders = {r[0] for p in placed.__partitioned__["partitions"].values() for r in p["data"].replicas}
                    assert holders == {n.uri for n in c.nodes}, "a put right after the restart left a live node out"
                    assert all(n.alive for n in client.nodes())
        # a drop right after a restart, before the nodes beat again: they are told when they register again (they
        # had been skipped as dead and, known to the catalog, never asked to register: the files stayed)
        c.catalog.kill()
        c.catalog = c.start_catalog()
        with fp.connect(c.uri) as client:
            client.drop("grown")
        wait_until(lambda: not list(c.root.glob("node-*/datasets/grown/v*/*.arrow")), 30,
                   "the nodes to delete the dropped dataset's files")


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
        for ip in c.ips[:3]:
            assert not (c.root / f"node-{ip}" / "datasets" / "vers" / "v1").exists()
        with pytest.raises(fp.DatasetNotFound, match="v1 was dropped"):
            reader.to_arrow()  # a clear error, never other data
        with pytest.raises(fp.DatasetNotFound, match="has no version 1"):
            client.open("vers", 1)
        assert client.open("vers").to_arrow().equals(second)


@pytest.mark.slow  # a copy waits out its 35 s deadline
def test_a_repair_goes_on_past_a_frozen_holder_and_says_what_it_could_not_copy(new_cluster):
    """A holder SIGSTOPped while repair copies from it: the copy fails within its deadline (it waited without end),
    the repair copies the other dataset's partition from a live holder and reports the one it could not copy, with
    why; once the holder is back, the next repair makes that copy. Nothing is lost."""
    c = new_cluster(4, process=True, heartbeat=0.3, dead_after=8.0)  # alive when repair starts
    holder, lost, other, spare = c.nodes
    frozen = False
    try:
        with fp.connect(c.uri, host="127.0.0.99") as client:
            first, second = table_of(20_000, 1), table_of(20_000, 2)
            client.put("first", first, tiling=(1, 1), replicas=2, nodes=c.ips[:2])
            client.put("second", second, tiling=(1, 1), replicas=2, nodes=[c.ips[2], c.ips[1]])
            lost.kill()
            wait_until(lambda: any(n.ip == c.ips[1] and not n.alive for n in client.nodes()),
                       what="a dead node")
            os.kill(holder.pid, signal.SIGSTOP)
            frozen = True
            # first's only live holder is frozen: that copy waits out its deadline; the command says so by its exit
            done = subprocess.run([sys.executable, "-m", "flightpart", "repair", "--json", "--catalog", c.uri],
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 1, done.stderr
            report = json.loads(done.stdout)
            assert [(f["dataset"], tuple(f["part"])) for f in report["failed"]] == [("first", (0, 0))]
            assert "did not answer" in report["failed"][0]["reason"] or "UNAVAILABLE" in report["failed"][0]["reason"]
            assert [(x["dataset"], x["to"]) for x in report["copied"]] == [("second", spare.uri)] and not report["lost"]
            assert "is not asked again in this repair" in c.catalog.log()

            os.kill(holder.pid, signal.SIGCONT)
            frozen = False
            wait_until(lambda: all(n.alive for n in client.nodes() if n.ip != c.ips[1]), 30,
                       "the holder back")
            again = client.repair()
            assert [x["dataset"] for x in again["copied"]] == ["first"] and not again["failed"] and not again["lost"]
            holder.kill()  # first is now read from its new copy alone
            assert client.open("first").to_arrow().equals(first) and client.open("second").to_arrow().equals(second)
    finally:
        if frozen:
            os.kill(holder.pid, signal.SIGCONT)
        c.stop()


@pytest.mark.slow  # the copy to the frozen target waits out the holder's 30 s put deadline
def test_a_repair_moves_to_another_target_when_the_first_is_frozen(new_cluster):
    """The least loaded node, chosen as the target, is SIGSTOPped: the holder's put to it fails within its deadline,
    the holder says the target failed (not itself), and the repair copies to the next node instead."""
    c = new_cluster(4, process=True, heartbeat=0.3, dead_after=8.0)
    holder, lost, frozen_target, other = c.nodes
    frozen = False
    try:
        with fp.connect(c.uri, host="127.0.0.99") as client:
            client.put("ballast", table_of(100, 3), tiling=(1, 1), nodes=[c.ips[3]])  # the other node is busier
            kept = table_of(20_000, 4)
            client.put("kept", kept, tiling=(1, 1), replicas=2, nodes=c.ips[:2])
            lost.kill()
            wait_until(lambda: any(n.ip == c.ips[1] and not n.alive for n in client.nodes()),
                       what="a dead node")
            os.kill(frozen_target.pid, signal.SIGSTOP)
            frozen = True
            report = client.repair()
            assert [(x["dataset"], x["to"]) for x in report["copied"]] == [("kept", other.uri)], report
            assert not report["failed"] and not report["lost"]
            assert f"{frozen_target.uri} is not asked again" in c.catalog.log()
            holder.kill()  # kept is now read from the new copy alone
            assert client.open("kept").to_arrow().equals(kept)
    finally:
        if frozen:
            os.kill(frozen_target.pid, signal.SIGCONT)
        c.stop()


@pytest.mark.slow  # a fault test waiting out a stop's grace period: in the slow tier, which CI runs
def test_a_node_stops_on_sigterm_while_a_reader_stopped_mid_stream(new_cluster):
    """A reader that stopped reading in the middle of a large partition holds the node's DoGet (gRPC's flow control
    blocks its writes); SIGTERM still stops the node, within its grace period, saying what it did not wait for.
    SIGQUIT first prints every thread's stack and leaves the node serving."""
    c = new_cluster(1, process=True, heartbeat=0.3, dead_after=3.0)
    try:
        with fp.connect(c.uri, host="127.0.0.99") as client:
            ds = client.put("big", table_of(3_000_000), tiling=(1, 1))
            ref = next(iter(ds.__partitioned__["partitions"].values()))["data"]
            reader = flight.connect(ref.replicas[0][0]).do_get(ref.ticket())
            reader.read_chunk()  # one batch of many, and no more: the node's writes block once the windows are full
            time.sleep(1.0)
            node = c.nodes[0]
            node.proc.send_signal(signal.SIGQUIT)
            wait_until(lambda: "most recent call first" in node.log(), what="the node's stacks in its log")
            assert node.proc.poll() is None
            node.proc.send_signal(signal.SIGTERM)
            assert node.proc.wait(120) == 0
            assert "still in flight" in node.log()
            with pytest.raises((flight.FlightError, pa.ArrowException, OSError)):
                for _ in range(10_000):  # what was left: the stream ends with an error, not a hang
                    reader.read_chunk()
    finally:
        c.stop()
