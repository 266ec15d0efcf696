"""``ORDER BY ... LIMIT`` runs on the nodes: ``Dataset.top`` and SQL over Flight send each partition's first rows,
not the table, and answer what pyarrow and DuckDB answer. Real nodes, every read remote."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart.bench.queries import canonical, same_answer
from flightpart.bench.sql_queries import through_driver

from helpers import code_of

dbapi = pytest.importorskip("adbc_driver_flightsql.dbapi", reason="adbc-driver-flightsql is in the test extra")

ROWS = 40_000


def rows_sent(cluster) -> int:
    with fp.connect(cluster.uri) as client:
        return sum(client.stats(n.uri).values["rows_sent"] for n in cluster.nodes)


@pytest.fixture(scope="module")
def scores(cluster):
    rng = np.random.default_rng(5)
    score = rng.normal(size=ROWS)
    score[rng.random(ROWS) < 0.01] = np.nan
    table = pa.table({"id": np.arange(ROWS), "score": pa.array(score, mask=rng.random(ROWS) < 0.02),
                      "team": pa.array([f"t{k}" for k in rng.integers(0, 30, ROWS)]), "w": rng.random(ROWS)})
    with fp.connect(cluster.uri) as writer:
        writer.put("scores", table, tiling=(8, 1))
        writer.put("scores-wide", table, tiling=(4, 2))
    return table


def test_top_answers_what_sort_by_answers_and_moves_a_limit_per_partition(cluster, scores):
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("scores")
        before = rows_sent(cluster)
        got = ds.top(10, [("score", "descending", "at_start"), ("id", "ascending")])
        moved = rows_sent(cluster) - before
        assert got.equals(scores.sort_by([("score", "descending", "at_start"), ("id", "ascending")]).slice(0, 10))
        nan = int(np.isnan(scores.column("score").to_numpy(zero_copy_only=False)).sum())
        assert moved <= 8 * 10 + nan, f"{moved} rows moved"
        kept = ds.filter("team = 't3'").select(["id", "score", "team"])
        want = scores.filter(pc.field("team") == "t3").select(["id", "score", "team"])
        assert kept.top(5, "id").equals(want.sort_by("id").slice(0, 5))
        assert ds[100:300].top(3, ("id", "descending")).column("id").to_pylist() == [299, 298, 297]
        wide = client.open("scores-wide")  # the view spans two column groups: each block read, cut here
        assert wide.top(4, ["w"]).equals(scores.sort_by("w").slice(0, 4))
        with pytest.raises(ValueError, match="unknown column"):
            ds.top(3, "nope")


@pytest.mark.parametrize("sql", [
    "SELECT id, score FROM scores ORDER BY score DESC, id LIMIT 7",
    "SELECT id, score * 2 AS double FROM scores WHERE team <> 't1' ORDER BY score NULLS FIRST, id LIMIT 5 OFFSET 4",
    "SELECT * FROM scores ORDER BY team DESC, w LIMIT 12",
])
def test_sql_order_by_limit_answers_what_duckdb_answers_and_moves_a_limit_per_partition(cluster, scores, sql):
    import duckdb

    con = duckdb.connect()
    con.register("scores", scores)
    want = con.sql(sql).to_arrow_table()
    with dbapi.connect(cluster.uri) as conn:
        before = rows_sent(cluster)
        got = through_driver(conn, sql)
        moved = rows_sent(cluster) - before
    assert got.schema.equals(want.schema) and same_answer(canonical(got), canonical(want))
    assert moved < ROWS // 20, f"{moved} rows moved for a top-N over 8 partitions"


@pytest.fixture(scope="module")
def labelled(make_cluster):
    """Nodes as processes (a key pyarrow cannot order used to kill a node with SIGSEGV: it must not take the test
    with it), and a dataset with a dictionary-encoded key and a list column, two replicas of each partition."""
    made = make_cluster(2, process=True)
    rng = np.random.default_rng(11)
    rows = 6_000
    table = pa.table({"id": np.arange(rows),
                      "team": pa.array([f"t{k:02d}" for k in rng.integers(0, 40, rows)]).dictionary_encode(),
                      "tags": pa.array([[int(k)] for k in rng.integers(0, 9, rows)]), "w": rng.random(rows)})
    with fp.connect(made.uri) as writer:
        writer.put("labelled", table, tiling=(4, 1), replicas=2)
    return made, table


def alive(made) -> bool:
    return all(n.proc.poll() is None for n in made.nodes)


def sql_answers_as_duckdb(made, table: pa.Table, query: str) -> bool:
    """Whether ``query`` over Flight SQL answers what DuckDB answers over ``table`` registered as ``labelled``."""
    import duckdb

    con = duckdb.connect()
    con.register("labelled", table)
    with dbapi.connect(made.uri) as conn:
        return same_answer(canonical(through_driver(conn, query)), canonical(con.sql(query).to_arrow_table()))


def test_top_by_a_dictionary_column_orders_by_its_values_on_every_path(labelled):
    made, table = labelled
    decoded = table.set_column(1, "team", table.column("team").cast(pa.string()))
    by = [("team", "descending"), ("id", "ascending")]
    want = decoded.sort_by(by).slice(0, 9)
    with fp.connect(made.uri, host="127.0.0.99") as client:  # every partition streamed
        got = client.open("labelled").top(9, by)
        assert (got.column("id").equals(want.column("id"))
                and got.column("team").cast(pa.string()).equals(want.column("team")))
    host = made.nodes[0].uri.split("//")[1].rsplit(":", 1)[0]
    with fp.connect(made.uri, host=host) as client:  # one node's partitions read on its own host
        assert client.open("labelled").top(9, by).column("id").equals(want.column("id"))
    assert sql_answers_as_duckdb(made, table, "SELECT id, team FROM labelled ORDER BY team DESC, id LIMIT 9")
    assert alive(made)


def test_a_key_rows_cannot_be_ordered_by_is_refused_with_a_code_and_every_node_keeps_serving(labelled):
    from flightpart import wire

    made, table = labelled
    with fp.connect(made.uri, host="127.0.0.99") as client:
        ds = client.open("labelled")
        with pytest.raises(ValueError, match="cannot be ordered by 'tags'"):
            ds.top(3, "tags")
        # a client that sends the ticket anyway: refused by each node, which goes on serving
        ticket = wire.Ticket("labelled", ds.version, (0, 0), top=wire.TopRows((wire.SortKey("tags"),), 3))
        for node in made.nodes:
            with pytest.raises(flight.FlightError) as caught:
                flight.connect(node.uri).do_get(flight.Ticket(ticket.encode())).read_all()
            assert code_of(caught.value) == "INVALID_REQUEST" and "cannot be ordered by 'tags'" in str(caught.value)
        assert alive(made)
        assert ds.top(2, "id").column("id").to_pylist() == [0, 1]
    # SQL orders by what DuckDB can order: answered whole, as DuckDB answers it
    assert sql_answers_as_duckdb(made, table, "SELECT id, tags FROM labelled ORDER BY tags DESC, id LIMIT 4")
    assert alive(made)
