"""Which queries have their aggregates computed on the nodes, and what DuckDB finishes. No cluster needed."""

from __future__ import annotations

import pytest

from flightpart.sql.partials import GROUPING, PARTIALS
from flightpart.sql.pushed import plan

KNOWN = {"trips", "zones"}


def test_a_group_by_becomes_partials_and_a_query_over_them():
    table, where, groupings, final, _joined, _computed = plan(
        "SELECT payment, count(*) AS n, avg(fare) AS fare FROM trips WHERE distance > 1 GROUP BY payment "
        "HAVING count(*) > 10 ORDER BY n DESC LIMIT 3", KNOWN)
    assert (table, where, groupings) == ("trips", "distance > 1",
                                         [(["payment"], [("", "count_all"), ("fare", "mean")])])
    assert f"FROM {PARTIALS}" in final and '"flightpart count_all()" > 10' in final and "GROUP BY" not in final
    assert final.endswith("ORDER BY n DESC LIMIT 3")


def test_a_global_aggregate_has_no_keys():
    _table, where, [(keys, aggregates)], _final, _joined, _computed = plan("SELECT sum(fare) AS s, "
                                                                           "min(pickup_at) FROM trips", KNOWN)
    assert (where, keys, sorted(aggregates)) == (None, [], [("fare", "sum"), ("pickup_at", "min")])


def test_count_distinct_is_grouped_by_its_column_on_the_nodes_and_counted_at_the_catalog():
    table, where, groupings, final, _joined, _computed = plan(
        "SELECT payment, count(DISTINCT pickup_zone) AS zones FROM trips WHERE fare > 5 GROUP BY payment "
        "HAVING count(DISTINCT pickup_zone) > 3 ORDER BY zones DESC", KNOWN)
    assert (table, where, groupings) == ("trips", "fare > 5", [(["payment", "pickup_zone"], [("", "count_all")])])
    assert f"FROM {PARTIALS}" in final and f'COUNT("pickup_zone") FILTER(WHERE "{GROUPING}" = 0)' in final
    assert "GROUP BY payment" in final and "HAVING" in final and "DISTINCT" not in final
    _t, _w, [(keys, _a)], final, _j, _c = plan("SELECT count(DISTINCT pickup_zone) FROM trips", KNOWN)
    assert keys == ["pickup_zone"] and "GROUP BY" not in final


def test_count_distinct_beside_other_aggregates_has_a_grouping_by_the_keys_for_them():
    table, where, groupings, final, _joined, _computed = plan(
        "SELECT payment, count(DISTINCT pickup_zone) AS zones, sum(fare) AS s, avg(tip) AS a, count(*) AS n "
        "FROM trips WHERE fare > 5 GROUP BY payment HAVING count(*) > 3 ORDER BY s DESC", KNOWN)
    assert (table, where) == ("trips", "fare > 5")
    assert groupings == [(["payment"], [("fare", "sum"), ("tip", "exact_sum"), ("tip", "count"), ("", "count_all")]),
                         (["payment", "pickup_zone"], [("", "count_all")])]
    assert f"FROM {PARTIALS}" in final and "GROUP BY payment" in final and "DISTINCT" not in final
    assert f'COUNT("pickup_zone") FILTER(WHERE "{GROUPING}" = 1) AS zones' in final
    assert (f'SUM("flightpart exact_sum(tip)") FILTER(WHERE "{GROUPING}" = 0) / '
            f'SUM("flightpart count(tip)") FILTER(WHERE "{GROUPING}" = 0) AS a' in final)
    assert (f'HAVING CAST(COALESCE(SUM("flightpart count_all()") FILTER(WHERE "{GROUPING}" = 0), 0) AS BIGINT) > 3'
            in final)
    _t, _w, groupings, final, _j, _c = plan("SELECT count(DISTINCT pickup_zone), sum(fare) FROM trips", KNOWN)
    assert groupings == [([], [("fare", "sum")]), (["pickup_zone"], [("", "count_all")])] and "GROUP BY" not in final


def test_several_distinct_counts_are_a_grouping_each_and_a_tuple_counts_its_combinations():
    _t, _w, groupings, final, _j, _c = plan(
        "SELECT payment, count(DISTINCT pickup_zone) AS z, count(DISTINCT vendor) AS v, "
        "count(DISTINCT (vendor, passengers)) AS vp, count(DISTINCT pickup_zone) + 1 AS z1 FROM trips GROUP BY payment",
        KNOWN)
    assert groupings == [(["payment", "pickup_zone"], [("", "count_all")]),
                         (["payment", "vendor"], [("", "count_all")]),
                         (["payment", "vendor", "passengers"], [("", "count_all")])]
    assert f'COUNT("vendor") FILTER(WHERE "{GROUPING}" = 1) AS v' in final
    assert f'COUNT(*) FILTER(WHERE "{GROUPING}" = 2) AS vp' in final
    assert f'COUNT("pickup_zone") FILTER(WHERE "{GROUPING}" = 0) + 1 AS z1' in final


@pytest.mark.parametrize("query", [
    "SELECT count(DISTINCT pickup_zone || 'x') FROM trips",
    "SELECT count(DISTINCT (pickup_zone, fare * 2)) FROM trips",
    "SELECT count(DISTINCT pickup_zone), sum(fare * 2) FROM trips",
    "SELECT payment, count(*) FILTER (WHERE tip > 5) FROM trips GROUP BY payment",
    "SELECT payment, avg(fare) FILTER (WHERE tip > 5), count(DISTINCT pickup_zone) FROM trips GROUP BY payment",
    "SELECT payment, fare, count(DISTINCT pickup_zone), sum(fare) FROM trips GROUP BY payment",
    "SELECT pickup_zone, count(DISTINCT pickup_zone) FROM trips",
    "SELECT sum(fare * 100) FROM trips",
    "SELECT z.borough, count(*) FROM trips JOIN zones z ON z.zone = trips.pickup_zone GROUP BY z.borough",
    "SELECT payment, fare FROM trips",
    "SELECT payment, rank() OVER (ORDER BY fare) FROM trips",
    "SELECT fare, count(*) FROM trips GROUP BY payment",
    "SELECT count(*) FROM nosuch",
    "SELECT median(fare) FROM trips",
    "WITH t AS (SELECT * FROM trips) SELECT count(*) FROM t",
    "SELEC 1",
])
def test_anything_else_is_left_to_duckdb_whole(query):
    assert plan(query, KNOWN) is None


class _Described:
    """What the join planner reads of a dataset: its schema and shape."""

    def __init__(self, table):
        self.schema, self.shape = table.schema, (table.num_rows, table.num_columns)


def _datasets():
    from flightpart.bench.queries import taxi_table
    from flightpart.bench.sql_queries import zones_table

    described = {"trips": _Described(taxi_table(50)), "zones": _Described(zones_table())}
    return described.__getitem__


def test_an_aggregate_over_a_join_aggregates_the_dataset_it_reads_by_its_join_column_first():
    planned = plan("SELECT z.borough, t.payment, sum(t.fare) AS s, avg(tip) AS a, count(DISTINCT t.dropoff_zone) AS d, "
                   "count(*) AS n FROM trips t JOIN zones z ON t.pickup_zone = z.zone AND t.fare > 5 "
                   "WHERE t.tip > 1 AND z.borough <> 'Queens' GROUP BY z.borough, t.payment ORDER BY s DESC", KNOWN,
                   _datasets())
    assert (planned.table, planned.joined, planned.where) == ("trips", ("zones",), "fare > 5 AND tip > 1")
    assert planned.groupings == [(["pickup_zone", "payment", "dropoff_zone"],
                                  [("fare", "sum"), ("tip", "exact_sum"), ("tip", "count"), ("", "count_all")])]
    final = planned.final
    assert f"FROM {PARTIALS} AS t JOIN zones AS z ON t.pickup_zone = z.zone WHERE z.borough <> 'Queens'" in final
    assert 'SUM("t"."flightpart sum(fare)") AS s' in final
    assert 'SUM("t"."flightpart exact_sum(tip)") / SUM("t"."flightpart count(tip)") AS a' in final
    assert "COUNT(DISTINCT t.dropoff_zone) AS d" in final
    assert 'CAST(COALESCE(SUM(COALESCE("t"."flightpart count_all()", 1)), 0) AS BIGINT) AS n' in final


def test_count_star_alone_aggregates_the_larger_dataset_and_a_left_join_keeps_its_filter_in_on():
    planned = plan("SELECT z.borough, count(*) AS n FROM zones z JOIN trips ON z.zone = trips.pickup_zone "
                   "GROUP BY z.borough", KNOWN, _datasets())
    assert (planned.table, planned.groupings) == ("trips", [(["pickup_zone"], [("", "count_all")])])
    planned = plan("SELECT z.zone, count(t.fare) AS n FROM zones z LEFT JOIN trips t ON t.pickup_zone = z.zone "
                   "AND t.fare > 60 GROUP BY z.zone", KNOWN, _datasets())
    assert (planned.where == "fare > 60"
            and f"LEFT JOIN {PARTIALS} AS t ON t.pickup_zone = z.zone GROUP" in planned.final)


@pytest.mark.parametrize("query", [
    "SELECT z.borough, sum(t.fare) FROM trips t RIGHT JOIN zones z ON t.pickup_zone = z.zone GROUP BY z.borough",
    "SELECT z.borough, sum(t.fare) FROM trips t FULL JOIN zones z ON t.pickup_zone = z.zone GROUP BY z.borough",
    "SELECT sum(fare) FROM trips JOIN zones USING (zone)",
    "SELECT sum(fare) FROM trips, zones WHERE zones.zone = trips.pickup_zone",
    "SELECT sum(t.fare) FROM trips t JOIN zones z ON t.pickup_zone <> z.zone",
    "SELECT sum(t.fare), count(z.borough) FROM trips t JOIN zones z ON t.pickup_zone = z.zone",
    "SELECT sum(t.fare) FROM trips t JOIN zones z ON t.pickup_zone = z.zone WHERE t.payment = z.borough",
    "SELECT z.zone, avg(t.fare) FROM zones z LEFT JOIN trips t ON t.pickup_zone = z.zone WHERE t.fare > 3 GROUP BY 1",
    "SELECT z.borough, count(*) FROM trips t LEFT JOIN zones z ON t.pickup_zone = z.zone AND t.fare > 5 GROUP BY 1",
    "SELECT t.fare, count(*) FROM trips t JOIN zones z ON t.pickup_zone = z.zone GROUP BY z.borough",
    "SELECT sum(t.fare) FROM trips t JOIN zones z ON t.pickup_zone = z.zone JOIN zones y ON y.zone = t.dropoff_zone",
    "SELECT sum(t.fare * 2) FROM trips t JOIN zones z ON t.pickup_zone = z.zone",
    "SELECT sum(a.fare) FROM trips a JOIN trips b ON a.pickup_zone = b.dropoff_zone",
])
def test_joins_the_partials_cannot_answer_are_left_to_duckdb(query):
    assert plan(query, KNOWN, _datasets()) is None


def test_group_by_ordinals_name_the_columns_of_the_select_list():
    planned = plan("SELECT payment, vendor AS v, count(*) AS n FROM trips GROUP BY 1, 2 ORDER BY n", KNOWN)
    assert planned.groupings == [(["payment", "vendor"], [("", "count_all")])]
    assert plan("SELECT date_trunc('week', pickup_at) AS week, count(*) FROM trips GROUP BY 1", KNOWN) is None
    assert plan("SELECT payment, count(*) FROM trips GROUP BY 3", KNOWN) is None


def test_integer_sums_are_exact_and_hugeint_where_the_schema_is_known():
    planned = plan("SELECT payment, sum(vendor) AS v, sum(fare) AS f, sum(store_and_forward) AS b FROM trips "
                   "GROUP BY payment", KNOWN, _datasets())
    assert planned.groupings == [(["payment"], [("vendor", "exact_sum"), ("fare", "sum"), ("store_and_forward",
                                                                                          "exact_sum")])]
    assert 'CAST("flightpart exact_sum(vendor)" AS INT128) AS v' in planned.final  # DuckDB's HUGEINT
    assert '"flightpart sum(fare)" AS f' in planned.final


@pytest.mark.parametrize("query", [
    "SELECT payment, min(fare, 2) FROM trips GROUP BY payment",
    "SELECT count(DISTINCT payment), count_star() FROM trips",
    "SELECT payment, fsum(fare) FROM trips GROUP BY payment",
    "SELECT count(*) FROM trips USING SAMPLE 10 ROWS",
    "SELECT count(*) FROM trips TABLESAMPLE 10%",
    "SELECT max(passengers) FROM trips AS t(passengers)",
    "SELECT count(*) AS n, EXISTS (SELECT 1 FROM zones) AS e FROM trips",
    "SELECT payment, count(*) FROM trips GROUP BY payment HAVING EXISTS (SELECT * FROM zones)",
    "SELECT count(*), ARRAY(SELECT zone FROM zones) FROM trips",
    "SELECT *, count(*) AS n FROM trips GROUP BY ALL",
    "SELECT payment AS payment, count(*) FROM trips GROUP BY ALL",
])
def test_what_the_partials_cannot_stand_for_is_left_to_duckdb(query):
    assert plan(query, KNOWN, _datasets()) is None


@pytest.mark.parametrize("query", [
    "SELECT fare FROM trips USING SAMPLE 50 ROWS ORDER BY fare DESC LIMIT 3",
    "SELECT COLUMNS('^t') FROM trips ORDER BY fare LIMIT 3",
    "SELECT fare, EXISTS (SELECT 1 FROM zones) AS e FROM trips ORDER BY fare LIMIT 2",
    "SELECT fare, count_star() OVER () FROM trips ORDER BY fare LIMIT 2",
    "SELECT a.fare FROM trips AS a(fare) ORDER BY a.fare LIMIT 2",
])
def test_what_first_rows_cannot_stand_for_is_left_to_duckdb(query):
    from flightpart.sql.pushed import top_plan

    assert top_plan(query, KNOWN) is None


def test_a_table_alias_is_kept_for_the_partials():
    planned = plan("SELECT t.payment, count(*) AS n FROM trips t GROUP BY payment", KNOWN)
    assert f"FROM {PARTIALS} AS t" in planned.final and planned.final.startswith("SELECT t.payment")
