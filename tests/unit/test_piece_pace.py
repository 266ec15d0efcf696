"""How large a node's row ranges grow: with a fast reader, at most twice the last, up to the ceiling; with a slow
one, back to the floor. The rule is checked with pace settings far from any machine's timing, so load cannot
change the answer."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from flightpart.io.transfer import PiecePace, row_pieces

BATCH_ROWS = 1_000


def _table(batches: int) -> pa.Table:
    return pa.Table.from_batches([pa.record_batch({"k": np.arange(k * BATCH_ROWS, (k + 1) * BATCH_ROWS)})
                                  for k in range(batches)])


def _sizes(table: pa.Table, pace: PiecePace) -> list[int]:
    """The batches in each range, as a reader that takes every range at once sees them."""
    return [piece.column(0).num_chunks for piece in pace.paced(row_pieces(table, table.nbytes, pace), table.nbytes,
                                                               table.num_rows)]


def test_a_fast_reader_gets_ranges_that_double_up_to_the_ceiling():
    table = _table(100)
    batch = table.nbytes // 100
    sizes = _sizes(table, PiecePace(2 * batch, 16 * batch, seconds=1e6, buffered_bytes=0))  # fast next to 1e6 s
    assert sizes[:4] == [2, 4, 8, 16] and set(sizes[4:-1]) == {16}
    assert sum(sizes) == 100


def test_a_slow_reader_keeps_the_smallest_ranges():
    table = _table(40)
    batch = table.nbytes // 40
    assert set(_sizes(table, PiecePace(2 * batch, 16 * batch, seconds=1e-12, buffered_bytes=0))) == {2}


def test_paced_ranges_cover_every_row_once():
    table = _table(37)
    batch = table.nbytes // 37
    pace = PiecePace(3 * batch, 64 * batch, seconds=1e6, buffered_bytes=0)
    pieces = list(pace.paced(row_pieces(table, table.nbytes, pace), table.nbytes, table.num_rows))
    assert pa.concat_tables(pieces).equals(table)


def test_no_range_grows_before_more_than_the_buffers_hold_was_taken():
    # a stream's first megabytes are accepted at once into windows and socket buffers, whatever the reader's pace
    table = _table(100)
    batch = table.nbytes // 100
    sizes = _sizes(table, PiecePace(2 * batch, 16 * batch, seconds=1e6, buffered_bytes=7 * batch))
    assert sizes[:5] == [2, 2, 2, 2, 4]  # 8 batches taken before one beyond the 7 buffered counts


def test_a_batch_far_larger_than_a_message_is_cut_whatever_the_range_size():
    table = _table(1)
    whole = table.nbytes
    pieces = list(row_pieces(table, whole, 10 * whole, whole // 10))
    assert len(pieces) >= 9 and pa.concat_tables(pieces).equals(table)


def test_ranges_grow_past_the_message_size_while_batches_stay_whole():
    table = _table(64)
    batch = table.nbytes // 64
    pace = PiecePace(2 * batch, 32 * batch, seconds=1e6, buffered_bytes=0)
    pieces = list(pace.paced(row_pieces(table, table.nbytes, pace, 2 * batch), table.nbytes, table.num_rows))
    assert max(p.column(0).num_chunks for p in pieces) == 32  # ranges of many batches, no batch cut
    assert all(len(chunk) == BATCH_ROWS for p in pieces for chunk in p.column(0).chunks)
