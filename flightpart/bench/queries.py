"""The "analytical queries" case: five questions a data engineer asks of a taxi-like dataset, answered through
every engine a user would reach for, side by side with DuckDB over the same data as one Parquet file.

Each engine reads the dataset from a host of its own (every partition crosses a socket). Every answer is
checked against DuckDB's over the Parquet file, and the bytes each engine made the nodes send are counted:
a fast engine that moves the whole dataset for a one-column sum is shown as doing so.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ZONES = ["JFK Airport", "LaGuardia", "Hell's Kitchen", "Midtown", "Upper East Side", "Harlem", "SoHo", "Astoria",
         "Williamsburg", "Park Slope", "Chelsea", "Tribeca"]
PAYMENTS = ["card", "cash", "no charge", "dispute"]
START = dt.datetime(2024, 1, 1)


def taxi_table(rows: int, seed: int = 0) -> pa.Table:
    """Taxi-like trips: timestamps, nullable ints, doubles, categorical strings, names with quotes."""
    rng = np.random.default_rng(seed)
    pickup = np.datetime64(START, "us") + (rng.integers(0, 31 * 24 * 3600, rows) * 1_000_000).astype("timedelta64[us]")
    minutes = rng.gamma(2.0, 8.0, rows)
    dropoff = pickup + (minutes * 60e6).astype("timedelta64[us]")
    passengers = rng.integers(1, 7, rows).astype("float64")
    passengers[rng.random(rows) < 0.03] = np.nan
    fare = np.round(2.5 + minutes * 0.9 + rng.normal(0, 2, rows).clip(-2, 20), 2)
    tip = np.round(np.where(rng.random(rows) < 0.6, fare * rng.uniform(0.05, 0.3, rows), 0.0), 2)
    zone_codes = rng.integers(0, len(ZONES), rows)
    payment_codes = rng.choice(len(PAYMENTS), rows, p=[0.7, 0.25, 0.03, 0.02])
    return pa.table({
        "pickup_at": pa.array(pickup, pa.timestamp("us")),
        "dropoff_at": pa.array(dropoff, pa.timestamp("us")),
        "passengers": pa.array(passengers, pa.int64(), from_pandas=True),  # NaN -> null: a nullable int
        "distance": pa.array(np.round(minutes * rng.uniform(0.2, 0.5, rows), 2)),
        "fare": pa.array(fare),
        "tip": pa.array(tip),
        "pickup_zone": pa.array(np.array(ZONES, dtype=object)[zone_codes]),
        "dropoff_zone": pa.array(np.array(ZONES, dtype=object)[rng.integers(0, len(ZONES), rows)]),
        "payment": pa.array(np.array(PAYMENTS, dtype=object)[payment_codes]),
        "vendor": pa.array(rng.integers(1, 3, rows).astype("int32")),
        "store_and_forward": pa.array(rng.random(rows) < 0.01),
        "rate_code": pa.array(rng.integers(1, 7, rows).astype("int16")),
    })


# Each question: SQL (DuckDB over the Parquet file and over the dataset), and the same through each other engine.
QUESTIONS: dict[str, str] = {
    "total fare": "SELECT sum(fare) AS total FROM {t}",
    "trips and mean fare by payment": "SELECT payment, count(*) AS trips, avg(fare) AS mean_fare FROM {t} "
                                      "GROUP BY payment",
    "long trips over 30": "SELECT count(*) AS trips FROM {t} WHERE fare > 30",
    "mean tip by zone in one week": ("SELECT pickup_zone, avg(tip) AS mean_tip FROM {t} WHERE pickup_at >= "
                                     "TIMESTAMP '2024-01-08' AND pickup_at < TIMESTAMP '2024-01-15' "
                                     "GROUP BY pickup_zone"),
    "busiest five zones": ("SELECT pickup_zone, count(*) AS trips FROM {t} GROUP BY pickup_zone "
                           "ORDER BY trips DESC, pickup_zone LIMIT 5"),
}
WEEK = ("pickup_at >= TIMESTAMP '2024-01-08' AND pickup_at < TIMESTAMP '2024-01-15'")


def answers_of(ds: Any) -> dict[str, Callable[[], Any]]:
    """Every engine's way to answer every question, as a user of it would write it."""
    import duckdb
    import polars as pl

    def duck(question: str) -> Callable[[], Any]:
        def run() -> Any:
            con = duckdb.connect()
            con.register("trips", ds.duckdb_scan())  # columns and filters reach the nodes
            return con.sql(QUESTIONS[question].format(t="trips")).fetchall()
        return run

    lazy = lambda: ds.to_polars(lazy=True)  # noqa: E731
    week = (pl.col("pickup_at") >= dt.datetime(2024, 1, 8)) & (pl.col("pickup_at") < dt.datetime(2024, 1, 15))
    polars = {
        "total fare": lambda: lazy().select(pl.col("fare").sum()).collect().item(),
        "trips and mean fare by payment":
            lambda: lazy().group_by("payment").agg(pl.len(), pl.col("fare").mean()).collect().rows(),
        "long trips over 30": lambda: lazy().filter(pl.col("fare") > 30).select(pl.len()).collect().item(),
        "mean tip by zone in one week":
            lambda: lazy().filter(week).group_by("pickup_zone").agg(pl.col("tip").mean()).collect().rows(),
        "busiest five zones": lambda: lazy().group_by("pickup_zone").agg(pl.len().alias("trips"))
        .sort(["trips", "pickup_zone"], descending=[True, False]).head(5).collect().rows(),
    }

    def pandas_frame(columns: list[str]) -> Any:
        return ds.select(columns).to_pandas()

    pandas = {
        "total fare": lambda: pandas_frame(["fare"])["fare"].sum(),
        "trips and mean fare by payment": lambda: list(pandas_frame(["payment", "fare"]).groupby("payment")["fare"]
                                                       .agg(["count", "mean"]).itertuples()),
        "long trips over 30": lambda: int((pandas_frame(["fare"])["fare"] > 30).sum()),
        "mean tip by zone in one week": lambda: _pandas_week(pandas_frame(["pickup_zone", "pickup_at", "tip"])),
        "busiest five zones": lambda: list(pandas_frame(["pickup_zone"]).value_counts().items())[:5],
    }
    arrow = {
        "total fare": lambda: pc.sum(ds.select(["fare"]).to_arrow()["fare"]).as_py(),
        "trips and mean fare by payment": lambda: ds.select(["payment", "fare"]).to_arrow().group_by("payment")
        .aggregate([("fare", "count"), ("fare", "mean")]).to_pylist(),
        "long trips over 30": lambda: ds.select(["fare"]).to_arrow().filter(pc.field("fare") > 30).num_rows,
        "mean tip by zone in one week": lambda: ds.select(["pickup_zone", "pickup_at", "tip"]).to_arrow()
        .filter((pc.field("pickup_at") >= pa.scalar(dt.datetime(2024, 1, 8), pa.timestamp("us")))
                & (pc.field("pickup_at") < pa.scalar(dt.datetime(2024, 1, 15), pa.timestamp("us"))))
        .group_by("pickup_zone").aggregate([("tip", "mean")]).to_pylist(),
        "busiest five zones": lambda: ds.select(["pickup_zone"]).to_arrow().group_by("pickup_zone")
        .aggregate([("pickup_zone", "count")]).sort_by([("pickup_zone_count", "descending"),
                                                        ("pickup_zone", "ascending")])
        .slice(0, 5).to_pylist(),
    }
    ours = {
        "total fare": lambda: ds.aggregate([("fare", "sum")]).to_pylist(),
        "trips and mean fare by payment": lambda: ds.aggregate([("fare", "count"), ("fare", "mean")],
                                                               by="payment").to_pylist(),
        "long trips over 30": lambda: ds.count_rows("fare > 30"),
        "mean tip by zone in one week":
            lambda: ds.filter(WEEK).aggregate([("tip", "mean")], by="pickup_zone").to_pylist(),
        "busiest five zones": lambda: ds.aggregate([("pickup_zone", "count")], by="pickup_zone").sort_by(
            [("pickup_zone_count", "descending"), ("pickup_zone", "ascending")]).slice(0, 5).to_pylist(),
    }
    return {
        "DuckDB over ds.duckdb_scan()": {q: duck(q) for q in QUESTIONS},
        "Polars lazy": polars,
        "pandas (the columns it needs)": pandas,
        "pyarrow (the columns it needs)": arrow,
        "flightpart ds.aggregate / filter": ours,
    }


def _pandas_week(frame: Any) -> Any:
    week = frame[(frame["pickup_at"] >= dt.datetime(2024, 1, 8)) & (frame["pickup_at"] < dt.datetime(2024, 1, 15))]
    return list(week.groupby("pickup_zone")["tip"].mean().items())


def same_answer(got: list[tuple], expected: list[tuple], rel: float = 1e-6) -> bool:
    """Two canonical answers agree: the same rows, numbers equal to ``rel`` (a sum of ten million floats differs
    in its last digits between engines, and between two runs of one parallel engine, as summation order does)."""
    return len(got) == len(expected) and all(
        len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b)) for a, b in zip(got, expected))


def _close(x: Any, y: Any, rel: float) -> bool:
    numbers = (int, float)
    if isinstance(x, numbers) and isinstance(y, numbers) and not isinstance(x, bool) and not isinstance(y, bool):
        return math.isclose(x, y, rel_tol=rel, abs_tol=1e-9)
    return x == y


def canonical(answer: Any) -> list[tuple]:
    """Any engine's answer as sorted rows of rounded values, so answers compare across engines."""
    if hasattr(answer, "to_pylist"):
        answer = answer.to_pylist()
    if isinstance(answer, (int, float, np.integer, np.floating)):
        answer = [(answer,)]
    rows = []
    for row in answer:
        values = list(row.values()) if isinstance(row, dict) else list(row) if isinstance(row, (tuple, list)) else [row]
        flat: list[Any] = []
        for v in values:
            flat.extend(v if isinstance(v, tuple) else [v])
        rows.append(tuple(sorted((_rounded(v) for v in flat), key=_row_key)))  # engines order columns differently
    return sorted(rows, key=repr)


def _rounded(v: Any) -> Any:
    """Floats to 9 significant digits (enough to order rows alike; equality is :func:`same_answer`'s)."""
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return None
        v = float(f"{float(v):.9g}")
        return int(v) if v.is_integer() else v
    if isinstance(v, np.integer):
        return int(v)
    return v


def _row_key(v: Any) -> tuple:
    return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))


def duckdb_on_parquet(path: str) -> dict[str, Callable[[], Any]]:
    import duckdb

    def run(question: str) -> Callable[[], Any]:
        return lambda: duckdb.sql(QUESTIONS[question].format(t=f"read_parquet('{path}')")).fetchall()
    return {q: run(q) for q in QUESTIONS}


def case_queries(h: Any, runs: int) -> Any:
    """Five questions through each engine, read from a host of its own, against DuckDB over one Parquet file."""
    import os

    import pyarrow.parquet as pq

    from flightpart.client import connect

    from .measure import Case, alternate, moved_by_nodes

    trips = taxi_table(max(200_000, h.table.nbytes // 100))
    path = os.path.join(h.root, "trips.parquet")
    pq.write_table(trips, path)
    h.client.put("bench-trips", trips, tiling=(12, 1))
    remote = connect(h.cluster.uri, host="127.0.0.9")
    try:
        ds = remote.open("bench-trips")
        engines = {"DuckDB over the Parquet file": duckdb_on_parquet(path), **answers_of(ds)}
        expected = {q: canonical(fn()) for q, fn in engines["DuckDB over the Parquet file"].items()}
        wrong, moved, per_question = [], {}, {}
        for engine, questions in engines.items():
            before = moved_by_nodes(h)
            for question, fn in questions.items():
                if not same_answer(canonical(fn()), expected[question]):
                    wrong.append(f"{engine}: {question}")
            after = moved_by_nodes(h)
            moved[engine] = {k: after[k] - before[k] for k in after}
        totals: dict[str, list[float]] = {engine: [0.0] * runs for engine in engines}
        for question in QUESTIONS:
            times = alternate({engine: questions[question] for engine, questions in engines.items()}, runs)
            per_question[question] = {engine: sorted(t)[len(t) // 2] for engine, t in times.items()}
            for engine, t in times.items():
                totals[engine] = [a + b for a, b in zip(totals[engine], t)]
    finally:
        remote.close()
    case = Case("analytical queries (5 questions, 3 remote nodes)",
                "every answer equal to DuckDB over the Parquet file; time and bytes moved shown per engine",
                trips.nbytes, totals, extra={"moved": moved, "median_seconds_by_question": per_question,
                                             "wrong_answers": wrong, "rows": trips.num_rows})
    case.ratio = ("flightpart ds.aggregate / filter", "DuckDB over the Parquet file")
    case.met = not wrong
    return case
