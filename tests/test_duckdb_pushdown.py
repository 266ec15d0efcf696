"""DuckDB over a dataset reads only the columns a query uses and, where DuckDB pushes them, only the rows its
filters keep: measured by the nodes' own counters, from a reader on a host of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import duckdb
import pytest

import flightpart as fp
from flightpart.bench.queries import QUESTIONS, canonical, taxi_table


@pytest.fixture(scope="module")
def trips(cluster):
    table = taxi_table(200_000, seed=3)
    with fp.connect(cluster.uri) as writer:
        writer.put("duck-trips", table, tiling=(6, 1))
    with fp.connect(cluster.uri, host="127.0.0.9") as reader:  # every partition crosses a socket
        yield table, reader, reader.open("duck-trips")


def sent(client, cluster) -> int:
    return sum(client.stats(node.uri).values["bytes_sent"] for node in cluster.nodes)


@pytest.mark.parametrize("question", sorted(QUESTIONS))
def test_every_question_gives_duckdbs_answer_over_the_table_and_moves_less_than_the_whole_stream(
        trips, cluster, question):
    table, client, ds = trips
    con = duckdb.connect()
    con.register("scan", ds.duckdb_scan())
    con.register("local", table)
    before = sent(client, cluster)
    got = con.sql(QUESTIONS[question].format(t="scan")).fetchall()
    moved = sent(client, cluster) - before
    assert canonical(got) == canonical(con.sql(QUESTIONS[question].format(t="local")).fetchall())
    assert moved < 0.35 * table.nbytes, f"{question}: {moved:,} bytes moved of a {table.nbytes:,}-byte dataset"


def test_a_timestamp_range_reaches_the_nodes_as_a_filter(trips, cluster):
    table, client, ds = trips
    rel = ds.to_duckdb(duckdb.connect())
    before = sent(client, cluster)
    week = rel.filter("pickup_at >= TIMESTAMP '2024-01-08' AND pickup_at < TIMESTAMP '2024-01-15'").aggregate(
        "count(*)")
    count = week.fetchall()[0][0]
    moved = sent(client, cluster) - before
    one_column = table.column("pickup_at").nbytes
    assert 0 < count < table.num_rows and moved < 0.5 * one_column, (count, moved, one_column)


def test_the_relation_answers_again_and_again(trips):
    _table, _client, ds = trips
    rel = ds.to_duckdb(duckdb.connect())
    first = rel.aggregate("sum(passengers)").fetchall()
    assert rel.aggregate("sum(passengers)").fetchall() == first


def test_the_scan_refuses_pyarrows_own_methods_without_crashing(cluster):
    script = textwrap.dedent(f"""
        import pyarrow as pa, flightpart as fp
        with fp.connect({cluster.uri!r}) as client:
            ds = client.put("duck-refuse", pa.table({{"a": [1, 2]}}))
            scan = ds.duckdb_scan()
            for call in (lambda: scan.to_table(), lambda: scan.count_rows(), lambda: scan.head(1),
                         lambda: scan.get_fragments(), lambda: scan.partition_expression, lambda: scan.take([0])):
                try:
                    call()
                except TypeError as exc:
                    assert "flightpart dataset" in str(exc)
                else:
                    raise SystemExit("not refused")
            print(scan.schema.names, repr(scan)[:30])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "['a']" in done.stdout
