"""Where a partition's checksum is recorded, seen through a node's store (a fresh store on the same directory is a
node restarted: nothing of what it wrote is in memory)."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pytest

from flightpart.errors import PartitionDamaged
from flightpart.io import layout
from flightpart.server.store import PartitionStore
from flightpart.wire import Commit, CommitPart


def table_of(k: int) -> pa.Table:
    return pa.table({"a": list(range(k * 1000, k * 1000 + 1000)), "b": [float(x) for x in range(1000)]})


def stored(root, parts: int = 4, version: int = 1, *, seal: bool = True) -> PartitionStore:
    store = PartitionStore(root)
    for k in range(parts):
        table = table_of(k + 10 * version)
        store.write("d", version, (k, 0), table.schema, table.to_batches())
    if seal:
        store.seal(manifest_of(store, version, parts))
    return store


def manifest_of(store: PartitionStore, version: int, parts: int) -> Commit:
    schema = table_of(0).schema
    return Commit("d", version, schema, (1000 * parts, 2), (parts, 1),
                  tuple(CommitPart((k, 0), (1000 * k, 0), (1000, 2), (store.node_id,)) for k in range(parts)))


def flip(path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["deleted", "garbled"])
def test_a_sealed_file_whose_statistics_are_lost_is_still_checked(tmp_path, how):
    stored(tmp_path)
    store = PartitionStore(tmp_path)  # restarted
    intact, rotten = store.path("d", 1, (0, 0)), store.path("d", 1, (1, 0))
    for path in (intact, rotten):
        side = layout.stats_path(path)
        side.unlink() if how == "deleted" else side.write_bytes(b'{"rows": 1000, "crc')
    flip(rotten)
    assert store.open("d", 1, (0, 0)).equals(table_of(10))  # checked against the seal's record
    with pytest.raises(PartitionDamaged):
        store.open("d", 1, (1, 0))
    assert not rotten.exists()


def test_a_file_with_no_checksum_left_in_a_sealed_version_is_damage(tmp_path):
    stored(tmp_path)
    store = PartitionStore(tmp_path)
    path = store.path("d", 1, (2, 0))
    layout.stats_path(path).unlink()
    (path.parent / layout.SUMS).write_bytes(b"{garbled")
    with pytest.raises(PartitionDamaged, match="no checksum is recorded"):
        store.verify("d", 1, (2, 0))
    assert store.open("d", 1, (3, 0)).equals(table_of(13))  # its statistics still vouch for it


@pytest.mark.parametrize(("source", "target"), [
    (("d", 1, (0, 0)), ("d", 1, (3, 0))),  # another position of the same version
    (("d", 1, (3, 0)), ("d", 2, (3, 0))),  # the same position of another version
])
def test_a_valid_file_copied_over_another_place_fails_there(tmp_path, source, target):
    stored(tmp_path)
    stored(tmp_path, version=2)
    store = PartitionStore(tmp_path)
    src, dst = store.path(*source), store.path(*target)
    shutil.copyfile(src, dst)
    shutil.copyfile(layout.stats_path(src), layout.stats_path(dst))
    with pytest.raises(PartitionDamaged, match="written for another place"):
        store.open(*target)
    assert not dst.exists()
    assert store.open(*source).num_rows == 1000  # the file where it belongs is served


def test_files_of_the_earlier_format_still_read_with_or_without_a_checksum(tmp_path):
    """Format 1: statistics with only a plain ``crc32`` (or none at all), and no ``checksums.json``."""
    stored(tmp_path)
    vdir = tmp_path / layout.version_relpath("d", 1)
    (vdir / layout.SUMS).unlink()
    for k in range(4):
        side = layout.stats_path(vdir / f"{k}_0{layout.SUFFIX}")
        body = json.loads(side.read_bytes())
        del body["format"], body["sum"]
        side.write_text(json.dumps(body))
    layout.stats_path(vdir / f"3_0{layout.SUFFIX}").unlink()  # stored before checksums existed
    store = PartitionStore(tmp_path)
    for k in range(4):
        assert store.open("d", 1, (k, 0)).equals(table_of(10 + k))
    flip(vdir / f"1_0{layout.SUFFIX}")
    with pytest.raises(PartitionDamaged):
        store.open("d", 1, (1, 0))


def test_a_linked_file_gets_a_checksum_of_its_own_place(tmp_path):
    store = stored(tmp_path)
    store.link("d", 1, (2, 0), 2, (0, 0))
    store.seal(Commit("d", 2, table_of(0).schema, (1000, 2), (1, 1),
                      (CommitPart((0, 0), (0, 0), (1000, 2), (store.node_id,)),)))
    old_side, new_side = (layout.stats_path(store.path("d", v, p)) for v, p in ((1, (2, 0)), (2, (0, 0))))
    assert json.loads(new_side.read_bytes())["sum"] != json.loads(old_side.read_bytes())["sum"]
    restarted = PartitionStore(tmp_path)
    assert restarted.open("d", 2, (0, 0)).equals(table_of(12))
    assert restarted.open("d", 1, (2, 0)).equals(table_of(12))
    new_side.unlink()  # the seal of v2 recorded the sum bound to v2's place
    assert PartitionStore(tmp_path).open("d", 2, (0, 0)).equals(table_of(12))


def test_a_scrub_does_not_report_what_a_drop_removes_while_it_runs(tmp_path):
    store = stored(tmp_path)
    stored(tmp_path, version=2)
    claimed = store.claimed(store.node_id)  # what the manifests say when the scrub starts
    assert len(claimed) == 8
    dropped = []

    def drop_once() -> bool:  # asked before each file: the first time, version 1 goes (no tombstone: not an order)
        if not dropped:
            dropped.append(store.drop("d", 1))
        return False

    report = store.scrub(claimed, stop=drop_once)
    assert dropped == [4] and report["missing"] == [] and report["damaged"] == []
    store.path("d", 2, (1, 0)).unlink()  # a partition lost for real is still found
    assert store.scrub(store.claimed(store.node_id))["missing"] == [("d", 2, (1, 0))]
