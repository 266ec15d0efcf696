"""Checksums that cannot be switched off or moved, and scrubs that drops race, on real daemons.

A partition's statistics file deleted or garbled must not turn its checksum
off; a valid file copied over another partition's place (another position of
the same version, or the same position of another version) must never be
served as that place; a scrub racing drops must not report the dropped
versions' files as missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart.io import layout
from flightpart.local.cluster import LocalCluster
from flightpart.wire import SCRUB_DEADLINE, ScrubCluster, Ticket

from helpers import code_of, wait_until


def table_of(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(rows) + seed * 1_000_000, "x": rng.random(rows)})


@pytest.fixture(scope="module")
def cluster(make_cluster):
    """Three nodes whose background scrub is off, so each test decides when damage is found."""
    with make_cluster(3, process=True, heartbeat=0.3,
                      node_args=["--scrub-interval", "0"]) as c:
        yield c


def holders(c: LocalCluster, ips: list[str], name: str, part: tuple[int, int],
            version: int = 1) -> list[tuple[str, Path]]:
    """(node uri, file) of every replica of a partition on disk."""
    rel = layout.partition_relpath(name, version, part)
    return [(n.uri, c.root / f"node-{ip}" / rel) for n, ip in zip(c.nodes, ips)
            if (c.root / f"node-{ip}" / rel).exists()]


def listed(client, name: str, part: tuple[int, int]) -> set[str]:
    ref = client.open(name).__partitioned__["partitions"][part]["data"]
    return {uri for uri, _ip, _pid in ref.replicas}


def overwrite_bit(path: Path) -> None:
    """Flip one bit in the middle of the file (inside the record batches) by writing it: its mtime changes."""
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)[0]
        f.seek(path.stat().st_size // 2)
        f.write(bytes([byte ^ 0x10]))


def lose_stats(path: Path, how: str) -> None:
    """Delete or garble the statistics file beside a partition."""
    side = layout.stats_path(path)
    if how == "deleted":
        side.unlink()
    else:
        side.write_bytes(b'{"rows": 7, "crc3')


def move_over(source: Path, target: Path) -> None:
    """Copy a valid partition file and its statistics over another partition's place."""
    shutil.copyfile(source, target)
    shutil.copyfile(layout.stats_path(source), layout.stats_path(target))


def raw_get(uri: str, name: str, part: tuple[int, int], version: int = 1) -> pa.Table:
    return flight.connect(uri).do_get(flight.Ticket(Ticket(name, version, part).encode())).read_all()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightpart", *args], capture_output=True, text=True, timeout=300)


def scrub_findings(c: LocalCluster) -> tuple[int, dict[str, set]]:
    """``flightpart scrub --json``'s exit status and its findings, as {kind: {(uri, dataset, version, part)}}."""
    run = cli("scrub", "--catalog", c.uri, "--json")
    report = json.loads(run.stdout)
    found = {kind: {(n["uri"], p["dataset"], p["version"], tuple(p["part"])) for n in report["nodes"] for p in n[kind]}
             for kind in ("damaged", "missing")}
    return run.returncode, found


@pytest.mark.parametrize("how", ["deleted", "garbled"])
def test_a_lost_statistics_file_does_not_let_a_flipped_bit_be_served(cluster, how):
    c = cluster
    name = f"lost-stats-{how}"
    table = table_of(40_000, 1)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put(name, table, tiling=(2, 1), replicas=2)
        (bad_uri, bad_file), (good_uri, good_file) = holders(c, c.ips, name, (0, 0))
        lose_stats(bad_file, how)
        overwrite_bit(bad_file)
        lose_stats(good_file, how)  # intact bytes whose statistics alone are lost: still served
        with pytest.raises(flight.FlightError) as info:
            raw_get(bad_uri, name, (0, 0))
        assert code_of(info.value) == "PARTITION_DAMAGED"
        assert raw_get(good_uri, name, (0, 0)).equals(table.slice(0, 20_000))
        assert client.open(name).to_arrow().equals(table)  # from the other replica
        wait_until(lambda: listed(client, name, (0, 0)) == {good_uri}, 60,
                   "the catalog to stop listing the damaged replica")

        (scrubbed_uri, scrubbed_file), _other = holders(c, c.ips, name, (1, 0))  # found by a scrub, not by a read
        lose_stats(scrubbed_file, how)
        overwrite_bit(scrubbed_file)
        status, found = scrub_findings(c)
        assert status == 1 and found["damaged"] == {(scrubbed_uri, name, 1, (1, 0))} and not found["missing"]
        client.repair()
        for part in ((0, 0), (1, 0)):
            wait_until(lambda part=part: len(listed(client, name, part)) == 2, 60, "repair to recreate the replica")
            for uri, _file in holders(c, c.ips, name, part):
                assert raw_get(uri, name, part).equals(table.slice(part[0] * 20_000, 20_000))
        assert scrub_findings(c) == (0, {"damaged": set(), "missing": set()})


def test_a_partition_copied_over_another_position_is_never_served_there(cluster):
    c = cluster
    name = "moved-part"
    table = table_of(40_000, 3)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put(name, table, tiling=(4, 1), replicas=2)
        (_src_uri, source), = holders(c, c.ips, name, (0, 0))[:1]
        (bad_uri, target), (good_uri, _) = holders(c, c.ips, name, (3, 0))
        move_over(source, target)
        with pytest.raises(flight.FlightError) as info:
            raw_get(bad_uri, name, (3, 0))
        assert code_of(info.value) == "PARTITION_DAMAGED"
        assert client.open(name).to_arrow().equals(table)
        wait_until(lambda: listed(client, name, (3, 0)) == {good_uri}, 60, "the catalog to stop listing the moved file")
        client.repair()
        wait_until(lambda: len(listed(client, name, (3, 0))) == 2, 60, "repair to recreate the replica")
        for uri, _file in holders(c, c.ips, name, (3, 0)):
            assert raw_get(uri, name, (3, 0)).equals(table.slice(30_000))


READER_ON_HOST = """
import sys
import flightpart as fp
with fp.connect(sys.argv[1], host=sys.argv[2]) as client:
    got = client.open(sys.argv[3]).to_arrow()
print(got.column("id")[0].as_py(), got.num_rows, got.column("id").to_pylist() == sorted(got.column("id").to_pylist()))
"""


def test_a_file_of_another_version_copied_into_place_is_found_by_scrub_refused_and_repaired(cluster):
    c = cluster
    name = "moved-version"
    old, new = table_of(40_000, 4), table_of(40_000, 5)
    with fp.connect(c.uri, host="127.0.0.99") as client:
        client.put(name, old, tiling=(2, 1), replicas=2)
        client.put(name, new, tiling=(2, 1), replicas=2)
        assert client.open(name).version == 2
        holders_v1 = dict(holders(c, c.ips, name, (1, 0), version=1))
        (bad_uri, target), (good_uri, _) = holders(c, c.ips, name, (1, 0), version=2)
        move_over(holders_v1.get(bad_uri) or next(iter(holders_v1.values())), target)
        status, found = scrub_findings(c)
        assert status == 1 and found["damaged"] == {(bad_uri, name, 2, (1, 0))} and not found["missing"]
        with pytest.raises(flight.FlightError) as info:
            raw_get(bad_uri, name, (1, 0), version=2)
        assert code_of(info.value) in ("PARTITION_DAMAGED", "PARTITION_MISSING")  # quarantined by the scrub
        wait_until(lambda: listed(client, name, (1, 0)) == {good_uri}, 60, "the catalog to stop listing the moved file")
        ip = c.ips[[n.uri for n in c.nodes].index(bad_uri)]
        run = subprocess.run([sys.executable, "-c", READER_ON_HOST, c.uri, ip, name], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split() == [str(5_000_000), "40000", "True"]  # the new version's rows, none of the old
        client.repair()
        wait_until(lambda: len(listed(client, name, (1, 0))) == 2, 60, "repair to recreate the replica")
        for uri, _file in holders(c, c.ips, name, (1, 0), version=2):
            assert raw_get(uri, name, (1, 0), version=2).equals(new.slice(20_000))
        assert client.open(name, version=1).to_arrow().equals(old)


@pytest.mark.slow  # a loop of puts and drops against repeated scrubs
def test_scrubs_racing_drops_report_nothing_missing_and_exit_zero(new_cluster):
    """Each scrub reads a ballast of 600 files, so drops that never pause remove files under every one of them."""
    with new_cluster(2, process=True, heartbeat=0.3, node_args=["--scrub-interval", "0"]) as c, \
            fp.connect(c.uri, host="127.0.0.99") as client:
        ballast = table_of(300_000, 6)
        client.put("ballast", ballast, tiling=(300, 1), replicas=2)
        small = table_of(2_000, 7)
        stop = threading.Event()
        dropped = [0]
        failures: list[BaseException] = []

        def churn() -> None:
            try:
                k = 0
                client.put(f"churn-{k}", small, tiling=(40, 1), replicas=2)
                while not stop.is_set():
                    client.put(f"churn-{k + 1}", small, tiling=(40, 1), replicas=2)
                    client.drop(f"churn-{k}")
                    dropped[0] += 1
                    k += 1
            except BaseException as exc:  # reported by the test, not lost in the thread
                failures.append(exc)

        worker = threading.Thread(target=churn, daemon=True)
        worker.start()
        try:
            wait_until(lambda: dropped[0] >= 1 or failures, 120, "the first drop")
            reports = [client.call(ScrubCluster(), timeout=SCRUB_DEADLINE) for _ in range(12)]
            runs = [cli("scrub", "--catalog", c.uri, "--json") for _ in range(3)]
            during = dropped[0]
        finally:
            stop.set()
            worker.join(120)
        assert not failures, failures
        assert during >= 10  # the drops did race the scrubs
        missing = [(n.uri, p) for r in reports for n in r.nodes for p in n.missing]
        damaged = [(n.uri, p) for r in reports for n in r.nodes for p in n.damaged]
        assert missing == [] and damaged == [] and all(not r.unreachable for r in reports)
        assert [run.returncode for run in runs] == [0, 0, 0], [run.stdout[-2000:] + run.stderr for run in runs]
        assert sum(n.checked for n in reports[-1].nodes) >= 600
        assert client.open("ballast").to_arrow().equals(ballast)
