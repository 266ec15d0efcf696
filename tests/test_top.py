"""``ORDER BY ... LIMIT`` runs on the nodes: ``Dataset.top`` and SQL over Flight send each partition's first rows,
not the table, and answer what pyarrow and DuckDB answer. Real nodes, every read remote."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightpart as fp
from flightpart.bench.queries import canonical, same_answer
from flightpart.bench.sql_queries import through_driver

dbapi = pytest.importorskip("adbc_driver_flightsql.dbapi", reason="adbc-driver-flightsql is in the test extra")

ROWS = 40_000


def rows_sent(cluster) -> int:
    with fp.connect(cluster.uri) as client:
        return sum(client.stats(n.uri)["rows_sent"] for n in cluster.nodes)


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
