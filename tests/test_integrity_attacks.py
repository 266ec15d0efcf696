"""Integrity attacked with real daemons: flipped bits on disk, files deleted under a running node, a disk gone
read-only.

Each stored partition carries the CRC-32 of its bytes as written; a node
checks a file before its first use and scrubs them all in the background.
Readers that might crash run in subprocesses, and the tests check they were
not killed by a signal.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart.client.fetch import FlightGet
from flightpart.io import layout
from flightpart.local.cluster import LocalCluster
from flightpart.wire import SCRUB_DEADLINE, Abort, Begin, ListNodes, PartHeader, PutTrailer, ScrubCluster, Ticket

from helpers import code_of, finished_within, free_port, wait_until


def table_of(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(rows), "x": rng.random(rows), "s": pa.array([f"r{k % 97}" for k in range(rows)])})


@pytest.fixture(scope="module")
def cluster(make_cluster):
    """Three nodes whose background scrub is off, so each test decides when damage is found."""
    with make_cluster(3, process=True, heartbeat=0.3,
                      node_args=["--scrub-interval", "0"]) as c:
        yield c


def holders(c: LocalCluster, name: str, part: tuple[int, int], version: int = 1) -> list[tuple[str, Path]]:
    """(node uri, file) of every replica of a partition on disk."""
    rel = layout.partition_relpath(name, version, part)
    return [(n.uri, c.root / f"node-{ip}" / rel) for n, ip in zip(c.nodes, c.ips)
            if (c.root / f"node-{ip}" / rel).exists()]


def listed(client, name: str, part: tuple[int, int]) -> set[str]:
    """The node uris the catalog lists for a partition now."""
    ref = client.open(name).__partitioned__["partitions"][part]["data"]
    return {uri for uri, _ip, _pid in ref.replicas}


def flip_bit(path: Path, offset: int) -> None:
    """Rot one bit in place, mtime kept: what a failing disk does, unseen by a stat."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def data_offset(path: Path) -> int:
    return path.stat().st_size // 2  # inside the record batches' buffers (the footer is at the end)


def footer_offset(path: Path) -> int:
    raw = path.read_bytes()
    footer_len = int.from_bytes(raw[-10:-6], "little")
    return len(raw) - 10 - footer_len // 2


def raw_get(uri: str, name: str, part: tuple[int, int]) -> pa.Table:
    return flight.connect(uri).do_get(flight.Ticket(Ticket(name, 1, part).encode())).read_all()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightpart", *args], capture_output=True, text=True, timeout=300)


def quarantined(c: LocalCluster, name: str) -> list[Path]:
    return sorted(c.root.glob(f"node-*/{layout.QUARANTINE}/{name}/v1/*.arrow.*"))


def test_a_flipped_bit_in_the_data_is_refused_unlisted_and_read_from_the_other_replica(cluster):
    c = cluster
    table = table_of(40_000, 1)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put("rot", table, tiling=(2, 1), replicas=2)
        (bad_uri, bad_file), (good_uri, _) = holders(c, "rot", (0, 0))
        flip_bit(bad_file, data_offset(bad_file))
        with pytest.raises(flight.FlightError) as info:
            raw_get(bad_uri, "rot", (0, 0))
        assert code_of(info.value) == "PARTITION_DAMAGED"
        assert not bad_file.exists() and len(quarantined(c, "rot")) == 1  # moved aside, not deleted
        wait_until(lambda: listed(client, "rot", (0, 0)) == {good_uri}, 60,
                   "the catalog to stop listing the damaged replica")
        assert client.open("rot").to_arrow().equals(table)
        other = [part for part in ((1, 0),) if bad_uri in {u for u, _f in holders(c, "rot", part)}]
        for part in other:  # the node goes on serving what is intact
            assert raw_get(bad_uri, "rot", part).num_rows == 20_000


def test_a_reader_given_the_damaged_replica_first_moves_on_to_the_next(cluster):
    c = cluster
    table = table_of(40_000, 9)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put("rot-first", table, tiling=(2, 1), replicas=2)
        ref = client.open("rot-first").__partitioned__["partitions"][(1, 0)]["data"]
        (bad_uri, bad_file), _good = holders(c, "rot-first", (1, 0))
        flip_bit(bad_file, data_offset(bad_file))
        damaged_first = dataclasses.replace(ref, replicas=tuple(sorted(ref.replicas, key=lambda r: r[0] != bad_uri)))
        assert damaged_first.replicas[0][0] == bad_uri
        assert FlightGet(host="127.0.0.99")(damaged_first).equals(table.slice(20_000))
        assert len(quarantined(c, "rot-first")) == 1


def test_a_reader_on_the_host_of_damaged_replicas_gets_them_from_the_others(cluster):
    """A reader on a node's host has that node vouch for all its local files in one call (``check-parts``):
    the damaged ones are named, quarantined, and read from their other replica; the intact ones are read here."""
    from flightpart.client.fetch import vouch_local
    from flightpart.io.connections import shared_pool
    from flightpart.io.hosts import host_addresses

    c = cluster
    table = table_of(40_000, 5)
    with fp.connect(c.uri, host=c.ips[0]) as client:
        client.put("rot-local", table, tiling=(40, 1), replicas=2)
        ds = client.open("rot-local")
        mine = [p for p in range(40) if any(u == c.nodes[0].uri for u, _f in holders(c, "rot-local", (p, 0)))]
        bad = mine[:3]
        for part in bad:
            path = dict(holders(c, "rot-local", (part, 0)))[c.nodes[0].uri]
            flip_bit(path, data_offset(path))
        refs = [e["data"] for e in ds.__partitioned__["partitions"].values()]
        assert vouch_local(refs, host_addresses(c.ips[0]), shared_pool(client.access)) == 1  # one call for all
        assert ds.to_arrow().equals(table)
        assert len(quarantined(c, "rot-local")) == len(bad)


def test_a_flipped_bit_in_the_footer_is_found_by_scrub_and_repair_recreates_the_replica(cluster):
    c = cluster
    table = table_of(30_000, 2)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put("rot-footer", table, tiling=(2, 1), replicas=2)
        (bad_uri, bad_file), _good = holders(c, "rot-footer", (1, 0))
        flip_bit(bad_file, footer_offset(bad_file))
        scrub = cli("scrub", "--catalog", c.uri, "--json")
        assert scrub.returncode == 1, scrub.stderr
        report = json.loads(scrub.stdout)
        found = [(n["uri"], p["dataset"], tuple(p["part"])) for n in report["nodes"] for p in n["damaged"]]
        assert found == [(bad_uri, "rot-footer", (1, 0))] and report["missing"] == 0 and not report["unreachable"]
        assert bad_uri not in listed(client, "rot-footer", (1, 0))
        assert client.open("rot-footer").to_arrow().equals(table)
        repaired = client.repair()
        assert {(r["dataset"], tuple(r["part"])) for r in repaired["copied"]} >= {("rot-footer", (1, 0))}
        assert len(listed(client, "rot-footer", (1, 0))) == 2
        for uri, _file in holders(c, "rot-footer", (1, 0)):
            assert raw_get(uri, "rot-footer", (1, 0)).equals(table.slice(15_000))
        again = json.loads(cli("scrub", "--catalog", c.uri, "--json").stdout)
        assert again["damaged"] == 0 and again["missing"] == 0


MAPPED_READER = """
import sys
import numpy as np, pyarrow as pa
import flightpart as fp
rows, seed = int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(seed)
want = pa.table({"id": np.arange(rows), "x": rng.random(rows), "s": pa.array([f"r{k % 97}" for k in range(rows)])})
with fp.connect(sys.argv[1], host=sys.argv[2]) as client:
    got = client.open("rot-mapped").to_arrow()
print("EQUAL" if got.equals(want) else "DIFFERENT")
"""


def test_a_reader_mapping_a_damaged_file_on_the_nodes_host_gets_the_right_data_and_is_not_killed(cluster):
    c = cluster
    rows = 40_000
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put("rot-mapped", table_of(rows, 3), tiling=(2, 1), replicas=2)
    for part, where in (((0, 0), data_offset), ((1, 0), footer_offset)):
        _uri, bad_file = holders(c, "rot-mapped", part)[0]
        flip_bit(bad_file, where(bad_file))
    for ip in c.ips[:3]:  # a reader on each host: some map a damaged file, unless the node refuses to vouch for it
        run = subprocess.run([sys.executable, "-c", MAPPED_READER, c.uri, ip, str(rows), "3"], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode >= 0, f"the reader on {ip} was killed by signal {-run.returncode}"
        assert run.returncode == 0 and run.stdout.strip() == "EQUAL", run.stderr[-2000:]
    assert len(quarantined(c, "rot-mapped")) == 2


def test_a_repartition_reading_a_damaged_partition_does_not_crash_its_node(cluster):
    c = cluster
    table = table_of(60_000, 4)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put("rot-reshape", table, tiling=(3, 1), replicas=2)
        for part, where in (((0, 0), data_offset), ((1, 0), footer_offset), ((2, 0), data_offset)):
            _uri, bad_file = holders(c, "rot-reshape", part)[0]
            flip_bit(bad_file, where(bad_file))
        client.repartition("rot-reshape", tiling=(2, 1))  # the nodes assemble from their own files or pull from others
        assert client.open("rot-reshape").to_arrow().equals(table)  # never a damaged byte in the new version
        for node in c.nodes:
            assert node.proc.poll() is None, f"node {node.uri} died: {node.proc.returncode}"
            assert client.call(ListNodes()).nodes and flight.connect(node.uri).do_action(
                flight.Action("node-info", b"{}"))
        assert client.open("rot-reshape", version=1).to_arrow().equals(table)
        cli("scrub", "--catalog", c.uri)  # whatever damage the repartition did not touch is found now
        assert len(quarantined(c, "rot-reshape")) == 3


def test_a_file_deleted_under_a_running_node_is_found_failed_over_and_recreated(cluster):
    c = cluster
    table = table_of(30_000, 5)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put("vanish", table, tiling=(2, 1), replicas=2)
        (lost_uri, lost_file), (kept_uri, _) = holders(c, "vanish", (0, 0))
        lost_file.unlink()
        with pytest.raises(flight.FlightError) as info:
            raw_get(lost_uri, "vanish", (0, 0))
        assert code_of(info.value) == "PARTITION_MISSING"
        assert client.open("vanish").to_arrow().equals(table)  # the read moved on to the other replica
        scrub = cli("scrub", "--catalog", c.uri, "--json")
        assert scrub.returncode == 1, scrub.stderr
        report = json.loads(scrub.stdout)
        assert [(n["uri"], p["dataset"], tuple(p["part"])) for n in report["nodes"] for p in n["missing"]] == \
            [(lost_uri, "vanish", (0, 0))]
        assert listed(client, "vanish", (0, 0)) == {kept_uri}
        client.repair()
        assert len(listed(client, "vanish", (0, 0))) == 2 and len(holders(c, "vanish", (0, 0))) == 2
        assert client.open("vanish").to_arrow().equals(table)


def test_a_file_deleted_while_its_node_was_down_is_not_listed_after_the_restart(cluster):
    c = cluster
    table = table_of(20_000, 6)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put("vanish-down", table, tiling=(2, 1), replicas=2)
        (lost_uri, lost_file), (kept_uri, _) = holders(c, "vanish-down", (1, 0))
        k = [n.uri for n in c.nodes].index(lost_uri)
        victim = c.nodes[k]
        victim.kill()
        lost_file.unlink()
        layout.stats_path(lost_file).unlink()  # nothing of it left but the manifest naming this node as holder
        c.nodes[k] = c.add_node(c.ips[k], heartbeat=0.3, data_dir=c.root / f"node-{c.ips[k]}",
                                args=["--scrub-interval", "0"])
        c.nodes.pop()  # add_node appended it; it takes the old one's place
        wait_until(lambda: c.nodes[k].uri not in listed(client, "vanish-down", (1, 0)), 30,
                   "the restarted node to report the partition it lost")
        assert listed(client, "vanish-down", (1, 0)) == {kept_uri}
        assert client.open("vanish-down").to_arrow().equals(table)


@pytest.mark.slow  # waits out a dead_after on purpose
def test_a_scrub_right_after_a_catalog_restart_checks_every_node(new_cluster):
    """A restarted catalog's recorded heartbeats are older than ``dead_after``, so until each node beats again it
    took live nodes for dead: a scrub at once checked none of them and reported a clean cluster (exit 0). Now it
    waits, as the node list does, and finds the damage on every node."""
    with new_cluster(3, process=True, heartbeat=2.0, dead_after=10.0, catalog_port=free_port(),
                      node_args=["--scrub-interval", "0"]) as c:
        with fp.connect(c.uri, host="127.0.0.99") as client:
            client.put("rot-restart", table_of(30_000, 7), tiling=(3, 1))
        files = sorted(c.root.glob(f"node-*/{layout.version_relpath('rot-restart', 1)}/*{layout.SUFFIX}"))
        assert sorted(f.relative_to(c.root).parts[0] for f in files) == [f"node-{ip}" for ip in c.ips[:3]]  # one each
        for f in files:
            flip_bit(f, data_offset(f))
        time.sleep(11.0)  # the registrations the database holds are now older than dead_after
        c.catalog.kill()
        c.catalog = c.start_catalog()
        scrub = cli("scrub", "--catalog", c.uri, "--json")
        assert scrub.returncode == 1, scrub.stderr
        report = json.loads(scrub.stdout)
        assert sorted(n["uri"] for n in report["nodes"]) == sorted(n.uri for n in c.nodes), report
        assert report["damaged"] == 3 and not report["unreachable"], report


@pytest.mark.slow  # waits out a dead_after on purpose
def test_a_scrub_leaves_a_frozen_node_and_says_it_was_not_scrubbed(new_cluster):
    """A node SIGSTOPped as a scrub starts never answers its part: the scrub waited an hour for it. Now a node's
    scrub is waited for while the node beats; the frozen one is left once the catalog calls it dead, the others'
    findings come back, the frozen node is listed as not scrubbed, and the command exits 3 (1 is for damage)."""
    with new_cluster(3, process=True, heartbeat=0.3, dead_after=6.0,
                      node_args=["--scrub-interval", "0"]) as c:
        with fp.connect(c.uri, host="127.0.0.99", timeout=30) as client:
            client.put("rot-frozen", table_of(30_000, 8), tiling=(3, 1))
            frozen = c.nodes[0]
            os.kill(frozen.pid, signal.SIGSTOP)
            try:
                # asked at once, while the frozen node still counts as alive: its call is made and never answered
                outcome = finished_within(lambda: client.call(ScrubCluster(), timeout=SCRUB_DEADLINE).to_json(), 60)
                assert "value" in outcome, outcome or "the scrub still waited for the frozen node after 60 s"
                report = outcome["value"]
                assert report["unreachable"] == [frozen.uri], report
                assert sorted(n["uri"] for n in report["nodes"]) == sorted(n.uri for n in c.nodes[1:]), report
                assert report["damaged"] == 0 and report["missing"] == 0
                assert "stopped beating during the call" in c.catalog.log()
                again = cli("scrub", "--catalog", c.uri)  # the node is dead by now: not scrubbed, and the exit says so
                assert again.returncode == 3, again.stderr
                assert f"UNREACHABLE {frozen.uri}: not scrubbed" in again.stderr
            finally:
                os.kill(frozen.pid, signal.SIGCONT)


@pytest.mark.slow  # a long fault test: behind the marker CI still runs
def test_a_disk_read_only_during_a_put_leaves_no_file_once_writable(small_disk, new_cluster):
    data_dir = small_disk / "node"
    with new_cluster(0, process=True, heartbeat=0.3) as c:
        c.add_node(c.ips[0], heartbeat=0.3, data_dir=data_dir,
                   args=["--min-free-bytes", "0", "--scrub-interval", "0"])
        part = table_of(5_000, 7)
        with fp.connect(c.uri, host="127.0.0.99") as client:
            version = client.call(Begin("ro-put")).version
            writer, reader = flight.connect(c.nodes[0].uri).do_put(
                flight.FlightDescriptor.for_path("ro-put", str(version), "parts"), part.schema)
            vdir = data_dir / layout.version_relpath("ro-put", version)
            for i in range(3):
                writer.write_metadata(pa.py_buffer(PartHeader((i, 0)).encode()))
                writer.write_table(part)
                writer.write_metadata(pa.py_buffer(PutTrailer(part.num_rows).encode()))
            wait_until(lambda: len(list(vdir.glob("*.arrow"))) == 3, 30, "three partitions stored")
            subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
            try:
                with pytest.raises(flight.FlightError) as info:
                    writer.write_metadata(pa.py_buffer(PartHeader((3, 0)).encode()))
                    writer.write_table(part)
                    writer.write_metadata(pa.py_buffer(PutTrailer(part.num_rows).encode()))
                    writer.done_writing()
                    reader.read()
                    writer.close()
                assert code_of(info.value) == "STORAGE_UNWRITABLE"
                client.call(Abort("ro-put", version), timeout=30)  # what a client does after a failed put
                assert list(data_dir.rglob("*.arrow"))  # the disk kept them for now
            finally:
                subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
            wait_until(lambda: not [p for p in data_dir.rglob("*") if p.is_file()
                                    and p.name not in (layout.NODE_MARKER, layout.TOMBSTONES)], 30,
                       "the node to remove the failed put's files once the disk is writable")


@pytest.mark.slow
def test_rot_after_a_file_was_verified_is_found_by_the_background_scrub(new_cluster):
    table = table_of(30_000, 8)
    with new_cluster(2, process=True, heartbeat=0.3,
                      node_args=["--scrub-interval", "0.5", "--scrub-rate", str(256 << 20)]) as c:
        with fp.connect(c.uri, host="127.0.0.99") as client:
            client.put("rot-later", table, tiling=(2, 1), replicas=2)
            for node in c.nodes:  # every replica read once: verified, and remembered as good by its node
                for part in ((0, 0), (1, 0)):
                    assert raw_get(node.uri, "rot-later", part).num_rows == 15_000
            victim = c.root / f"node-{c.ips[0]}" / layout.partition_relpath("rot-later", 1, (1, 0))
            flip_bit(victim, data_offset(victim))  # rot after the check, mtime kept: only a scrub can see it
            wait_until(lambda: c.nodes[0].uri not in listed(client, "rot-later", (1, 0)), 60,
                       "the background scrub to find the rot and the catalog to stop listing the replica")
            assert not victim.exists() and list(c.root.glob(f"node-{c.ips[0]}/{layout.QUARANTINE}/rot-later/v1/*"))
            assert client.open("rot-later").to_arrow().equals(table)
            assert client.stats(c.nodes[0].uri).values["partitions_damaged"] == 1
