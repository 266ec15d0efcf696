"""SQL over Flight, measured: twenty queries through the ADBC Flight SQL driver against DuckDB over the same tables.

The queries cover what a SQL client asks (filters with dates, ``IN``, ``LIKE``
and ``BETWEEN``; every aggregate, ``count(DISTINCT)``, ``HAVING``, ``ORDER
BY`` with ``LIMIT``/``OFFSET``, ``date_trunc``, a window function, a
subquery, a CTE, joins with a small dataset). The tests check each answer
equals DuckDB's (tests/test_flight_sql.py); the bench times both side by
side on one host and counts the rows and bytes the nodes sent for each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from .queries import canonical, same_answer, taxi_table

SQL_QUERIES: dict[str, str] = {
    "count": "SELECT count(*) AS n FROM trips",
    "filter with IN": "SELECT count(*) AS n, sum(fare) AS fare FROM trips WHERE pickup_zone IN ('JFK Airport', "
                      "'Hell''s Kitchen')",
    "a one-item IN": "SELECT count(*) AS n FROM trips WHERE payment IN ('dispute')",
    "a date range": "SELECT count(*) AS n FROM trips WHERE pickup_at >= TIMESTAMP '2024-01-08' AND pickup_at < "
                    "DATE '2024-01-15'",
    "between or": "SELECT count(*) AS n FROM trips WHERE fare BETWEEN 10 AND 20 OR tip > 15",
    "like": "SELECT pickup_zone, count(*) AS n FROM trips WHERE pickup_zone LIKE '%Airport' GROUP BY pickup_zone",
    "group by with every aggregate": ("SELECT payment, sum(fare) AS s, avg(tip) AS a, min(distance) AS lo, "
                                      "max(distance) AS hi, count(passengers) AS c, count(DISTINCT pickup_zone) AS "
                                      "zones FROM trips GROUP BY payment"),
    "count distinct per group": "SELECT payment, count(DISTINCT pickup_zone) AS zones FROM trips GROUP BY payment",
    "first and last times": "SELECT vendor, min(pickup_at) AS first, max(dropoff_at) AS last FROM trips "
                            "GROUP BY vendor",
    "having": "SELECT pickup_zone, count(*) AS n FROM trips GROUP BY pickup_zone HAVING count(*) > 4000",
    "order by and limit": "SELECT fare, pickup_zone FROM trips ORDER BY fare DESC, pickup_at LIMIT 7",
    "limit and offset": "SELECT fare FROM trips ORDER BY fare DESC, pickup_at LIMIT 5 OFFSET 3",
    "date_trunc": "SELECT date_trunc('week', pickup_at) AS week, count(*) AS n FROM trips GROUP BY 1",
    "a window function": ("SELECT payment, fare, rank() OVER (PARTITION BY payment ORDER BY fare DESC, pickup_at) AS r "
                          "FROM trips QUALIFY r <= 2"),
    "a join with a small dataset": ("SELECT z.borough, count(*) AS n FROM trips JOIN zones z ON z.zone = "
                                    "trips.pickup_zone GROUP BY z.borough"),
    "a left join": ("SELECT z.zone, count(t.fare) AS n FROM zones z LEFT JOIN trips t ON t.pickup_zone = z.zone "
                    "AND t.fare > 60 GROUP BY z.zone"),
    "a subquery": "SELECT count(*) AS n FROM trips WHERE pickup_zone IN (SELECT zone FROM zones WHERE "
                  "borough = 'Queens')",
    "a CTE": ("WITH busy AS (SELECT pickup_zone, count(*) AS n FROM trips GROUP BY pickup_zone) "
              "SELECT max(n) AS most, min(n) AS least FROM busy"),
    "nulls": "SELECT count(*) AS n FROM trips WHERE passengers IS NULL",
    "an expression and a cast": "SELECT CAST(sum(fare * 100) AS BIGINT) AS cents, round(avg(tip / fare), 3) AS "
                                "share FROM trips",
}


def zones_table() -> pa.Table:
    """The small dataset the joins use."""
    return pa.table({"zone": ["JFK Airport", "LaGuardia", "Hell's Kitchen", "Midtown", "Harlem"],
                     "borough": ["Queens", "Queens", "Manhattan", "Manhattan", "Manhattan"]})


def duckdb_over(trips: pa.Table, zones: pa.Table) -> Any:
    """DuckDB over the same tables, under the same names: the answers to match, and the time to compare with."""
    import duckdb

    con = duckdb.connect()
    con.register("trips", trips)
    con.register("zones", zones)
    return con


def through_driver(conn: Any, sql: str) -> pa.Table:
    """``sql`` answered through an ADBC Flight SQL connection, as an Arrow table."""
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetch_arrow_table()


def case_flight_sql(h: Any, runs: int) -> Any:
    """The twenty queries through ADBC at the catalog (3 nodes) against DuckDB over the same Arrow tables in this
    process: every answer equal, rows, time and the bytes the nodes sent per query."""
    import adbc_driver_flightsql.dbapi as flight_sql

    from .measure import Case, alternate, moved_by_nodes

    trips, zones = taxi_table(max(200_000, h.table.nbytes // 100), seed=11), zones_table()
    h.client.put("trips", trips, tiling=(12, 1))
    h.client.put("zones", zones)
    local = duckdb_over(trips, zones)
    wrong: list[str] = []
    per_query: dict[str, dict[str, Any]] = {}
    totals: dict[str, list[float]] = {"ADBC to the catalog": [0.0] * runs, "DuckDB over the tables": [0.0] * runs}
    with flight_sql.connect(h.cluster.uri) as conn:
        for name, sql in SQL_QUERIES.items():
            before = moved_by_nodes(h)
            got = through_driver(conn, sql)
            after = moved_by_nodes(h)
            want = local.sql(sql).to_arrow_table()
            if not same_answer(canonical(got), canonical(want)):
                wrong.append(name)
            contenders: dict[str, Callable[[], Any]] = {
                "ADBC to the catalog": lambda sql=sql: through_driver(conn, sql),
                "DuckDB over the tables": lambda sql=sql: local.sql(sql).fetchall()}
            times = alternate(contenders, runs)
            per_query[name] = {"rows": got.num_rows, "bytes_sent": after["bytes_sent"] - before["bytes_sent"],
                               "rows_sent": after["rows_sent"] - before["rows_sent"],
                               **{who: sorted(t)[len(t) // 2] for who, t in times.items()}}
            for who, t in times.items():
                totals[who] = [a + b for a, b in zip(totals[who], t)]
    h.client.drop("trips")
    h.client.drop("zones")
    case = Case(f"SQL over Flight ({len(SQL_QUERIES)} queries through ADBC, 3 nodes)",
                "every answer equal to DuckDB over the same tables; rows, time and bytes the nodes sent per query",
                trips.nbytes, totals, extra={"queries": per_query, "wrong_answers": wrong, "rows": trips.num_rows})
    case.ratio = ("ADBC to the catalog", "DuckDB over the tables")
    case.met = not wrong
    return case
