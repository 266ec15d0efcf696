"""Nothing lost, nothing corrupt: each promise of docs/operations/promises.md attacked with real daemons.

Readers that might crash run in subprocesses, and the tests check they were
not killed by a signal.
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
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart.io.layout import MANIFEST

from helpers import code_of, finished_within, free_port, put_raw, wait_until

TESTS = Path(__file__).resolve().parent


def table_of(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(rows), "x": rng.random(rows), "s": pa.array([f"r{k % 97}" for k in range(rows)])})


def data_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.arrow") if "node-" in str(p))


def deleted_maps(pid: int, under: Path) -> list[str]:
    """Memory maps of process ``pid`` onto deleted files below ``under``."""
    with open(f"/proc/{pid}/maps") as maps:
        return [line for line in maps if str(under) in line and "(deleted)" in line]


def map_count(pid: int) -> int:
    with open(f"/proc/{pid}/maps") as maps:
        return sum(1 for _ in maps)


@pytest.fixture
def cluster(new_cluster):
    with new_cluster(3, process=True, heartbeat=0.3, dead_after=1.5, catalog_port=free_port()) as c:
        yield c


# --------------------------------------------------------------------------- the catalog is rebuildable


@pytest.mark.slow  # kills the catalog and waits for the rebuild: in the slow tier, which CI runs
def test_a_catalog_that_lost_its_state_rebuilds_it_and_no_node_deletes_anything(cluster):
    c = cluster
    first, second, other = table_of(4000, 1), table_of(3000, 2), table_of(900, 3)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put("keep", first, tiling=(4, 1))
        client.put("keep", second, tiling=(4, 1))
        client.put("other", other, tiling=(3, 1), replicas=2)
        old_reader = client.open("keep", 1)
    files = data_files(c.root)
    c.catalog.kill()
    shutil.rmtree(c.root / "catalog")  # the disk under the catalog's state is lost
    c.catalog = c.start_catalog()
    with fp.connect(c.uri, host="127.0.0.99") as client:
        wait_until(lambda: client.versions("keep") == [1, 2] and client.versions("other") == [1], 20,
                   "the catalog to rebuild")
        time.sleep(1.0)  # several more heartbeat rounds: still nothing is deleted
        assert data_files(c.root) == files
        assert client.open("keep").to_arrow().equals(second)
        assert client.open("keep", 1).to_arrow().equals(first)
        assert client.open("other").to_arrow().equals(other)
        assert len(client.open("other").__partitioned__["partitions"][(0, 0)]["location"]) == 2  # both replicas known
        third = client.put("keep", table_of(10, 4))
        assert third.version == 3  # version numbers are never reused
        assert old_reader.to_arrow().equals(first)  # a reader holding v1 still reads v1's rows
        client.drop("keep", 1)  # the rebuilt catalog is of the same cluster: the nodes obey it
        assert not any("keep/v1/" in f for f in data_files(c.root))
        assert client.open("keep", 2).to_arrow().equals(second)


@pytest.mark.slow  # a long fault test: behind the marker CI still runs
def test_a_version_number_handed_out_again_never_overwrites_a_committed_one(cluster):
    """The catalog loses its state and hands out v1 before the nodes re-register: the put takes the next number."""
    c = cluster
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put("early", table_of(600, 5), tiling=(3, 1))
    for node in c.nodes:
        os.kill(node.pid, signal.SIGSTOP)  # the nodes cannot re-register yet
    c.catalog.kill()
    shutil.rmtree(c.root / "catalog")
    c.catalog = c.start_catalog()
    for node in c.nodes:
        os.kill(node.pid, signal.SIGCONT)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        wait_until(lambda: sum(n.alive for n in client.nodes()) == 3, 20, "the nodes to register")
        ds = client.put("early", table_of(700, 6), tiling=(3, 1))
        assert ds.version >= 2
        assert client.open("early", 1).to_arrow().equals(table_of(600, 5))


def test_a_node_obeys_only_the_catalog_of_its_own_cluster(cluster):
    c = cluster
    with fp.connect(c.uri) as client:
        client.put("mine", table_of(300, 7), tiling=(3, 1))
    files = data_files(c.root)
    node = flight.connect(c.nodes[0].uri)
    for order in ({"dataset": "mine", "version": 1, "cluster": "someone-else"}, {"dataset": "mine", "version": 1}):
        with pytest.raises(flight.FlightError) as info:
            list(node.do_action(flight.Action("drop", json.dumps(order).encode())))
        assert code_of(info.value) == "FOREIGN_CLUSTER"
    assert data_files(c.root) == files
    marker = json.loads((c.root / f"node-{c.ips[0]}" / "flightpart-node.json").read_text())
    catalog = flight.connect(c.uri)
    body = {"node_id": "intruder", "uri": "grpc://127.0.0.9:1", "ip": "127.0.0.9", "pid": 1, "cluster": "another"}
    with pytest.raises(flight.FlightError) as info:
        list(catalog.do_action(flight.Action("register-node", json.dumps(body).encode())))
    assert code_of(info.value) == "FOREIGN_CLUSTER" and marker["cluster"]


@pytest.mark.slow  # waits out a pending TTL: a long fault test, in the slow tier CI runs
def test_a_put_the_catalog_never_saw_finish_expires_by_the_pending_ttl(new_cluster):
    with new_cluster(2, process=True, heartbeat=0.3, dead_after=1.5, catalog_port=free_port(),
                      extra_args=["--pending-ttl", "3"]) as c:
        with fp.connect(c.uri) as client:
            version = client.call(fp.wire.Begin("half")).version
            for k in range(20):  # a put of 20 partitions, cut short when the catalog dies
                put_raw(c.nodes[k % 2].uri, ["half", str(version), str(k), "0"], table_of(50, k))
            c.catalog.kill()
        assert len([f for f in data_files(c.root) if "/half/" in f]) == 20
        c.catalog = c.start_catalog()
        with fp.connect(c.uri) as client:
            wait_until(lambda: not [f for f in data_files(c.root) if "/half/" in f], 30,
                       "the pending version to expire")
            assert client.versions("half") == []
            assert client.put("half", table_of(10)).version > version


# --------------------------------------------------------------------------- what is received is valid


SENDER = """
import json, os, sys
sys.path.insert(0, sys.argv[3])
import pyarrow as pa
import ipc_mutations as m
if sys.argv[2] == "fuzz":
    batches = m.mutations(int(sys.argv[4]), int(sys.argv[5]))
else:
    batches = [(sys.argv[2], {"rows": m.lying_row_count, "strings": m.bad_string_offsets}[sys.argv[2]]())]
for k, (kind, batch) in enumerate(batches):
    path = ["fuzz", "1", str(k), "0"] if sys.argv[2] == "fuzz" else [sys.argv[2], "1", "0", "0"]
    child = os.fork()  # writing a lying batch may crash the writer itself: each put in a process of its own
    if child == 0:
        import pyarrow.flight as flight
        outcome = {"k": k, "kind": kind}
        try:
            writer, _ = flight.connect(sys.argv[1]).do_put(flight.FlightDescriptor.for_path(*path), batch.schema)
            writer.write_batch(batch)
            writer.write_metadata(pa.py_buffer(json.dumps({"rows": batch.num_rows}).encode()))
            writer.close()
            outcome["stored"] = True
        except flight.FlightError as exc:
            outcome["error"] = str(exc).split(". Detail")[0][:200]
            outcome["extra_info"] = (exc.extra_info or b"").decode(errors="replace")
            outcome["status"] = type(exc).__name__
        print(json.dumps(outcome), flush=True)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        print(json.dumps({"k": k, "kind": kind, "sender_crashed": os.WTERMSIG(status)}), flush=True)
"""

READER = """
import sys
import pyarrow as pa, pyarrow.compute as pc, pyarrow.flight as flight, pyarrow.ipc as ipc
from pathlib import Path
root, uri = Path(sys.argv[1]), sys.argv[2]
node = flight.connect(uri)
for path in sorted(root.rglob("*.arrow")):
    with pa.memory_map(str(path)) as source:
        table = ipc.open_file(source).read_all()
    table.validate(full=True)
    for column in table.columns:
        column.to_pylist()                      # touch every value through the map
    name, version = path.relative_to(root).parts[:2]   # <name>/v<version>/<i>_<j>.arrow
    i, j = path.stem.split("_")
    ticket = '{"dataset": "%s", "version": %s, "part": [%s, %s]}' % (name, version[1:], i, j)
    streamed = node.do_get(flight.Ticket(ticket.encode())).read_all()
    assert streamed.equals(table)
    for column in streamed.columns:
        column.to_pylist()
print("read", len(list(root.rglob("*.arrow"))))
"""


def send(node_uri: str, *args: str) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", SENDER, node_uri, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the sender died ({proc.returncode}): {proc.stderr[-2000:]}"
    return [json.loads(line) for line in proc.stdout.splitlines()]


def read_everything(node_dir: Path, node_uri: str) -> str:
    proc = subprocess.run([sys.executable, "-c", READER, str(node_dir / "datasets"), node_uri], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode >= 0, f"a reader was killed by signal {-proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def lone_node(make_cluster):
    with make_cluster(1, process=True, node_args=["--max-partition-bytes", "1000000"]) as c:
        yield c


@pytest.mark.parametrize("lie", ["rows", "strings"])
def test_a_lying_batch_is_refused_and_nothing_is_stored(lone_node, lie):
    (outcome,) = send(lone_node.nodes[0].uri, lie, str(TESTS))
    assert "stored" not in outcome, outcome
    assert json.loads(outcome["extra_info"])["code"] == "INVALID_REQUEST" and "invalid record batch" in outcome["error"]
    node_dir = lone_node.root / f"node-{lone_node.ips[0]}"
    assert not (node_dir / "datasets" / lie).exists()  # no file, no empty folder
    assert lone_node.nodes[0].proc.poll() is None


def test_a_put_without_its_trailer_or_over_the_limit_leaves_nothing(lone_node):
    node_uri = lone_node.nodes[0].uri
    node = flight.connect(node_uri)
    table = pa.table({"a": np.arange(100_000)})
    writer, _ = node.do_put(flight.FlightDescriptor.for_path("untrailed", "1", "0", "0"), table.schema)
    with pytest.raises(flight.FlightError, match="ended without its trailer") as info:
        writer.write_table(table.slice(0, 10_000))  # a sender that stops early and closes without the trailer
        writer.close()
    assert code_of(info.value) == "INVALID_REQUEST"
    big = pa.table({"a": np.arange(4_000_000)})  # one 32 MB batch against a 1 MB limit
    writer, _ = node.do_put(flight.FlightDescriptor.for_path("oversized", "1", "0", "0"), big.schema)
    with pytest.raises(flight.FlightError, match="more than the node's limit") as info:
        writer.write_table(big, max_chunksize=big.num_rows)
        writer.close()
    assert code_of(info.value) == "LIMIT_EXCEEDED"
    datasets = lone_node.root / f"node-{lone_node.ips[0]}" / "datasets"
    assert not (datasets / "untrailed").exists() and not (datasets / "oversized").exists()  # no file, no empty folder
    assert lone_node.nodes[0].proc.poll() is None


@pytest.mark.slow
def test_fuzzed_put_streams_store_only_valid_partitions_and_crash_nothing(lone_node):
    node_uri = lone_node.nodes[0].uri
    outcomes = send(node_uri, "fuzz", str(TESTS), "12345", "400")
    assert len(outcomes) == 400
    assert lone_node.nodes[0].proc.poll() is None, "the node died"
    # some lies crash the sending writer, or make its transport refuse them, before they leave
    sent = [o for o in outcomes if "sender_crashed" not in o
            and not (o.get("status") == "FlightUnavailableError" and not o.get("extra_info"))]
    stored = [o for o in sent if o.get("stored")]
    refused = [o for o in sent if not o.get("stored")]
    assert len(sent) > 200
    assert stored and refused  # the fuzz did both: valid mutations are kept, invalid ones refused
    for o in refused:
        assert json.loads(o["extra_info"])["code"] in ("INVALID_REQUEST", "SCHEMA_MISMATCH", "LIMIT_EXCEEDED"), o
    assert "read" in read_everything(lone_node.root / f"node-{lone_node.ips[0]}", node_uri)


def test_a_committed_version_never_changes(cluster):
    c = cluster
    table = table_of(100_000, 8)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        ds = client.put("frozen", table, tiling=(3, 1))
        holder = ds.__partitioned__["partitions"][(0, 0)]["data"].replicas[0][0]
        for path in (["frozen", "1", "0", "0"], ["frozen", "1", "7", "0"]):  # overwrite one, add one
            with pytest.raises(flight.FlightError) as info:
                put_raw(holder, path, table_of(10, 9))
            assert code_of(info.value) == "VERSION_CONFLICT"
        assert client.open("frozen").to_arrow().equals(table)
        for node_dir in c.root.glob("node-*/datasets/frozen/v1"):
            assert (node_dir / MANIFEST).exists()  # sealed on every holder


def test_a_holder_that_missed_the_seal_gets_it_when_it_registers_again(cluster):
    c = cluster
    with fp.connect(c.uri, host="127.0.0.99") as client:
        ds = client.put("late-seal", table_of(900, 30), tiling=(3, 1))
        node_dir = c.root / f"node-{c.ips[1]}"
        manifest = node_dir / "datasets" / "late-seal" / "v1" / MANIFEST
        manifest.unlink()  # as if the seal never reached this node (it was down when the catalog committed)
        victim = next(n for n in c.nodes if f"//{c.ips[1]}:" in n.uri)
        victim.kill()
        c.nodes.remove(victim)
        c.add_node(c.ips[1], heartbeat=0.3, data_dir=node_dir)
        wait_until(manifest.exists, 20, "the catalog to seal the version again at registration")
        holder = next(n.uri for n in c.nodes if f"//{c.ips[1]}:" in n.uri)
        with pytest.raises(flight.FlightError) as info:
            put_raw(holder, ["late-seal", "1", "7", "0"], table_of(5, 31))  # refused only because the version is sealed
        assert code_of(info.value) == "VERSION_CONFLICT"
        assert ds.version == 1 and client.open("late-seal").to_arrow().equals(table_of(900, 30))


# --------------------------------------------------------------------------- drop is final


def test_once_drop_returns_no_node_serves_the_version_and_maps_are_released(cluster):
    c = cluster
    with fp.connect(c.uri, host=c.ips[0]) as client:  # on node 1's host: its partitions are mapped here too
        ds = client.put("gone", table_of(60_000, 10), tiling=(12, 1))
        refs = [p["data"] for p in ds.__partitioned__["partitions"].values()]
        stop = threading.Event()
        errors: list[BaseException] = []

        def read_forever() -> None:
            raw = [flight.connect(n.uri) for n in c.nodes]
            while not stop.is_set():
                for ref in refs:
                    try:
                        raw[[n.uri for n in c.nodes].index(ref.replicas[0][0])].do_get(ref.ticket()).read_all()
                    except flight.FlightError:
                        pass
                    except BaseException as exc:  # pragma: no cover
                        errors.append(exc)

        readers = [threading.Thread(target=read_forever) for _ in range(4)]
        for t in readers:
            t.start()
        served, refused = 0, []
        try:
            time.sleep(0.5)
            assert ds.to_arrow().num_rows == 60_000
            client.drop("gone")
            for ref in refs:  # right after drop returns
                try:
                    flight.connect(ref.replicas[0][0]).do_get(ref.ticket()).read_all()
                    served += 1
                except flight.FlightError as exc:
                    refused.append((code_of(exc), str(exc)))
        finally:
            stop.set()
            for t in readers:
                t.join()
        assert served == 0 and errors == []
        # each node says the version was dropped (its tombstone), not merely that it does not hold the partition
        assert all(code == "DATASET_NOT_FOUND" and "was dropped" in text for code, text in refused), refused[:2]
        for node in c.nodes:
            wait_until(lambda node=node: not deleted_maps(node.pid, c.root), 10,
                       "the node to release maps of dropped files")
        assert deleted_maps(os.getpid(), c.root) == []
        assert not list(c.root.glob("node-*/datasets/gone/v*"))  # no version is left, only what remembers it is gone
        assert len(list(c.root.glob("node-*/datasets/gone/tombstones.json"))) == len(c.nodes)


# --------------------------------------------------------------------------- deadlines and failover


@pytest.mark.slow  # a fault test bound by a deadline: in the slow tier, which CI runs
def test_a_frozen_first_replica_hands_over_within_the_idle_timeout(cluster):
    c = cluster
    table = table_of(200_000, 11)
    with fp.connect(c.uri, host="127.0.0.99", idle_timeout=1.0, timeout=600) as client:
        ds = client.put("frozen-read", table, tiling=(3, 1), replicas=2)
        firsts = {p["data"].replicas[0][0] for p in ds.__partitioned__["partitions"].values()}
        victim = next(n for n in c.nodes if n.uri in firsts)
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            outcome = finished_within(ds.to_arrow, 60)
        finally:
            os.kill(victim.pid, signal.SIGCONT)
    assert outcome, "the read waited on the frozen replica, not its idle timeout"
    assert "error" not in outcome and outcome["value"].equals(table), outcome.get("error")


@pytest.mark.slow  # a fault test bound by a deadline: in the slow tier, which CI runs
def test_a_put_to_a_frozen_node_fails_clearly_in_bounded_time(cluster):
    c = cluster
    victim = c.nodes[1]
    with fp.connect(c.uri, timeout=3.0) as client:
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            outcome = finished_within(lambda: client.put("stuck", table_of(400_000, 12), tiling=(1, 1),
                                                         nodes=[c.ips[1]]), 120)
        finally:
            os.kill(victim.pid, signal.SIGCONT)
        assert outcome, "the put to a frozen node outlived its timeout"
        assert isinstance(outcome.get("error"), fp.NodeUnavailable), outcome
        assert client.put("unstuck", table_of(100, 13)).to_arrow().num_rows == 100


def test_every_node_serves_first_for_some_partitions_and_small_puts_spread(cluster):
    c = cluster
    with fp.connect(c.uri) as client:
        ds = client.put("spread", table_of(6000, 14), tiling=(6, 1), replicas=2)
        firsts = [p["data"].replicas[0][0] for p in ds.__partitioned__["partitions"].values()]
        assert {n.uri for n in c.nodes} == set(firsts)
        placed = [client.put(f"small-{k}", table_of(5, k),
                             tiling=(1, 1)).__partitioned__["partitions"][(0, 0)]["location"][0][0]
                  for k in range(60)]
    counts = {ip: placed.count(ip) for ip in set(placed)}
    assert len(counts) == 3 and min(counts.values()) >= 5, counts


# --------------------------------------------------------------------------- back-pressure


@pytest.mark.slow
def test_sixty_four_readers_see_no_failure_at_the_stream_limit(new_cluster):
    """64 readers x 20 reads against nodes that take one stream at a time: busy answers, zero failures."""
    with new_cluster(3, process=True, node_args=["--max-streams", "1"]) as c:
        table = table_of(120_000, 15)
        with fp.connect(c.uri, host="127.0.0.99") as client:
            client.put("busy", table, tiling=(6, 1))
        failures: list[BaseException] = []
        refused_before = sum(fp.connect(c.uri).stats(n.uri).values["refused_calls"] for n in c.nodes)

        def reader() -> None:
            with fp.connect(c.uri, host="127.0.0.99") as client:
                ds = client.open("busy")
                for _ in range(20):
                    try:
                        assert ds.to_arrow().equals(table)
                    except BaseException as exc:
                        failures.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        refused = sum(fp.connect(c.uri).stats(n.uri).values["refused_calls"] for n in c.nodes) - refused_before
        assert refused > 0  # the limit was reached, and the clients backed off instead of failing


# --------------------------------------------------------------------------- bounded resources


@pytest.mark.slow
def test_node_maps_and_descriptors_stay_flat_over_ten_thousand_puts(new_cluster):
    with new_cluster(1, process=True) as c:
        node = c.nodes[0]
        raw = flight.connect(node.uri)
        small = pa.table({"a": np.arange(4)})

        def round_of(start: int, count: int) -> None:
            for k in range(start, start + count):
                put_raw(raw, ["many", "1", str(k), "0"], small)
                raw.do_get(flight.Ticket(json.dumps({"dataset": "many", "version": 1,
                                                     "part": [k, 0]}).encode())).read_all()

        round_of(0, 500)
        maps_before, fds_before = map_count(node.pid), len(os.listdir(f"/proc/{node.pid}/fd"))
        round_of(500, 9500)
        maps_after, fds_after = map_count(node.pid), len(os.listdir(f"/proc/{node.pid}/fd"))
        assert maps_after < maps_before + 300, (maps_before, maps_after)
        assert fds_after < fds_before + 50, (fds_before, fds_after)
        assert json.loads(list(raw.do_action(flight.Action("stats", b"")))[0].body.to_pybytes())["maps_open"] <= 256


# --------------------------------------------------------------------------- one node, one identity


def test_a_copied_data_directory_cannot_take_over_a_live_node(cluster):
    c = cluster
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put("original", table_of(900, 16), tiling=(3, 1))
        copy = c.root / "copied"
        shutil.copytree(c.root / f"node-{c.ips[0]}", copy)
        with pytest.raises(RuntimeError, match="already served by") as info:
            c.add_node(c.ips[3], data_dir=copy)
        assert "flightpart-node.json" in str(info.value)  # and what to do about it
        assert sorted(n.ip for n in client.nodes()) == c.ips[:3]
        assert client.open("original").to_arrow().equals(table_of(900, 16))
        assert client.put("after", table_of(30, 17)).to_arrow().num_rows == 30


# --------------------------------------------------------------------------- a full disk


@pytest.mark.slow  # a fault test on a tmpfs filled to the brim: in the slow tier, which CI runs
def test_a_full_disk_is_an_operational_state(small_disk, new_cluster):
    from flightpart.server.health import probe

    floor = 16 << 20
    with new_cluster(1, process=True, heartbeat=0.3,
                      node_args=["--min-free-bytes", str(floor)]) as c:
        small = c.add_node(c.ips[1], heartbeat=0.3, data_dir=small_disk / "node", args=["--health-port", "0"])
        health = small.uris["node-health"]
        with fp.connect(c.uri, host="127.0.0.99") as client:
            wait_until(lambda: sum(n.alive for n in client.nodes()) == 2, 20, "both nodes")
            old = table_of(5000, 20)
            client.put("old", old, tiling=(1, 1), nodes=[c.ips[1]])
            assert probe(health) == "SERVING"
            full = None
            for k in range(12):  # 8 MB each into 64 MB
                try:
                    client.put(f"filler-{k}", pa.table({"x": np.random.default_rng(k).random(1 << 20)}), tiling=(1, 1),
                               nodes=[c.ips[1]])
                except fp.StorageFull as exc:
                    full = exc
                    break
            assert full is not None and "disk full" in str(full) and "Traceback" not in str(full)
            assert client.stats(small.uri).values["storage_full_refusals"] >= 1
            assert "the disk is full" in small.log()
            wait_until(lambda: probe(health) == "NOT_SERVING", 5, "health to report the floor crossed")
            assert client.open("old").to_arrow().equals(old)  # what it holds is still served
            wait_until(lambda: [n.low_space for n in client.nodes() if n.ip == c.ips[1]] == [True], 10,
                       "the node to report low space")
            placed = client.put("elsewhere", table_of(100, 21), tiling=(1, 1))
            assert placed.__partitioned__["partitions"][(0, 0)]["location"][0][0] == c.ips[0]  # placement avoids it
            assert not list((small_disk / "node").rglob(".tmp-*"))  # no debris of the refused put
            for k in range(12):
                if f"filler-{k}" in {d.name for d in client.list()}:
                    client.drop(f"filler-{k}")
            wait_until(lambda: probe(health) == "SERVING", 10, "health to return once space is back")
            assert client.put("again", table_of(100, 22), tiling=(1, 1),
                              nodes=[c.ips[1]]).to_arrow().num_rows == 100


@pytest.mark.parametrize("nesting", ["plain", "list", "struct"])
def test_a_decimal_past_its_precision_that_arrow_lets_through_is_refused_and_nothing_is_stored(lone_node, nesting):
    """decimal128's most negative number fits no precision, yet passes Arrow's full validation, at any depth; stored,
    it came back from SQL as DuckDB failing inside itself (with its native stack trace) and invalidating its
    database, and so did a list or a struct holding it."""
    floor = (-(1 << 127)).to_bytes(16, "little", signed=True)
    values = pa.Array.from_buffers(pa.decimal128(38, 0), 2, [None, pa.py_buffer((1).to_bytes(16, "little") + floor)])
    if nesting == "list":
        values = pa.ListArray.from_arrays(pa.array([0, 1, 2], pa.int32()), values)
    elif nesting == "struct":
        values = pa.StructArray.from_arrays([values], ["amount"])
    values.validate(full=True)  # what Arrow alone says
    node = flight.connect(lone_node.nodes[0].uri)
    table = pa.table({"k": [1, 2], "v": values})
    writer, _ = node.do_put(flight.FlightDescriptor.for_path("floor", "1", "0", "0"), table.schema)
    with pytest.raises(flight.FlightError, match="most negative number") as info:
        writer.write_table(table)
        writer.done_writing()
        writer.close()
    assert code_of(info.value) == "INVALID_REQUEST"
    assert not (lone_node.root / f"node-{lone_node.ips[0]}" / "datasets" / "floor").exists()  # no file, no empty folder
    assert lone_node.nodes[0].proc.poll() is None


def test_string_views_are_sent_and_stored_at_their_own_size_by_a_client_or_a_plain_writer(cluster):
    """A table of string views (Polars' newest Arrow, DuckDB's with ``produce_arrow_string_view``) was put as
    slices that each carried every string of the table: 16 MB became a 1.9 GB file. A plain writer's single 16 MB
    batch, cut by the node into 1 MiB batches, did the same to the node's disk."""
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame({"name": [f"customer-{i:08d}-" + "x" * 40 for i in range(200_000)], "n": range(200_000)})
    table = frame.to_arrow(compat_level=pl.CompatLevel.newest())
    assert table.schema.field("name").type == pa.string_view()
    with fp.connect(cluster.uri, host="127.0.0.99") as client:
        ds = client.put("viewed", table, tiling=(2, 1))
        back = client.open("viewed").to_arrow()
        assert back.schema == table.schema and back.equals(table) and pl.from_arrow(back).equals(frame)
        holder = ds.__partitioned__["partitions"][(0, 0)]["data"].replicas[0][0]
        put_raw(holder, ["viewed-plainly", "1", "0", "0"], table.combine_chunks())  # one batch of every row
    stored = sum(f.stat().st_size for f in cluster.root.glob("node-*/datasets/viewed/v1/*.arrow"))
    assert stored < 1.2 * table.nbytes, (stored, table.nbytes)
    (plainly,) = cluster.root.glob("node-*/datasets/viewed-plainly/v1/0_0.arrow")
    assert plainly.stat().st_size < 1.2 * table.nbytes, (plainly.stat().st_size, table.nbytes)
    with pa.memory_map(str(plainly)) as source:
        assert pa.ipc.open_file(source).read_all().equals(table)


def test_a_plain_writers_put_with_a_column_named_twice_is_refused_and_nothing_is_stored(lone_node):
    """Stored, such a partition could never be read: every read selects columns by name (the node logged a KeyError
    and readers were told no replica could serve it)."""
    twice = pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=["d", "d"])
    with pytest.raises(flight.FlightError, match="'d' is named twice") as info:
        put_raw(lone_node.nodes[0].uri, ["twice", "1", "0", "0"], twice)
    assert code_of(info.value) == "SCHEMA_MISMATCH"
    assert not (lone_node.root / f"node-{lone_node.ips[0]}" / "datasets" / "twice").exists()
    assert lone_node.nodes[0].proc.poll() is None
