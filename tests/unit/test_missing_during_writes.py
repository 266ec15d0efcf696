"""A scrub that looks while a write is placing a partition: its statistics are there, its file not yet."""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from flightpart.io import layout
from flightpart.server.store import PartitionStore


def test_a_partition_being_placed_is_not_reported_missing(tmp_path):
    """A write renames the statistics, then the file, both under the store's lock; a scrub between is no finding."""
    store = PartitionStore(tmp_path / "node")
    table = pa.table({"a": list(range(100))})
    store.write("d", 1, (0, 0), table.schema, table.to_batches())
    final = store.path("d", 1, (1, 0))
    answers: list[list] = []

    def look() -> None:
        answers.append(store.missing())

    with store.lock:  # the window a write's two renames are in
        layout.stats_path(final).hardlink_to(layout.stats_path(store.path("d", 1, (0, 0))))
        scrub = threading.Thread(target=look)
        scrub.start()
        time.sleep(0.2)  # the scrub has listed the statistics file by now, or waits on the lock to confirm it
        final.hardlink_to(store.path("d", 1, (0, 0)))
    scrub.join(30)
    assert answers == [[]]


def test_a_statistics_file_without_its_partition_is_still_reported_missing(tmp_path):
    """The confirmation under the lock keeps the finding a scrub is for."""
    store = PartitionStore(tmp_path / "node")
    table = pa.table({"a": list(range(100))})
    store.write("d", 1, (0, 0), table.schema, table.to_batches())
    store.path("d", 1, (0, 0)).unlink()
    assert store.missing() == [("d", 1, (0, 0))]
