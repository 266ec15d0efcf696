"""``--sql-through-catalog``: every Flight SQL answer comes from the catalog at one endpoint, so a client that reads
only the first endpoint, at the server it connected to, gets all of it; without it a plain scan's endpoints name
the nodes, and redeeming one at the catalog is refused saying what to do."""

from __future__ import annotations

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart import sqlwire as proto

TABLE = pa.table({"k": [i % 3 for i in range(600)], "v": [float(i) for i in range(600)]})
SCAN = "SELECT k, v FROM trips WHERE v >= 100"


@pytest.fixture(scope="module")
def through(make_cluster):
    cluster = make_cluster(2, process=True, catalog_args=["--sql-through-catalog"])
    with fp.connect(cluster.uri) as client:
        client.put("trips", TABLE, tiling=(4, 1))
    return cluster


@pytest.fixture(scope="module")
def direct(make_cluster):
    cluster = make_cluster(2)
    with fp.connect(cluster.uri) as client:
        client.put("trips", TABLE, tiling=(4, 1))
    return cluster


def info_of(uri: str, query: str) -> tuple[flight.FlightClient, flight.FlightInfo]:
    client = flight.connect(uri)
    descriptor = flight.FlightDescriptor.for_command(proto.pack(proto.STATEMENT_QUERY, proto.message((1, query))))
    return client, client.get_flight_info(descriptor)


def test_a_plain_scan_is_one_endpoint_at_the_catalog_holding_every_row(through):
    client, info = info_of(through.uri, SCAN)
    assert len(info.endpoints) == 1
    assert [loc.uri.decode() for loc in info.endpoints[0].locations] in ([], [through.uri])
    first_only = client.do_get(info.endpoints[0].ticket).read_all()  # as a client that reads endpoints[0] here
    assert first_only.sort_by("v").equals(TABLE.filter(pc.field("v") >= 100))


def test_adbc_and_the_client_read_every_query_from_the_catalog(through):
    with flight_sql.connect(through.uri) as conn, conn.cursor() as cur:
        cur.execute(SCAN)
        assert cur.fetch_arrow_table().num_rows == 500
        cur.execute("SELECT k, count(*) AS n FROM trips GROUP BY k ORDER BY k")
        assert cur.fetch_arrow_table().to_pylist() == [{"k": k, "n": 200} for k in range(3)]
    with fp.connect(through.uri) as client:
        assert client.sql(SCAN).to_arrow().num_rows == 500


def test_without_it_a_scan_is_read_from_the_nodes_and_the_catalog_says_what_to_do(direct):
    client, info = info_of(direct.uri, SCAN)
    assert len(info.endpoints) == 4
    assert all(loc.uri.decode() != direct.uri for e in info.endpoints for loc in e.locations)
    with pytest.raises(pa.ArrowException, match="--sql-through-catalog"):
        client.do_get(info.endpoints[0].ticket).read_all()


def test_a_scan_larger_than_an_answer_may_be_is_refused_and_the_catalog_lives(make_cluster):
    """Through the catalog, a plain scan is an answer the catalog holds: past FLIGHTPART_SQL_ANSWER_BYTES it is refused
    LIMIT_EXCEEDED as its first batch past the bound is produced, and the next query is answered."""
    cluster = make_cluster(2, process=True, catalog_args=["--sql-through-catalog"],
                           env={"FLIGHTPART_SQL_ANSWER_BYTES": "1MiB"})
    big = pa.table({"v": pa.array(range(2_000_000), pa.int64())})  # 16 MB of values
    with fp.connect(cluster.uri) as client:
        client.put("big", big, tiling=(4, 1))
    with flight_sql.connect(cluster.uri) as conn:
        with conn.cursor() as cur, pytest.raises(flight_sql.Error) as refused:
            cur.execute("SELECT v FROM big")
            cur.fetch_arrow_table()
        assert "the most an answer may have" in str(refused.value)  # ADBC shows the message, not the code
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) AS n FROM big")
            assert cur.fetch_arrow_table().to_pylist() == [{"n": 2_000_000}]
