"""Several catalogs, one leader, on a real PostgreSQL: kill -9 and SIGSTOP of the leader, fencing of its orders,
the database going away, and many takeovers during a stream of writes.

Every daemon is a real ``flightpart`` process; the catalogs share a lease in
a PostgreSQL server started here (Debian's binaries, as an unprivileged
user, on a loopback port). Nodes and clients are given every catalog's
address.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.io.connections import ConnectionPool
from flightpart.local.cluster import Daemon
from flightpart.local.postgres import LocalPostgres, missing_reason
from flightpart.wire import DropFiles, GetLeadership, Seal
from tests.ha import HaCluster, ha_cluster, table
from tests.helpers import code_of, free_port, wait_until

pytestmark = pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason()))


@pytest.fixture(scope="module")
def postgres():
    with LocalPostgres() as pg:
        yield pg


@pytest.fixture
def ha(postgres, tmp_path):
    cluster = ha_cluster(postgres, tmp_path)
    yield cluster
    cluster.stop()


@pytest.mark.slow  # a fault test on a PostgreSQL started for it: in the slow tier, which CI runs
def test_a_killed_leader_is_replaced_and_writes_go_on_through_every_address(ha):
    opened = ha.client.put("t", table(0), tiling=(10, 1))
    old = ha.leader()
    before = ha.leadership(old)
    assert before.role == "leader" and before.epoch is not None
    assert [s for s in before.standbys] == [a for a in ha.addresses if a != old]

    # operators see it: the CLI, the status page and the metrics of each catalog
    shown = subprocess.run([sys.executable, "-m", "flightpart", "catalogs", "--catalog", ha.uri, "--json"],
                           capture_output=True, text=True, timeout=60)
    assert json.loads(shown.stdout)["leader"] == old, shown.stderr
    waited = subprocess.run([sys.executable, "-m", "flightpart", "wait", ha.uri, "--nodes", "3", "--json"],
                            capture_output=True, text=True, timeout=60)
    assert json.loads(waited.stdout)["nodes_alive"] == 3, waited.stderr
    listed = subprocess.run([sys.executable, "-m", "flightpart", "nodes", "--catalog", ha.uri],
                            capture_output=True, text=True, timeout=60)
    assert f"leader {old}, epoch {before.epoch}" in listed.stdout, listed.stderr
    for address, daemon in ha.catalogs.items():
        page = daemon.uris["catalog-metrics"].replace("/metrics", "/status.json")
        status = json.loads(urllib.request.urlopen(page, timeout=10).read())
        assert (status["catalogs"]["leader"] == old
                and status["catalogs"]["role"] == ("leader" if address == old else "standby"))
        metrics = urllib.request.urlopen(daemon.uris["catalog-metrics"], timeout=10).read().decode()
        assert f'flightpart_catalog_leader{{role="catalog"}} {1.0 if address == old else 0.0}' in metrics

    ha.catalogs[old].kill()
    killed = time.monotonic()
    written = ha.client.put("t", table(1000), tiling=(10, 1))  # waits for the standby to take over
    took = time.monotonic() - killed
    print(f"put accepted {took:.2f} s after kill -9 of the leader")

    new = ha.leader()
    assert new != old and ha.client.uri == new
    after = ha.leadership(new)
    assert after.role == "leader" and after.epoch > before.epoch
    assert written.version == opened.version + 1 and ha.client.versions("t") == [opened.version, written.version]
    assert opened.to_arrow().equals(table(0))  # a dataset opened before the takeover reads on, from the nodes
    assert ha.client.open("t").to_arrow().column("id").to_pylist() == list(range(1000, 2000))

    # every node follows the new leader: an order carrying the old epoch changes nothing
    pool = ConnectionPool()
    for node in ha.nodes:
        with pytest.raises(Exception) as refused:
            pool.action(node.uri, DropFiles("t", None, _cluster_of(ha), epoch=before.epoch), timeout=5)
        assert code_of(refused.value) == "STALE_EPOCH"
    pool.close()
    assert ha.client.open("t", opened.version).to_arrow().equals(table(0))

    # the killed catalog comes back where it was: a standby that names the leader
    ha.start_catalog(old)
    wait_until(lambda: ha.leadership(old).role == "standby", 15, "the restarted catalog stands by")
    assert ha.leadership(old).leader == new
    with pytest.raises(fp.NotLeader) as standby:
        ha.at(old, fp.wire.ListNodes())
    assert standby.value.field == new


def _cluster_of(ha: HaCluster) -> str:
    """The cluster id, as the nodes keep it (their data directories' marker)."""
    from flightpart.io.layout import read_marker

    return read_marker(ha.tmp / "n0")["cluster"]


@pytest.mark.slow
def test_a_frozen_leader_is_fenced_and_steps_down_when_it_wakes(ha):
    ha.client.put("t", table(0), tiling=(4, 1))
    old = ha.leader()
    old_epoch = ha.leadership(old).epoch
    other = next(a for a in ha.addresses if a != old)
    os.kill(ha.catalogs[old].pid, signal.SIGSTOP)
    try:
        wait_until(lambda: ha.leadership(other).role == "leader", 20, "the standby takes over from a frozen leader")
        written = ha.client.put("t", table(5000), tiling=(4, 1))
        assert ha.client.uri == other
    finally:
        os.kill(ha.catalogs[old].pid, signal.SIGCONT)
    wait_until(lambda: ha.leadership(old).role == "standby", 15, "the woken leader steps down")
    assert ha.leadership(old).leader == other
    assert "lease: lost" in ha.catalogs[old].log()

    # the old leader's orders (its epoch) are refused by every node, and nothing changes
    pool = ConnectionPool()
    manifest = fp.wire.Commit("t", written.version, table(0).schema, (1000, 2), (4, 1), ())
    for node in ha.nodes:
        for order in (DropFiles("t", None, _cluster_of(ha), epoch=old_epoch),
                      Seal(_cluster_of(ha), manifest, epoch=old_epoch)):
            with pytest.raises(Exception) as refused:
                pool.action(node.uri, order, timeout=5)
            assert code_of(refused.value) == "STALE_EPOCH", order
        assert pool.action(node.uri, fp.wire.GetStats(), timeout=5).to_json()["stale_orders"] >= 2
    pool.close()
    # nor can it write the shared state: a call straight to it is refused, naming the leader
    with pytest.raises(fp.NotLeader) as refused:
        ha.at(old, fp.wire.Drop("t"))
    assert refused.value.field == other
    assert ha.client.versions("t") == [1, 2] and ha.client.open("t").to_arrow().equals(table(5000))


@pytest.mark.slow
def test_without_its_database_the_catalog_serves_reads_refuses_writes_and_resumes(ha, postgres):
    ha.client.put("t", table(0), tiling=(10, 1))
    ha.client.open("t").to_arrow()  # read once: what the leader remembers
    postgres.pause()
    try:
        with pytest.raises(fp.StateUnavailable) as refused:
            ha.client.put("u", table(0))
        assert "state database" in str(refused.value)
        # opens go on from the leader's memory, past the lease's end
        time.sleep(ha.lease_seconds + 1)
        for _ in range(3):
            assert ha.client.open("t").to_arrow().equals(table(0))
        assert ha.client.call(GetLeadership()).role in ("read-only", "leader")
    finally:
        postgres.start()
    written = wait_until(lambda: _try_put(ha, "u"), 30, "writes resume once the database is back")
    assert written.to_arrow().equals(table(0)) and ha.client.versions("t") == [1]


def _try_put(ha: HaCluster, name: str):
    try:
        return ha.client.put(name, table(0))
    except (fp.StateUnavailable, fp.NotLeader):
        return None


@pytest.mark.slow
def test_a_drop_whose_answer_died_with_the_leader_is_done_not_dataset_not_found(ha):
    """The leader commits a drop and freezes while it tells the nodes (a holder is frozen, so the order waits): its
    answer never comes. The client asks the next catalog, which took over and finds the dataset dropped. The drop
    returns, as done; it had raised DATASET_NOT_FOUND for a drop that was made. A drop of what was never put, or a
    second drop, still raises it."""
    ha.client.put("gone", table(0), tiling=(3, 1))
    leader = ha.catalogs[ha.leader()]
    holder = ha.nodes[0]
    os.kill(holder.pid, signal.SIGSTOP)
    freeze = threading.Timer(0.7, lambda: os.kill(leader.pid, signal.SIGSTOP))  # the drop is written by then
    try:
        with fp.connect(ha.uri, timeout=4) as client:
            freeze.start()
            client.drop("gone")
            assert freeze.finished.is_set()
            with pytest.raises(fp.DatasetNotFound, match="dropped already"):
                client.drop("gone")
            with pytest.raises(fp.DatasetNotFound, match="does not exist"):
                client.drop("never-put")
            with pytest.raises(fp.DatasetNotFound):
                client.open("gone")
    finally:
        freeze.cancel()
        os.kill(leader.pid, signal.SIGCONT)
        os.kill(holder.pid, signal.SIGCONT)
    wait_until(lambda: not list(ha.tmp.glob("n*/datasets/gone/v*/*.arrow")), 30, "every node to delete the files")


def test_a_catalog_given_no_reachable_database_says_so_at_start(tmp_path):
    port = free_port()
    with pytest.raises(RuntimeError) as failed:
        Daemon(["catalog", "--host", "127.0.0.1", "--port", "0", "--lease", f"postgresql://nobody@127.0.0.1:{port}/x",
                "--state-dir", str(tmp_path)], timeout=30)
    message = str(failed.value)
    assert "CANNOT_START" in message or "--lease" in message
    assert "Traceback" not in message


@pytest.mark.slow
def test_twenty_leader_kills_during_puts_and_appends_lose_and_duplicate_nothing(ha):
    """A writer puts and appends rows with unique ids while the leader is killed 20 times (each killed catalog
    comes back as a standby); readers of a dataset opened at the start read all along."""
    ha.client.put("log", table(0, 10), tiling=(1, 1))
    opened = ha.client.open("log")
    acked: list[int] = list(range(10))  # ids of acknowledged appends
    unsure: list[int] = []  # ids of appends whose outcome the writer was not told
    versions: list[int] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def writer() -> None:
        next_id = 10
        with fp.connect(ha.uri, timeout=10) as client:
            while not stop.is_set():
                rows = table(next_id, 5)
                try:
                    client.append("log", rows)
                    acked.extend(range(next_id, next_id + 5))
                    versions.append(client.put("snap", rows).version)
                except fp.FlightpartError:
                    unsure.extend(range(next_id, next_id + 5))
                next_id += 5

    def reader() -> None:
        while not stop.is_set():
            try:
                assert opened.to_arrow().equals(table(0, 10))
            except BaseException as exc:  # any failure of a reader of an open dataset fails the test
                failures.append(exc)
                return

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    try:
        for _ in range(20):
            # each leader lives until the writer has an append acknowledged by it: every round is a failover in the
            # middle of the stream of writes, however slow the machine (no fixed sleep decides it)
            seen = len(acked)
            wait_until(lambda seen=seen: len(acked) >= seen + 10 or failures, 120, "the writer's next appends")
            killed = ha.leader()
            ha.catalogs[killed].kill()
            wait_until(lambda killed=killed: ha.leader() != killed, 30, "a standby takes over")
            ha.start_catalog(killed)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not failures, failures
    print(f"{len(acked)} ids acknowledged, {len(unsure)} told failed, {len(versions)} snapshots")
    ids = ha.client.open("log").to_arrow().column("id").to_pylist()
    assert len(ids) == len(set(ids)), "an append was applied twice"
    assert set(acked) <= set(ids), "an acknowledged append is missing"
    assert set(ids) <= set(acked) | set(unsure)
    snaps = ha.client.versions("snap")
    assert len(snaps) == len(set(snaps)) and set(versions) <= set(snaps), "a version number was reused or lost"
    assert len(acked) > 50, "the writer made too little progress to show anything"


@pytest.mark.slow
def test_a_repair_cut_by_the_leaders_death_is_finished_by_the_next_leader(ha):
    """kill -9 of the leading catalog while it repairs, right after its first copy is stored: the repair's caller
    gets an answer (its call goes on at the new leader) or a clear error; the new leader's repair takes the copies
    the dead one made but never recorded (a target that already stores the partition) instead of failing on them,
    and every partition ends with exactly the replicas it asked for, its data intact, no stray copy on any node."""
    rows = 12_000_000
    big = pa.table({"id": pa.array(np.arange(rows)), "x": pa.array(np.full(rows, 0.5))})
    ha.client.put("r", big, tiling=(24, 1), replicas=2)  # 24 partitions of 8 MB, two copies each on three nodes
    victim = ha.nodes[1]
    victim_ip = victim.uri.removeprefix("grpc://").rsplit(":", 1)[0]

    def locations() -> list[set[str]]:
        live = {n.ip for n in ha.client.nodes() if n.alive}
        return [{ip for ip, _ in p["location"] if ip in live}
                for p in ha.client.open("r").__partitioned__["partitions"].values()]

    lost = sum(victim_ip in {ip for ip, _ in p["location"]}
               for p in ha.client.open("r").__partitioned__["partitions"].values())
    assert lost > 0
    victim.kill()
    wait_until(lambda: any(n.ip == victim_ip and not n.alive for n in ha.client.nodes()), 60, "node marked dead")
    outcome: list = []

    def repair() -> None:
        with fp.connect(ha.uri, timeout=10) as client:
            try:
                outcome.append(client.repair())
            except fp.FlightpartError as exc:
                outcome.append(exc)

    worker = threading.Thread(target=repair)
    worker.start()
    live_dirs = [ha.tmp / f"n{k}" for k in (0, 2)]

    def stored() -> int:
        return sum(len(list(d.glob("datasets/r/v1/*.arrow"))) for d in live_dirs)

    wait_until(lambda: stored() > 48 - lost or outcome, 120, "the first copy stored")
    killed = ha.leader()
    ha.catalogs[killed].kill()
    worker.join(300)
    assert len(outcome) == 1, outcome
    if isinstance(outcome[0], Exception):  # cut: said in one line with its code, not a traceback
        assert outcome[0].code in {"UNAVAILABLE", "TIMEOUT"}, repr(outcome[0])
    else:  # went on at the new leader: nothing is lost while a live node holds each partition
        assert outcome[0]["lost"] == [], outcome[0]
    wait_until(lambda: ha.leader() != killed, 30, "a standby takes over")
    report = ha.client.repair()
    assert report["lost"] == [] and report["failed"] == [], report
    assert all(len(p) == 2 for p in locations()), locations()  # two live copies each: none missing, none extra
    assert stored() == 48  # and no copy stored that the catalog does not list
    assert ha.client.open("r").to_arrow().equals(big)
    assert ha.client.repair() == {"copied": [], "lost": [], "failed": []}  # nothing left to do
