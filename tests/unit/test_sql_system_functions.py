"""What a query at the catalog may name (flightpart/sql/system_functions.py), against a real DuckDB configured as the
gateway's: every spelling of DuckDB describing itself or of a file is refused, and what is refused is never run;
ordinary queries pass and DuckDB answers them."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from flightpart.sql.system_functions import refusal, sqlglot_refusal, walk_understood

DATASETS = {"sales", "sales.csv"}


@pytest.fixture(scope="module")
def con():
    with duckdb.connect(config={"enable_external_access": False, "memory_limit": "1GB",
                                "lock_configuration": True}) as made:
        for name in DATASETS:
            made.register(name, pa.table({"x": [1, 2]}))
        yield made


@pytest.mark.parametrize("sql", [
    "SELECT * FROM unnest([current_setting('temp_directory')])",
    "SELECT * FROM unnest((SELECT list(value) FROM duckdb_settings()))",
    "SELECT * FROM json_each((SELECT to_json(list(value)) FROM duckdb_settings()))",
    "SELECT * FROM repeat_row(current_setting('temp_directory'), num_rows := 1)",
    "SELECT * FROM range(length(current_setting('threads')))",
    "SELECT * FROM unnest(list_transform([1], lambda x: current_setting('threads')))",
    "SELECT * FROM unnest([COALESCE(NULL, CURRENT_SETTING('threads'))])",
    "SELECT * FROM unnest([system.main.current_setting('threads')])",
    "SELECT * FROM unnest([\"current_setting\"('threads')])",
    "SELECT first(x) OVER (PARTITION BY current_setting('threads')) FROM unnest([1]) t(x)",
    "SELECT * FROM range(1) r, LATERAL (SELECT * FROM unnest([current_setting('threads')]))",
    "WITH c AS (SELECT * FROM unnest([current_setting('threads')])) SELECT * FROM c",
    "SELECT (SELECT * FROM unnest([current_setting('threads')]))",
    "SELECT * FROM 'MAIN'.duckdb_settings()",
    'SELECT * FROM "system"."main"."DuckDB_Settings"()',
    "SELECT * FROM pg_catalog.pg_settings",
    "SELECT * FROM unnest((SELECT list(setting) FROM pg_settings))",
    "SELECT getvariable('x')",
    "SHOW temp_directory",
    "SHOW worker_threads",
    "SELECT * FROM (SHOW memory_limit)",
    "SUMMARIZE pg_settings",
    "SELECT * FROM '.tmp/x.csv'",
    "SELECT * FROM '/tmp/x.csv'",
    "DESCRIBE '.tmp/x.csv'",
    "SELECT * FROM unnest([1]) WHERE 1 IN (SELECT a FROM '.tmp/*.csv')",
    "SELECT * FROM read_csv('.tmp/x.csv')",
    "SELECT * FROM unnest((SELECT list(file) FROM glob('.tmp/*')))",
    "SELECT * FROM query('SELECT 1')",
    "SELECT * FROM duckdb_logs_parsed('x')",
])
def test_every_spelling_of_duckdb_describing_itself_or_of_a_file_is_refused(con, sql):
    why = refusal(con, sql, DATASETS.__contains__)
    assert why is not None, sql
    assert "/" not in why.replace("file path", ""), why  # no path, not even the one the query named


@pytest.mark.parametrize("sql", [
    "SELECT * FROM sales", 'SELECT * FROM "sales.csv"', "SHOW sales", "SUMMARIZE sales",
    "SELECT * FROM unnest([1, 2]) t(x) WHERE x IN (SELECT * FROM range(3))",
    "SELECT * FROM json_each('[1, 2]')", "SELECT * FROM repeat_row(1, num_rows := 2)",
    "SELECT list_transform([1, 2], lambda x: x + 1)", "SELECT 'a' GLOB 'a*'",
    'WITH "a.csv" AS (SELECT 1 AS x) SELECT * FROM "a.csv"', "SELECT * FROM information_schema.tables",
])
def test_ordinary_queries_pass_and_duckdb_answers_them(con, sql):
    assert refusal(con, sql, DATASETS.__contains__) is None
    con.sql(sql).fetchall()


def test_the_walk_understands_this_duckdbs_parse_and_sqlglot_is_a_second_opinion():
    """The walk finds each name of a query naming one of each kind (a DuckDB whose parse moved a function's arguments
    under another key had hidden them); sqlglot's parse alone refuses DuckDB's table functions and setting readers."""
    assert walk_understood()
    for sql in ("SELECT * FROM duckdb_settings()", "SELECT * FROM read_csv('x')", "SELECT * FROM glob('*')",
                "SELECT * FROM unnest([current_setting('x')])",
                "SELECT list_transform([1], lambda v: getvariable('x'))"):
        assert sqlglot_refusal(sql) is not None, sql
    for sql in ("SELECT * FROM range(3)", "SELECT * FROM generate_series(1, 2)", "SELECT * FROM unnest([1])",
                "SELECT * FROM repeat(1, 2)", "SELECT * FROM json_tree('[1]')", "SELECT repeat('a', 2)"):
        assert sqlglot_refusal(sql) is None, sql
