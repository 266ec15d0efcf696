"""SQL at the catalog cannot look outside its datasets, and no error echoes much of what a client sent.

A real catalog process (its working directory one of the test's, so every path it could leak is known) and a
node; queries through flightpart's client, the ADBC Flight SQL driver and raw Flight calls. Each query that would
have DuckDB describe itself (its settings, its files, its state), at any depth and in any spelling, or read a file
by its path, is refused INVALID_REQUEST before it runs, and no answer names the catalog's working directory, its
temporary folder, its state or the home directory; the catalog answers afterwards.
"""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart import sqlwire
from flightpart.errors import MESSAGE_CHARS, QUOTED_CHARS, FlightpartError

dbapi = pytest.importorskip("adbc_driver_flightsql.dbapi", reason="adbc-driver-flightsql is in the test extra")

SETTING = "current_setting('temp_directory')"
DESCRIBING_ITSELF = [
    # the table functions that make rows, given DuckDB's descriptions of itself as arguments
    "SELECT * FROM unnest((SELECT list(value) FROM duckdb_settings()))",
    f"SELECT * FROM unnest([{SETTING}])",
    "SELECT * FROM unnest((SELECT [path] FROM duckdb_temporary_files()))",
    "SELECT * FROM json_each((SELECT to_json(list(value)) FROM duckdb_settings()))",
    "SELECT * FROM generate_series(1, (SELECT count(*) FROM duckdb_settings()))",
    f"SELECT * FROM range(length({SETTING}))",
    f"SELECT * FROM repeat({SETTING}, 1)",
    f"SELECT * FROM repeat_row({SETTING}, num_rows := 1)",
    f"SELECT * FROM json_tree(to_json({SETTING}))",
    "SELECT unnest((SELECT list(value) FROM duckdb_settings()))",
    # spellings: case, quoting, schemas, comments, nesting in expressions of every kind
    "SELECT * FROM unnest([COALESCE(NULL, Current_Setting('temp_directory'))])",
    "SELECT * FROM unnest([\"current_setting\"('temp_directory')])",
    "SELECT * FROM unnest([main.current_setting('temp_directory')])",
    "SELECT * FROM unnest([system.main.current_setting('temp_directory')])",
    "SELECT * FROM unnest([pg_catalog.current_setting('temp_directory')])",
    "SELECT * FROM unnest([/* a */ current_setting /* b */ ('temp_directory')]) -- c",
    f"SELECT * FROM unnest(list_transform([1], lambda x: {SETTING}))",
    f"SELECT list_reduce(['a', 'b'], lambda a, b: a || {SETTING})",
    f"SELECT * FROM unnest([CAST({SETTING} AS VARCHAR)])",
    f"SELECT * FROM unnest([{SETTING}::VARCHAR])",
    f"SELECT {{'a': {SETTING}}}",
    f"SELECT CASE WHEN true THEN {SETTING} END",
    f"SELECT first(x) OVER (PARTITION BY {SETTING}) FROM unnest([1]) t(x)",
    f"SELECT max(x) FILTER (WHERE {SETTING} IS NOT NULL) FROM unnest([1]) t(x)",
    f"SELECT * FROM unnest([1]) t(x) ORDER BY {SETTING}",
    f"SELECT * FROM unnest([1]) t(x) QUALIFY {SETTING} IS NOT NULL",
    "SELECT getvariable('x')",
    # subqueries, CTEs, lateral joins, set operations
    f"WITH c AS (SELECT * FROM unnest([{SETTING}])) SELECT * FROM c",
    f"SELECT (SELECT * FROM unnest([{SETTING}]))",
    f"SELECT * FROM range(1) r, LATERAL (SELECT * FROM unnest([{SETTING}]))",
    f"SELECT * FROM unnest([1]) t(x) WHERE x IN (SELECT unnest([length({SETTING})]))",
    "SELECT x FROM notes UNION ALL SELECT length(value) FROM duckdb_settings()",
    "SELECT sum(x) AS n FROM notes WHERE x IN (SELECT length(value) FROM pg_settings)",
    "VALUES ((SELECT value FROM duckdb_settings() LIMIT 1))",
    # DuckDB's functions and views under schemas and catalogs, in any case
    "SELECT * FROM main.duckdb_settings()",
    "SELECT * FROM system.main.duckdb_settings()",
    'SELECT * FROM "MAIN"."DUCKDB_SETTINGS"()',
    "SELECT * FROM pg_catalog.pg_settings",
    "SELECT * FROM system.pg_catalog.pg_settings",
    "SELECT * FROM unnest([1]) t JOIN duckdb_databases() d ON true",
    "SELECT * FROM unnest([1]), pragma_version()",
    "SELECT * FROM duckdb_logs_parsed('x')",
    "SELECT * FROM query('SELECT * FROM duckdb_settings()')",
    "SELECT * FROM query_table('duckdb_settings')",
    # SHOW and SUMMARIZE read settings and views too
    "SHOW temp_directory",
    'SHOW "Temp_Directory"',
    "SELECT * FROM (SHOW memory_limit)",
    f"SUMMARIZE SELECT {SETTING}",
    "SUMMARIZE pg_settings",
    "DESCRIBE SELECT * FROM duckdb_settings()",
    f"EXPLAIN SELECT * FROM unnest([{SETTING}])",
]
NOT_ONE_SELECT = [
    f"PREPARE p AS SELECT {SETTING}",
    "EXECUTE p",
    f"SELECT 1; SELECT {SETTING}",
    f"SELECT 1 /* ; */ ; SELECT * FROM unnest([{SETTING}])",
    "CALL duckdb_settings()",
    "PRAGMA version",
    "SET temp_directory = '/'",
]


@pytest.fixture(scope="module")
def confined(make_cluster, tmp_path_factory):
    """A catalog process whose working directory is the test's (with a file planted in its DuckDB's temporary
    folder, ``.tmp`` there), one node, a dataset ``notes``; (cluster, hidden paths, the planted file, its marker)."""
    home = tmp_path_factory.mktemp("catalog-home")
    marker = f"planted-{uuid.uuid4().hex}"
    planted = home / ".tmp" / "planted.csv"
    planted.parent.mkdir()
    planted.write_text(f"k,word\n1,{marker}\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(home)  # the daemons inherit it
        cluster = make_cluster(1, process=True)
    assert os.readlink(f"/proc/{cluster.catalog.pid}/cwd") == str(home)
    with fp.connect(cluster.uri) as client:
        client.put("notes", pa.table({"x": [1, 2, 3]}))
        client.put("notes.csv", pa.table({"x": [4, 5]}))  # a dataset whose name looks like a file is still a dataset
    hidden = (str(home), str(planted.parent), str(cluster.root), os.path.expanduser("~"))
    return cluster, hidden, planted, marker


def refusals(uri: str, sql: str, parameters: tuple | None = None) -> tuple[FlightpartError, Exception]:
    """``sql``'s refusal by flightpart's client and by the ADBC driver (``parameters`` bound through it: a prepared
    statement); a query that is answered fails the test, showing what it answered."""
    with fp.connect(uri) as client:
        try:
            got = client.sql(sql).to_arrow()
        except FlightpartError as exc:
            ours = exc
        else:
            pytest.fail(f"{sql!r} was answered: {got.to_pylist()[:5]}")
    with dbapi.connect(uri) as conn, conn.cursor() as cur:
        try:
            cur.execute(sql, parameters=parameters)
            got = cur.fetch_arrow_table()
        except dbapi.Error as exc:
            return ours, exc
    pytest.fail(f"{sql!r} was answered through ADBC: {got.to_pylist()[:5]}")


def assert_hides(hidden: tuple[str, ...], *texts: str) -> None:
    for text in texts:
        assert not any(path in text for path in hidden), text
        assert len(text) < 2 * MESSAGE_CHARS, text


def assert_still_answers(uri: str) -> None:
    with fp.connect(uri) as client:
        assert client.sql("SELECT sum(x) AS n FROM notes").to_arrow().column("n").to_pylist() == [6]


@pytest.mark.slow  # some 60 refused queries through two clients, against a catalog process
def test_duckdb_describing_itself_is_refused_at_any_depth_in_any_spelling(confined):
    """``duckdb_settings()`` or ``current_setting`` inside the arguments of ``unnest`` (or any row maker) had run and
    named the catalog's working directory: the check read a table function's arguments under a key DuckDB's parse
    no longer uses. Every spelling is refused INVALID_REQUEST before it runs, through both clients."""
    cluster, hidden, _planted, _marker = confined
    for sql in DESCRIBING_ITSELF:
        ours, adbc = refusals(cluster.uri, sql)
        assert ours.code == "INVALID_REQUEST" and "DuckDB describing or running itself" in str(ours), (sql, str(ours))
        assert "[flightpart INVALID_REQUEST" in str(adbc), (sql, str(adbc))
        assert_hides(hidden, str(ours), str(adbc))
    for sql in NOT_ONE_SELECT:
        ours, adbc = refusals(cluster.uri, sql)
        assert ours.code == "INVALID_REQUEST", (sql, str(ours))
        assert_hides(hidden, str(ours), str(adbc))
    # a prepared statement with parameters is checked as a query is
    ours, adbc = refusals(cluster.uri, f"SELECT CAST(? AS VARCHAR) || {SETTING} AS s", ("a",))
    assert ours.code == "INVALID_REQUEST" and "[flightpart INVALID_REQUEST" in str(adbc)
    assert_still_answers(cluster.uri)


def test_a_file_in_the_catalogs_temporary_folder_is_not_read_by_its_path(confined):
    """DuckDB with external access off still reads the files of its temporary folder when a table is named by a
    path: a file planted there is refused by every spelling of its path, and its content appears in no answer; a
    dataset whose name looks like a file, and the table functions that make rows, are still answered."""
    cluster, hidden, planted, marker = confined
    absolute, relative = str(planted), os.path.join(".tmp", planted.name)
    for sql in (f"SELECT * FROM '{relative}'", f"FROM '{absolute}'", f'SELECT * FROM "{absolute}"',
                f"SELECT * FROM '{planted.parent}/*.csv'", f"DESCRIBE '{absolute}'", f"SUMMARIZE '{absolute}'",
                f"SELECT (SELECT word FROM '{absolute}')", f"SELECT x FROM notes UNION ALL SELECT k FROM '{absolute}'",
                f"WITH f AS (FROM '{absolute}') SELECT * FROM f", f"SELECT * FROM notes, LATERAL (FROM '{absolute}')",
                f"SELECT sum(x) AS n FROM notes WHERE x IN (SELECT k FROM '{absolute}')",
                f"SELECT * FROM read_csv('{absolute}')", f"SELECT * FROM read_text('{absolute}')",
                f"SELECT * FROM read_blob('{relative}')", f"SELECT * FROM glob('{planted.parent}/*')",
                f"SELECT * FROM unnest((SELECT list(file) FROM glob('{planted.parent}/*')))"):
        ours, adbc = refusals(cluster.uri, sql)
        assert ours.code == "INVALID_REQUEST", (sql, str(ours))
        assert "[flightpart INVALID_REQUEST" in str(adbc), (sql, str(adbc))
        assert marker not in str(ours) and marker not in str(adbc)
        assert_hides(hidden, str(ours), str(adbc))
    # what the check lets through: datasets (one whose name looks like a file), WITH queries, the row makers,
    # lambdas, SHOW of a dataset, information_schema
    with fp.connect(cluster.uri) as client:
        for sql, want in (('SELECT sum(x) AS n FROM "notes.csv"', [9]),
                          ("SELECT sum(x) AS n FROM notes WHERE x IN (SELECT * FROM range(3))", [3]),
                          ("SELECT count(*) AS n FROM unnest([1, 2, 3])", [3]),
                          ("SELECT count(*) AS n FROM generate_series(1, 4)", [4]),
                          ("SELECT count(*) AS n FROM repeat_row(1, num_rows := 2)", [2]),
                          ("SELECT count(*) AS n FROM json_each('[1, 2]')", [2]),
                          ("SELECT count(*) AS n FROM json_tree('[1]')", [2]),
                          ("SELECT count(*) AS n FROM repeat('a', 5)", [5]),
                          ('WITH "a.csv" AS (SELECT x FROM notes) SELECT sum(x) AS n FROM "a.csv"', [6]),
                          ("SELECT sum(list_sum(list_transform([x], lambda v: v * 2))) AS n FROM notes", [12]),
                          ("SELECT count(*) AS n FROM information_schema.tables WHERE table_name = 'notes'", [1])):
            assert client.sql(sql).to_arrow().column("n").to_pylist() == want, sql
        assert client.sql("SHOW notes").to_arrow().column("column_name").to_pylist() == ["x"]


def test_errors_never_echo_more_than_a_bounded_part_of_what_a_client_sent(confined):
    """A 64 KiB type URL in a Flight SQL command had been echoed whole into the error, past the client's limit of
    16 KiB for a status (the client saw gRPC's RESOURCE_EXHAUSTED, no code); a huge query, name or parameter is
    quoted by DuckDB's messages. Every error keeps at most a short run of what was sent, and its code."""
    cluster, hidden, _planted, _marker = confined
    raw = flight.FlightClient(cluster.uri)
    long_url = sqlwire.PACKAGE + sqlwire.STATEMENT_QUERY + "x" * (64 << 10)
    command = sqlwire.message((1, long_url), (2, sqlwire.message((1, "SELECT 1"))))
    descriptor = flight.FlightDescriptor.for_command(command)
    for call in (raw.get_flight_info, raw.get_schema):
        with pytest.raises(pa.ArrowException) as refused:
            call(descriptor)
        text = str(refused.value)
        assert "[flightpart INVALID_REQUEST at command]" in text, text[:300]
        assert "x" * (QUOTED_CHARS + 1) not in text and len(text) < 2 * MESSAGE_CHARS, text[:300]
    with fp.connect(cluster.uri) as client:
        for sql, echoed in (('SELECT * FROM "' + "t" * 1_000_000 + '"', "t"),  # a 1 MB query naming no dataset
                            ("SELECT CAST('" + "a" * 1_000_000 + "' AS INTEGER)", "a"),
                            ("SELECT " + "q" * 500_000 + " FROM notes", "q")):
            with pytest.raises(FlightpartError) as refused:
                client.sql(sql).to_arrow()
            assert refused.value.code in ("INVALID_REQUEST", "DATASET_NOT_FOUND"), str(refused.value)[:300]
            assert echoed * (QUOTED_CHARS + 1) not in str(refused.value), str(refused.value)[:600]
            assert len(str(refused.value)) <= MESSAGE_CHARS
            assert_hides(hidden, str(refused.value))
        with pytest.raises(FlightpartError) as refused:
            client.open("n" * (64 << 10))
        assert refused.value.code == "INVALID_NAME" and "n" * (QUOTED_CHARS + 1) not in str(refused.value)
    with dbapi.connect(cluster.uri) as conn, conn.cursor() as cur:  # a 1 MB parameter DuckDB cannot convert
        with pytest.raises(dbapi.Error) as refused:
            cur.execute("SELECT CAST(? AS INTEGER) AS n", parameters=("p" * 1_000_000,))
            cur.fetch_arrow_table()
        text = str(refused.value)
        assert "[flightpart INVALID_REQUEST" in text and "p" * (QUOTED_CHARS + 1) not in text, text[:600]
        assert len(text) < 2 * MESSAGE_CHARS
    assert_still_answers(cluster.uri)
