"""Files `get` writes and `put` reads: Parquet in row groups of about a million rows, CSV that keeps its nulls."""

from __future__ import annotations

import gzip

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flightpart.cli.export import ROW_GROUP_ROWS, BatchWriter
from flightpart.cli.sources import SourceError, open_source


def read_file(path: str) -> pa.Table:
    return open_source(path).read_all()


def _streamed(rows: int, batch_rows: int) -> list[pa.RecordBatch]:
    table = pa.table({"k": np.arange(rows), "x": np.random.default_rng(1).random(rows)})
    return table.to_batches(max_chunksize=batch_rows)


@pytest.mark.parametrize("batch_rows", [10_000, 2_500_000])
def test_parquet_from_a_stream_of_batches_has_row_groups_of_about_a_million_rows(tmp_path, batch_rows):
    out = tmp_path / "x.parquet"
    writer = BatchWriter(str(out), "parquet", _streamed(1, 1)[0].schema)
    for batch in _streamed(2_500_000, batch_rows):
        writer.write(batch)
    writer.commit()
    meta = pq.ParquetFile(out).metadata
    assert [meta.row_group(k).num_rows for k in range(meta.num_row_groups)] == [ROW_GROUP_ROWS, ROW_GROUP_ROWS,
                                                                                 2_500_000 - 2 * ROW_GROUP_ROWS]
    assert pq.read_table(out).column("k").to_pylist() == list(range(2_500_000))


def test_a_small_parquet_file_is_one_row_group_holding_every_row(tmp_path):
    out = tmp_path / "small.parquet"
    batches = _streamed(25_000, 1_000)
    writer = BatchWriter(str(out), "parquet", batches[0].schema)
    for batch in batches:
        writer.write(batch)
    writer.commit()
    assert pq.ParquetFile(out).metadata.num_row_groups == 1 and writer.rows == 25_000


def _csv_round_trip(tmp_path, table: pa.Table, name: str = "t.csv") -> pa.Table:
    out = tmp_path / name
    writer = BatchWriter(str(out), "csv", table.schema)
    for batch in table.to_batches():
        writer.write(batch)
    writer.commit()
    return read_file(str(out))


def test_csv_keeps_null_strings_apart_from_empty_ones_through_get_and_put(tmp_path):
    table = pa.table({"zone": ["Hell's Kitchen", None, "", 'say "hi"'], "fare": [1.5, None, 3.0, 4.0]})
    back = _csv_round_trip(tmp_path, table)
    assert back.column("zone").to_pylist() == ["Hell's Kitchen", None, "", 'say "hi"']
    assert back.column("fare").to_pylist() == [1.5, None, 3.0, 4.0]


def test_a_gzipped_csv_is_read_as_csv(tmp_path):
    path = tmp_path / "trips.csv.gz"
    path.write_bytes(gzip.compress(b"zone,fare\nMidtown,2.5\n,3.5\n"))
    table = read_file(str(path))
    assert table.column("zone").to_pylist() == ["Midtown", None] and table.column("fare").to_pylist() == [2.5, 3.5]


def test_a_compressed_parquet_name_is_refused_saying_why(tmp_path):
    path = tmp_path / "x.parquet.gz"
    path.write_bytes(gzip.compress(b"not parquet"))
    with pytest.raises(SourceError, match="decompress it first"):
        read_file(str(path))
