"""A node streams a stored partition in row ranges of several batches: cut where batches end, never losing or
repeating a row, and within a batch only when it alone is far larger than a range."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from flightpart.io.transfer import row_pieces


def _batched(sizes: list[int]) -> pa.Table:
    start, batches = 0, []
    for n in sizes:
        batches.append(pa.record_batch({"k": pa.array(np.arange(start, start + n)),
                                        "s": pa.array([f"v{v:07d}" for v in range(start, start + n)], pa.string())}))
        start += n
    return pa.Table.from_batches(batches)


@pytest.mark.parametrize("sizes, target_rows", [
    ([100] * 50, 400),          # many small batches: four to a range
    ([100] * 7, 1_000),         # all in one range
    ([5_000, 10, 10, 3_000], 400),  # large batches cut in ranges, small ones grouped
    ([1], 10), ([0, 0, 3], 10),
])
def test_row_ranges_cover_every_row_once_and_cut_where_batches_end(sizes, target_rows):
    table = _batched(sizes)
    per_row = table.nbytes / max(table.num_rows, 1)
    pieces = list(row_pieces(table, table.nbytes, int(target_rows * per_row)))
    assert pa.concat_tables(pieces).equals(table) if pieces else table.num_rows == 0
    assert all(p.num_rows > 0 for p in pieces)
    ends = np.cumsum(sizes).tolist()
    cut = 0
    for piece in pieces:
        cut += piece.num_rows
        if cut not in ends:  # a cut inside a batch: only inside one of more than twice the target
            inside = next(k for k, end in enumerate(ends) if end > cut)
            assert sizes[inside] > 2 * target_rows, (cut, sizes)
    assert max(p.num_rows for p in pieces) <= max(2 * target_rows + 1, max(n for n in sizes if n <= 2 * target_rows))


def test_a_stored_partition_of_1_mib_batches_goes_out_in_a_quarter_as_many_steps():
    table = _batched([10_000] * 40)
    batch_bytes = table.nbytes // 40
    pieces = list(row_pieces(table, table.nbytes, 4 * batch_bytes))
    assert len(pieces) == 10 and all(p.column(0).num_chunks == 4 for p in pieces)
