"""A cluster's identity and its version numbers survive any loss; a writer learns the true outcome of its commit.

Each test does what an operator, a crash or an unlucky order of arrivals
would do to real daemons, and asserts what a user then sees.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.local.cluster import LocalCluster
from flightpart.wire import Abort

from helpers import free_port, wait_until

pytestmark = pytest.mark.slow  # catalogs losing their state, nodes away: long fault tests, run by CI in the slow tier


def table_of(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"k": np.arange(rows, dtype=np.int64) + seed * 1_000_000, "x": rng.random(rows)})


def cluster_of(data_dir: Path) -> str | None:
    return json.loads((data_dir / "flightpart-node.json").read_text()).get("cluster")


def restart_on_empty_state(c: LocalCluster) -> None:
    """kill -9 the catalog, lose its state, start it again on the same port."""
    c.catalog.kill()
    shutil.rmtree(c.root / "catalog")
    c.catalog = c.start_catalog()


def live_nodes(client: fp.Client, count: int) -> bool:
    return sum(n.alive for n in client.nodes()) >= count


def test_an_empty_catalog_keeps_the_cluster_whoever_reaches_it_first(new_cluster):
    """A new node and an abort reach a catalog that lost its state before the nodes holding data: no new identity."""
    with new_cluster(2, process=True, heartbeat=0.3, dead_after=2.0, catalog_port=free_port(),
                      rebuild_grace=3.0) as c:
        source = table_of(400, 1)
        with fp.connect(c.uri) as client:
            client.put("kept", source, tiling=(2, 1))
        wait_until(lambda: cluster_of(c.root / f"node-{c.ips[0]}") is not None, 10,
                   "the first node to join its cluster")
        identity = cluster_of(c.root / f"node-{c.ips[0]}")
        for node in c.nodes:
            os.kill(node.pid, signal.SIGSTOP)  # the holders are late
        try:
            restart_on_empty_state(c)
            newcomer = c.add_node(c.ips[2], heartbeat=0.3)
            with fp.connect(c.uri, timeout=5) as client:
                client.call(Abort("kept", 7))
                wait_until(lambda: live_nodes(client, 1), 10, "the new node to register")
        finally:
            for node in c.nodes[:2]:
                os.kill(node.pid, signal.SIGCONT)
        with fp.connect(c.uri) as client:
            wait_until(lambda: live_nodes(client, 3), 20, "every node to register")
            assert client.open("kept").to_arrow().equals(source)
            client.put("after", table_of(90, 2), tiling=(3, 1))  # a write: the identity is settled now
            wait_until(lambda: cluster_of(c.root / f"node-{c.ips[2]}") == identity, 10,
                       "the new node to join the old cluster")
            assert [cluster_of(c.root / f"node-{ip}") for ip in c.ips[:2]] == [identity, identity]
            assert client.versions("kept") == [1]
            assert "refused" not in "".join(n.log() for n in c.nodes[:2]).lower()
        assert newcomer.proc.poll() is None


def test_a_number_dropped_while_a_node_was_away_is_not_handed_out_again_after_state_loss(new_cluster):
    """Drop, lose the catalog's state, put the same name while a node that holds the old version is frozen: the new
    version takes a new number, and when the old node comes back its old rows are never read."""
    with new_cluster(3, process=True, heartbeat=0.3, dead_after=1.5, catalog_port=free_port(),
                      rebuild_grace=2.0) as c:
        old, new = table_of(900, 3), table_of(900, 4)
        away = c.nodes[2]
        with fp.connect(c.uri) as client:
            client.put("t", old, tiling=(3, 1))
            os.kill(away.pid, signal.SIGSTOP)
            try:
                client.drop("t")
                restart_on_empty_state(c)
            except BaseException:
                os.kill(away.pid, signal.SIGCONT)
                raise
        with fp.connect(c.uri) as client:
            try:
                wait_until(lambda: live_nodes(client, 2), 20, "the live nodes to register")
                put = client.put("t", new, tiling=(2, 1), nodes=[n.uri for n in c.nodes[:2]])
                assert put.version == 2, "a version number that was dropped was handed out again"
            finally:
                os.kill(away.pid, signal.SIGCONT)
            wait_until(lambda: live_nodes(client, 3), 20, "the away node to register again")
            wait_until(lambda: not list((c.root / f"node-{c.ips[2]}").glob("datasets/t/v1/*.arrow")), 20,
                       "the away node to delete the dropped version")
            for _ in range(3):
                read = client.open("t").to_arrow()
                assert read.equals(new), "a read mixed rows of the dropped version into the new one"
            assert client.versions("t") == [2]
            assert fp.connect(c.uri).open("t").__partitioned__["shape"] == (900, 2)


def test_a_put_that_outlives_its_pending_ttl_is_told_version_expired_and_leaves_nothing(new_cluster):
    with new_cluster(2, process=True, heartbeat=0.3, dead_after=2.0,
                      extra_args=["--pending-ttl", "2"]) as c:
        schema = pa.schema([("k", pa.int64())])

        def slow():
            for k in range(10):
                time.sleep(0.6)
                yield pa.record_batch([pa.array(np.arange(100, dtype=np.int64) + 100 * k)], schema=schema)

        with fp.connect(c.uri) as client:
            with pytest.raises(fp.VersionExpired) as info:
                client.put("late", pa.RecordBatchReader.from_batches(schema, slow()), rows_per_partition=100)
            assert "pending-ttl" in str(info.value)
            assert client.versions("late") == []
        wait_until(lambda: not list(c.root.glob("node-*/datasets/late/v*/*.arrow")), 10,
                   "the nodes to delete what arrived late")


def paused_catalog(c: LocalCluster, step: str) -> None:
    """Restart the catalog (same port and state) so that it pauses at ``step`` (``BEFORE``/``AFTER``) of every
    commit."""
    c.catalog.stop()
    c.env = {f"FLIGHTPART_TEST_PAUSE_{step}_COMMIT": "30"}
    try:
        c.catalog = c.start_catalog()
    finally:
        c.env = None


def kill_in_commit(c: LocalCluster, write) -> dict:
    """Run ``write()`` in a thread, kill -9 the catalog once it paused in the commit, restart it; the writer's
    answer."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["version"] = write()
        except fp.FlightpartError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: "a test hook" in c.catalog.log() or not thread.is_alive(), 60, "the commit to reach the pause")
    assert thread.is_alive(), f"the write ended before its commit: {outcome}\n{c.catalog.log()[-3000:]}"
    c.catalog.kill()
    c.catalog = c.start_catalog()
    thread.join(120)
    assert not thread.is_alive(), "the writer never returned"
    return outcome


@pytest.mark.slow
def test_a_writer_learns_the_true_outcome_of_a_commit_the_catalog_died_in(new_cluster):
    """kill -9 the catalog just before and just after its database commit, for puts and appends: the writer's answer
    agrees with what is published, and a version committed just before the crash is sealed on its nodes later."""
    with new_cluster(3, process=True, heartbeat=0.3, dead_after=3.0, catalog_port=free_port()) as c:
        with fp.connect(c.uri) as client:
            client.put("grown", table_of(300, 5), tiling=(3, 1))
        for k, (step, kind) in enumerate([("BEFORE", "put"), ("AFTER", "put"), ("BEFORE", "append"),
                                          ("AFTER", "append")]):
            name = f"k{k}" if kind == "put" else "grown"
            with fp.connect(c.uri) as client:
                before = client.versions(name)
            paused_catalog(c, step)

            def write(kind=kind, name=name, k=k):
                with fp.connect(c.uri, timeout=10) as writer:
                    data = table_of(3000, 10 + k)
                    return (writer.put(name, data, tiling=(6, 1)) if kind == "put"
                            else writer.append(name, data)).version

            outcome = kill_in_commit(c, write)
            with fp.connect(c.uri) as client:
                published = [v for v in client.versions(name) if v not in before]
                if step == "AFTER":
                    assert "version" in outcome, f"{kind}: told {outcome.get('error')!r} for a published version"
                    assert published == [outcome["version"]]
                    holders = list(c.root.glob(f"node-*/datasets/{name}/v{outcome['version']}"))
                    wait_until(lambda holders=holders: all((h / "manifest.json").exists() for h in holders), 20,
                               "every holder to be sealed once it registers again")
                else:
                    assert "error" in outcome and published == [], f"{kind}: told {outcome}, published {published}"


def test_a_version_committed_just_before_the_catalog_and_its_state_were_lost_is_never_deleted(new_cluster):
    """The catalog dies between its database commit and the seal, its writer dies too, and its state is lost: the
    rebuilt catalog cannot know the version was committed, so it keeps its files (no pending TTL deletes them)."""
    with new_cluster(2, process=True, heartbeat=0.3, dead_after=2.0, catalog_port=free_port(),
                      extra_args=["--pending-ttl", "1"], rebuild_grace=1.0) as c:
        paused_catalog(c, "AFTER")
        writer = subprocess.Popen([sys.executable, "-c", WRITER, c.uri], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: "a test hook" in c.catalog.log(), 60, "the commit to reach the pause")
        finally:
            writer.kill()
            writer.wait()
        files = sorted(c.root.glob("node-*/datasets/kept/v1/*.arrow"))
        assert len(files) == 4
        restart_on_empty_state(c)
        with fp.connect(c.uri) as client:
            wait_until(lambda: live_nodes(client, 2), 20, "the nodes to register")
            client.put("other", table_of(10, 1))  # the catalog runs its TTL sweeps meanwhile
            deadline = time.monotonic() + 4  # four pending TTLs
            while time.monotonic() < deadline:
                assert sorted(c.root.glob("node-*/datasets/kept/v1/*.arrow")) == files
                time.sleep(0.5)
            assert client.put("kept", table_of(10, 2)).version == 2  # and its number is not handed out again


WRITER = """
import sys
import numpy as np
import pyarrow as pa
import flightpart as fp
with fp.connect(sys.argv[1], timeout=60) as client:
    client.put("kept", pa.table({"k": np.arange(4000)}), tiling=(4, 1))
"""
