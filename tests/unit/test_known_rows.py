"""The rows a reader expects of a handle (PartitionRef.known_rows): what the catalog registered for a whole partition
or a row range, and nothing once a filter, aggregate or top is set on the handle (as a runtime pushing a filter into
the handles it was given does), since the node then sends however many rows those keep."""

from dataclasses import replace

from flightpart.client.fetch import PartitionRef, split_rows
from flightpart.wire import Ticket

REPLICAS = (("grpc://127.0.0.2:1", "127.0.0.2", 1), ("grpc://127.0.0.3:1", "127.0.0.3", 1))


def test_a_handle_knows_its_rows_until_a_filter_is_pushed_into_it():
    ref = PartitionRef(Ticket("d", 1, (0, 0)), REPLICAS, expected_rows=1_000)
    assert ref.known_rows == 1_000
    assert ref.asking(columns=("a",), row_numbers=True).known_rows == 1_000
    assert ref.asking(filter=b"substrait").known_rows is None


def test_row_ranges_of_a_handle_know_their_own_rows():
    ref = PartitionRef(Ticket("d", 1, (0, 0)), REPLICAS, expected_rows=1_000)
    pieces = split_rows(ref, (0, 1_000), 3)
    assert [p.known_rows for p in pieces] == [p.rows[1] - p.rows[0] for p in pieces] and sum(
        p.known_rows for p in pieces) == 1_000
    assert all(p.known_rows is None for p in split_rows(replace(ref, expected_rows=None), (0, 1_000), 3))
