"""Long IN lists and OR chains from Polars, DuckDB, SQL and text filters give the engine's own answer: an is_in
of 50 values from Polars took 20 GB (its OR chain cost twice as much to send per value), one of 5,000 pushed by
DuckDB passed the reader and was refused by the node. Readers run in a child process with a memory limit; the
cluster's daemons are processes of their own, and the catalog answers SQL after every query."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa

import flightpart as fp

PROCESS_CLUSTER = True


def test_long_in_lists_from_polars_and_duckdb_give_their_answers(cluster):
    with fp.connect(cluster.uri) as writer:
        writer.put("long-in", pa.table({"a": np.arange(60_000), "f": np.arange(60_000) / 2}), tiling=(3, 1))
    script = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
        import duckdb, polars as pl, flightpart as fp
        with fp.connect({cluster.uri!r}, host="127.0.0.9") as client:
            ds = client.open("long-in")
            for n in (50, 3_000):
                values = [k * 7 for k in range(n)]
                got = ds.to_polars(lazy=True).filter(pl.col("a").is_in(values)).select(pl.len()).collect().item()
                floats = ds.to_polars(lazy=True).filter(pl.col("f").is_in([v / 2 for v in values[:40]])).select(pl.len())
                print("polars", n, got, floats.collect().item())
            for n in (1_000, 5_000):
                con = duckdb.connect()
                con.register("scan", ds.duckdb_scan())
                listed = ",".join(str(k * 7) for k in range(n))
                print("duckdb", n, con.sql(f"SELECT count(*) FROM scan WHERE a IN ({{listed}})").fetchall()[0][0])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    lines = done.stdout.split("\n")
    assert "polars 50 50 40" in lines and "polars 3000 3000 40" in lines, done.stdout
    assert "duckdb 1000 1000" in lines and "duckdb 5000 5000" in lines, done.stdout


def test_sql_and_text_filters_with_long_or_chains_answer(cluster):
    with fp.connect(cluster.uri) as client:
        client.put("long-or", pa.table({"a": np.arange(10_000), "f": np.arange(10_000) / 2}), tiling=(2, 1))
        chain = " OR ".join(f"a = {k}" for k in range(40))
        floats = "f IN (" + ", ".join(f"{k / 2}" for k in range(40)) + ")"
        for where in (chain, floats, " AND ".join(f"a > {k}" for k in range(45))):
            answer = client.sql(f'SELECT count(*) AS n FROM "long-or" WHERE {where}').to_arrow()
            expected = 9_955 if " AND " in where else 40
            assert answer.column("n").to_pylist() == [expected], where[:60]
            assert client.open("long-or").filter(where).to_arrow().num_rows == expected
        assert client.sql('SELECT count(*) AS n FROM "long-or"').to_arrow().column("n").to_pylist() == [10_000]
