"""A Flight SQL client that lies in the Arrow it sends the catalog: bound parameters or an ``adbc_ingest`` stream
whose string offsets run past their data (a stream reader checks only the first and last offsets). The catalog
turned bound parameters into Python values unchecked, and such a binding killed it; an ingest's batches were
refused only by the node, after the catalog's put had cut them. Both are now refused by the catalog with a code
before it touches a value, it keeps answering, and nothing is stored."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart import sqlwire


def lying_text(rows: int = 2) -> pa.Array:
    """``rows`` strings, the first running a gigabyte past the 4 bytes of data (the last offset is in bounds)."""
    offsets = np.full(rows + 1, 4, dtype=np.int32)
    offsets[0], offsets[1] = 0, 1_000_000_000
    return pa.Array.from_buffers(pa.string(), rows, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"abcd")])


def command(name: str, *fields) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(sqlwire.pack(name, sqlwire.message(*fields)))


@pytest.fixture(scope="module")
def catalog(make_cluster):
    with make_cluster(1, process=True) as cluster:
        with fp.connect(cluster.uri) as client:
            client.put("words", pa.table({"w": ["a", "bb", "ccc"]}))
        yield cluster


def still_answers(cluster) -> None:
    assert cluster.catalog.proc.poll() is None
    with fp.connect(cluster.uri) as client:
        assert client.sql("SELECT count(*) AS n FROM words").to_arrow().column("n").to_pylist() == [3]


def test_lying_bound_parameters_are_refused(catalog):
    raw = flight.connect(catalog.uri)
    action = flight.Action("CreatePreparedStatement", sqlwire.pack(sqlwire.CREATE_PREPARED, sqlwire.message(
        (1, "SELECT count(*) AS n FROM words WHERE w = ?"))))
    handle = sqlwire.bytes_field(sqlwire.unpack(next(iter(raw.do_action(action))).body.to_pybytes()).value, 1, "handle")
    values = pa.table({"p": lying_text()})
    writer, _ = raw.do_put(command(sqlwire.PREPARED_QUERY, (1, handle)), values.schema)
    with pytest.raises(pa.ArrowException, match="cannot be read safely") as info:
        writer.write_table(values)
        writer.done_writing()
        writer.close()
        raw.get_flight_info(command(sqlwire.PREPARED_QUERY, (1, handle)))  # where an unchecked binding was used
    assert "[flightpart INVALID_REQUEST at parameters]" in str(info.value)  # a Flight SQL error names its code
    still_answers(catalog)


def test_a_lying_ingest_is_refused_and_nothing_is_stored(catalog):
    raw = flight.connect(catalog.uri)
    rows = pa.table({"k": pa.array([1, 2], pa.int64()), "s": lying_text()})
    descriptor = command(sqlwire.INGEST, (1, sqlwire.message((1, 1), (2, 1))), (2, "lies"))  # create, fail if exists
    writer, _ = raw.do_put(descriptor, rows.schema)
    with pytest.raises(pa.ArrowException, match="cannot be read safely") as info:
        writer.write_table(rows)
        writer.done_writing()
        writer.close()
    assert "[flightpart INVALID_REQUEST at batch]" in str(info.value)
    still_answers(catalog)
    with fp.connect(catalog.uri) as client:
        assert "lies" not in {entry.name for entry in client.list()}
