"""Which parts of a query are answered first at the catalog (IN subqueries as literal lists, aggregated WITH queries
and derived tables as tables), and what is left untouched. No cluster needed: the answers are given."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightpart.sql.inlined import ANSWERED, MAX_VALUES, inline

KNOWN = {"trips", "zones"}


def _values(answers: dict[str, pa.Table | None]):
    """A ``values`` callback answering by the subquery's text (None: it cannot run alone)."""
    def values(sql: str) -> pa.Table | None:
        for inner, answer in answers.items():
            if f"({inner})" in sql:
                return answer
        raise AssertionError(f"unexpected subquery {sql}")
    return values


def _no_table(sql: str, name: str) -> None:
    return None


def test_an_in_subquery_becomes_the_list_of_its_values():
    inner = "SELECT zone FROM zones WHERE borough = 'Queens'"
    query, parts = inline(f"SELECT count(*) FROM trips WHERE fare > 3 AND pickup_zone IN ({inner})", KNOWN,
                          _values({inner: pa.table({"zone": ["JFK Airport", "Hell's Kitchen"]})}), _no_table)
    assert query == "SELECT COUNT(*) FROM trips WHERE fare > 3 AND pickup_zone IN ('JFK Airport', 'Hell''s Kitchen')"
    assert [(p.kind, p.sql, p.rows) for p in parts] == [("values", inner, 2)]


@pytest.mark.parametrize("values, written", [
    (pa.table({"v": [1, 2]}), "vendor IN (1, 2)"),
    (pa.table({"v": [True]}), "vendor IN (TRUE)"),
    (pa.table({"v": pa.array([], pa.int64())}), "FALSE"),
])
def test_numbers_booleans_and_no_values_are_written_as_duckdb_reads_them(values, written):
    inner = "SELECT vendor FROM zones"
    query, _parts = inline(f"SELECT count(*) FROM trips WHERE NOT vendor IN ({inner})", KNOWN,
                           _values({inner: values}), _no_table)
    assert query == f"SELECT COUNT(*) FROM trips WHERE NOT {written}"


@pytest.mark.parametrize("answer", [
    None,  # it names the outer query's columns: it cannot run alone
    pa.table({"v": ["a", None]}),  # a NULL: NOT IN would answer NULL for every row
    pa.table({"v": [0.1 + 0.2]}),  # DuckDB reads 0.30000000000000004 as a DECIMAL
    pa.table({"v": [f"z{i}" for i in range(MAX_VALUES + 1)]}),
    pa.table({"v": pa.array([1], pa.date32())}),
    pa.table({"v": [1], "w": [2]}),
])
def test_subqueries_whose_values_may_not_stand_for_them_are_left_as_written(answer):
    inner = "SELECT zone FROM zones"
    written = f"SELECT count(*) FROM trips WHERE pickup_zone IN ({inner})"
    assert inline(written, KNOWN, _values({inner: answer}), _no_table) == (written, [])


def test_an_in_subquery_outside_a_where_is_left_as_written():
    written = "SELECT pickup_zone IN (SELECT zone FROM zones) AS z, count(*) FROM trips GROUP BY 1"
    assert inline(written, KNOWN, _values({}), _no_table) == (written, [])


def test_aggregated_with_queries_and_derived_tables_are_answered_first_and_read_as_tables():
    registered: dict[str, str] = {}

    def table(sql: str, name: str) -> pa.Table | None:
        if "GROUP BY" not in sql:
            return None
        registered[name] = sql
        return pa.table({"pickup_zone": ["a", "b"], "n": [3, 4]})

    query, parts = inline(
        "WITH busy AS (SELECT pickup_zone, count(*) AS n FROM trips GROUP BY pickup_zone), "
        "few AS (SELECT zone FROM zones) SELECT max(n), (SELECT count(*) FROM few) FROM busy "
        "JOIN (SELECT payment, sum(fare) AS s FROM trips GROUP BY payment) AS p ON true", KNOWN, _values({}), table)
    assert query == ("WITH few AS (SELECT zone FROM zones) SELECT MAX(n), (SELECT COUNT(*) FROM few) FROM busy "
                     f"JOIN {ANSWERED}1 AS p ON TRUE")
    assert set(registered) == {"busy", f"{ANSWERED}1"} and [p.kind for p in parts] == ["table", "table"]
    assert parts[0].sql.startswith("busy AS (SELECT") and parts[0].rows == 2


def test_a_with_query_named_as_a_dataset_is_left_as_written():
    written = "WITH trips AS (SELECT payment, count(*) AS n FROM trips GROUP BY payment) SELECT max(n) FROM trips"
    assert inline(written, KNOWN, _values({}), lambda sql, name: pa.table({"n": [1]})) == (written, [])


def test_a_with_query_read_under_a_where_is_left_to_duckdb_which_pushes_the_filter_into_it():
    written = ("WITH busy AS (SELECT pickup_zone, count(*) AS n FROM trips GROUP BY pickup_zone) "
               "SELECT n FROM busy WHERE pickup_zone = 'SoHo'")
    assert inline(written, KNOWN, _values({}), lambda sql, name: pa.table({"n": [1]})) == (written, [])
    derived = "SELECT s.n FROM (SELECT payment, count(*) AS n FROM trips GROUP BY payment) AS s WHERE s.n > 3"
    assert inline(derived, KNOWN, _values({}), lambda sql, name: pa.table({"n": [1]})) == (derived, [])


def test_a_with_query_named_as_a_dataset_in_other_letters_is_left_as_written():
    written = "WITH Trips AS (SELECT payment, count(*) AS n FROM trips GROUP BY payment) SELECT max(n) FROM TRIPS"
    assert inline(written, KNOWN, _values({}), lambda sql, name: pa.table({"n": [1]})) == (written, [])


def test_explain_is_found_after_any_row_of_comments_in_one_pass():
    from flightpart.sql.explained import explained_query

    assert explained_query("/* a */ -- b\n EXPLAIN ANALYZE SELECT 1") == "SELECT 1"
    assert explained_query("/**/" * 20_000 + "EXPLAIN SELECT 1") == "SELECT 1"  # a backtracking pattern never returns
    assert explained_query("/* unterminated EXPLAIN SELECT 1") is None and explained_query("SELECT 1") is None
