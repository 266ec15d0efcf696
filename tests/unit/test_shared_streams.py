"""Which reads share a stream: small whole partitions of the same holders, nothing else. No cluster needed."""

from __future__ import annotations

from flightpart.client.fetch import SHARED_STREAM_BYTES, SMALL_BYTES, PartitionRef, shared_streams
from flightpart.wire import MAX_PARTS_PER_STREAM, Ticket

A = (("grpc://a:1", "127.0.0.2", 1),)
B = (("grpc://b:1", "127.0.0.3", 2),)


def ref(i: int, replicas=A, size: int = 100, j: int = 0, **kw) -> PartitionRef:
    return PartitionRef(Ticket("d", 1, (i, j), **kw), replicas, shareable_bytes=size)


def test_small_partitions_of_the_same_holders_share_one_stream_in_order():
    refs = [ref(0), ref(1, B), ref(2), ref(3, B), ref(4)]
    assert shared_streams(list(enumerate(refs))) == [[0, 2, 4], [1, 3]]


def test_large_sliced_filtered_or_unsized_partitions_are_read_alone():
    refs = [ref(0, size=SMALL_BYTES + 1), ref(1, rows=(0, 5)), ref(2, filter=b"f"), ref(3, size=0), ref(4), ref(5)]
    assert shared_streams(list(enumerate(refs))) == [[0], [1], [2], [3], [4, 5]]


def test_column_groups_and_selections_do_not_mix():
    refs = [ref(0, j=0), ref(0, j=1), ref(1, j=0), ref(1, j=1), ref(2, columns=("x",)), ref(3, columns=("x",))]
    assert shared_streams(list(enumerate(refs))) == [[0, 2], [1, 3], [4, 5]]


def test_a_stream_carries_a_bounded_number_of_partitions_and_bytes():
    many = [ref(i, size=1) for i in range(MAX_PARTS_PER_STREAM + 3)]
    assert [len(g) for g in shared_streams(list(enumerate(many)))] == [MAX_PARTS_PER_STREAM, 3]
    heavy = [ref(i, size=SMALL_BYTES) for i in range(SHARED_STREAM_BYTES // SMALL_BYTES + 1)]
    assert [len(g) for g in shared_streams(list(enumerate(heavy)))] == [SHARED_STREAM_BYTES // SMALL_BYTES, 1]


def test_where_partitions_start_in_a_stream_of_runs_or_of_single_headers():
    from flightpart.io.pull import where_parts_start
    from flightpart.wire import PartHeader, PartRun

    runs = [(0, PartRun(((0, 0), (1, 0), (2, 0)), (10, 0, 5)).encode()), (15, PartRun(((3, 0),), (7,)).encode())]
    assert where_parts_start(runs) == ([(0, 0), (1, 0), (2, 0), (3, 0)], [0, 10, 10, 15])
    singles = [(0, PartHeader((4, 1)).encode()), (3, PartHeader((5, 1)).encode())]  # a node of an earlier release
    assert where_parts_start(singles) == ([(4, 1), (5, 1)], [0, 3])
    for lie in (b'{"parts":[[0,0]],"rows":[]}', b'{"parts":[],"rows":[]}', b"not json", b'{"parts":[[0,0]]}'):
        assert where_parts_start([(0, lie)]) == ([], [])
