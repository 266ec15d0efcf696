"""A stored file that rots after this process checked it (its stat unchanged, as a failing disk leaves it)."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from flightpart.errors import PartitionDamaged
from flightpart.server.store import PartitionStore


def rot_footer(path) -> None:
    st = path.stat()
    raw = bytearray(path.read_bytes())
    footer_len = int.from_bytes(raw[-10:-6], "little")
    raw[len(raw) - 10 - footer_len // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime kept: the stat says nothing changed


def test_a_file_rotted_after_its_check_is_refused_as_damaged_and_quarantined(tmp_path):
    store = PartitionStore(tmp_path / "node", max_maps=1)
    table = pa.table({"a": list(range(1000)), "b": [float(k) for k in range(1000)]})
    for k in range(2):
        store.write("d", 1, (k, 0), table.schema, table.to_batches())
    assert store.open("d", 1, (0, 0)).equals(table)  # checked once, and kept
    assert store.open("d", 1, (1, 0)).equals(table)  # the only slot goes to another file: (0, 0) is read again next
    path = store.path("d", 1, (0, 0))
    rot_footer(path)
    with pytest.raises(PartitionDamaged):  # not an Arrow error that a server reports as INTERNAL
        store.open("d", 1, (0, 0))
    assert not path.exists()  # moved to quarantine: never served
    assert store.open("d", 1, (1, 0)).equals(table)
