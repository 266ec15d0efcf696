"""Small partitions are read several to a stream (one stream per holder and column group), and read back exactly;
dictionary columns, slices and filters are still read one partition per stream. Aggregates and first rows of
partitions of any size share a stream per holder (up to 16 partitions a stream). Real nodes, every read remote."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightpart as fp


def streams(client, cluster) -> int:
    return sum(client.stats(node.uri).values["get_streams"] for node in cluster.nodes)


def table(rows: int) -> pa.Table:
    return pa.table({"k": np.arange(rows), "s": [f"v{k % 7}" for k in range(rows)], "x": np.arange(rows) * 0.5})


def stored(cluster, name: str, source: pa.Table, tiling: tuple[int, int]) -> None:
    with fp.connect(cluster.uri) as writer:
        writer.put(name, source, tiling=tiling)


def chunks_of(uri: str, ticket) -> list:
    """Every chunk (batch and its metadata) a node sends for ``ticket``, as any Flight reader gets them."""
    import pyarrow.flight as flight

    reader = flight.connect(uri).do_get(flight.Ticket(ticket.encode()))
    chunks = []
    while True:
        try:
            chunks.append(reader.read_chunk())
        except StopIteration:
            return chunks


def first_holder(client, name: str):
    """(dataset, its partitions, the uri of the node that serves partition (0, 0) first)."""
    ds = client.open(name)
    parts = ds.__partitioned__["partitions"]
    return ds, parts, parts[(0, 0)]["data"].replicas[0][0]


def test_three_hundred_small_partitions_come_back_in_a_stream_per_node(cluster):
    source = table(3_000)
    stored(cluster, "small-many", source, (300, 1))
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("small-many")
        before = streams(client, cluster)
        assert ds.to_arrow().equals(source)
        assert streams(client, cluster) - before == len(cluster.nodes)
        assert ds.select(["s"]).to_arrow().equals(source.select(["s"]))
        d = ds.__partitioned__
        got = d["get"]([d["partitions"][(i, 0)]["data"] for i in (5, 3, 299, 0)])  # any order, as asked
        assert [t.column("k")[0].as_py() for t in got] == [50, 30, 2990, 0] and all(t.num_rows == 10 for t in got)


def test_slices_filters_and_column_groups_read_exactly_as_before(cluster):
    source = table(2_000)
    stored(cluster, "small-grid", source, (200, 2))
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("small-grid")
        before = streams(client, cluster)
        assert ds.to_arrow().equals(source)
        assert streams(client, cluster) - before <= 2 * len(cluster.nodes)  # a stream per node and column group
        assert ds[5:1_505].to_arrow().equals(source.slice(5, 1_500))
        kept = (pc.field("k") > 1_000) & (pc.field("x") < 1_200.0)  # columns of both groups: filtered at the reader
        assert ds.filter(kept).to_arrow().equals(source.filter(kept))


def test_dictionary_columns_are_read_one_partition_per_stream(cluster):
    source = table(300).set_column(1, "s", pc.dictionary_encode(table(300).column("s")))
    stored(cluster, "small-dict", source, (30, 1))
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        before = streams(client, cluster)
        back = client.open("small-dict").to_arrow()
        assert streams(client, cluster) - before == 30
        assert back.column("s").to_pylist() == source.column("s").to_pylist()


def test_a_lying_ticket_for_several_partitions_gets_a_code_and_the_node_serves_on(cluster):
    """Partitions the node does not hold are refused before the stream starts; partitions of two column groups
    in one stream end it with a coded error, not a traceback; the node keeps serving."""
    import pyarrow.flight as flight

    from flightpart.wire import Ticket

    from helpers import code_of

    source = table(400)
    stored(cluster, "small-lies", source, (4, 2))
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds, parts, uri = first_holder(client, "small-lies")
        other_group = next(p for p, e in parts.items() if p[1] == 1 and e["data"].replicas[0][0] == uri)
        node = flight.connect(uri)
        for more, code in ((((9, 0),), "PARTITION_MISSING"), ((other_group,), "INVALID_REQUEST")):
            ticket = Ticket("small-lies", ds.version, (0, 0), more=more)
            with pytest.raises(flight.FlightError) as info:
                node.do_get(flight.Ticket(ticket.encode())).read_all()
            assert code_of(info.value) == code, more
        assert ds.to_arrow().equals(source)


def test_a_stream_of_several_sends_runs_of_partitions_as_few_batches(cluster):
    """300 ten-row partitions of one node come as one batch (a PartRun naming them all), not 300; any Flight
    reader can cut them back by the row counts it lists."""

    from flightpart.wire import PartRun, Ticket

    source = table(3_000)
    stored(cluster, "small-runs", source, (300, 1))
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds, parts, uri = first_holder(client, "small-runs")
        mine = sorted(p for p, e in parts.items() if e["data"].replicas[0][0] == uri)
        chunks = chunks_of(uri, Ticket("small-runs", ds.version, mine[0], more=tuple(mine[1:])))
    assert len(chunks) < len(mine) // 10
    run = PartRun.decode(chunks[0].app_metadata.to_pybytes())
    assert list(run.parts[:3]) == mine[:3] and set(run.rows) == {10}
    back = pa.Table.from_batches([c.data for c in chunks])
    assert back.column("k").to_pylist() == [k for i, _j in mine for k in range(10 * i, 10 * i + 10)]


def test_runs_split_at_the_batch_size_and_keep_empty_partitions(cluster):
    """Partitions near the 1 MiB line fill several runs; partitions of no rows keep their place."""
    wide = pa.table({f"c{n}": np.arange(60_000, dtype=np.float64) + n for n in range(16)})  # 7.7 MB: 8 of 0.96 MB
    stored(cluster, "small-heavy", wide, (8, 1))
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        before = streams(client, cluster)
        assert client.open("small-heavy").to_arrow().equals(wide)
        assert streams(client, cluster) - before <= len(cluster.nodes)
    empty_tail = table(5)
    stored(cluster, "small-empty", empty_tail, (10, 1))  # five partitions of one row, five of none
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("small-empty")
        assert ds.to_arrow().equals(empty_tail)
        d = ds.__partitioned__
        got = d["get"]([d["partitions"][(i, 0)]["data"] for i in range(10)])
        assert [t.num_rows for t in got] == [p["shape"][0] for _pos, p in sorted(d["partitions"].items())]


def holders(ds) -> dict[str, int]:
    """How many of the dataset's partitions each node serves first."""
    counts: dict[str, int] = {}
    for part in ds.__partitioned__["partitions"].values():
        uri = part["data"].replicas[0][0]
        counts[uri] = counts.get(uri, 0) + 1
    return counts


def test_aggregates_and_first_rows_come_back_in_a_stream_per_node_and_sixteen_partitions(cluster):
    from flightpart.client.fetch import ANSWERS_PER_STREAM

    source = table(80_000)  # forty partitions of 2,000 rows: none small, each answered by its node
    stored(cluster, "answers-many", source, (40, 1))
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("answers-many")
        per_node = sum(-(-n // ANSWERS_PER_STREAM) for n in holders(ds).values())
        assert per_node < 40
        before = streams(client, cluster)
        got = ds.aggregate([("x", "sum"), ("k", "max")], by="s").sort_by("s")
        assert streams(client, cluster) - before == per_node
        want = source.group_by("s").aggregate([("x", "sum"), ("k", "max")]).sort_by("s")
        assert got.select(want.column_names).equals(want)
        before = streams(client, cluster)
        top = ds.top(5, [("x", "descending")])
        assert streams(client, cluster) - before == per_node
        assert top.column("k").to_pylist() == list(range(79_999, 79_994, -1))
        kept = pc.field("s") == "v3"  # no partition wholly kept or wholly left: each node filters its own
        filtered = ds.filter(kept)
        assert filtered.aggregate([("x", "sum")]).column(0)[0].as_py() == pc.sum(source.filter(kept)["x"]).as_py()
        assert filtered.top(3, "k").column("k").to_pylist() == [3, 10, 17]


def test_a_node_asked_for_a_row_range_of_several_partitions_refuses_with_a_code(cluster):
    import pyarrow.flight as flight

    from flightpart.wire import Aggregate, Ticket

    from helpers import code_of

    stored(cluster, "answers-lies", table(4_000), (4, 1))
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds, parts, uri = first_holder(client, "answers-lies")
        count = Aggregate((("k", "count"),))
        for asked in (dict(rows=(0, 5)), dict(row_numbers=True)):
            raw = Ticket("answers-lies", ds.version, (0, 0), more=((1, 0),), **asked).encode()
            with pytest.raises(flight.FlightError) as info:
                flight.connect(uri).do_get(flight.Ticket(raw)).read_all()
            assert code_of(info.value) == "INVALID_REQUEST", asked
        assert ds.aggregate([("k", "count")]).column(0)[0].as_py() == 4_000
        mine = sorted(p for p, e in parts.items() if e["data"].replicas[0][0] == uri)
        chunks = chunks_of(uri, Ticket("answers-lies", ds.version, mine[0], more=tuple(mine[1:]), aggregate=count))
        # each partition's answer is sent as soon as it is worked out: a batch each, the reader never waits for all
        assert [c.data.column(0).to_pylist() for c in chunks] == [[1_000]] * len(mine)
