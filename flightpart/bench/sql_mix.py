"""``flightpart bench --sql``: a query mix through one ADBC client against flightpart's catalog, roapi's Flight SQL
server (when installed) over the same Parquet files, and DuckDB in this process on those files.

Every contender answers every query; flightpart's answers must equal DuckDB's
(a wrong answer fails the run's goal), roapi's are checked the same way and
listed when they differ. Runs alternate query by query (flightpart, roapi,
DuckDB, flightpart, ...) so a busy moment taxes all three alike. Each query is
one case of the result, so ``--compare`` and ``--markdown`` read it as they read
the plain bench; a last case holds each run's geometric mean over the mix.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from .measure import Case, alternate
from .queries import canonical, same_answer, taxi_table
from .sql_queries import through_driver, zones_table

DAY = "pickup_at >= TIMESTAMP '2024-01-08' AND pickup_at < TIMESTAMP '2024-01-09'"
SQL_MIX: dict[str, str] = {
    "SELECT 1": "SELECT 1 AS one",
    "a count": "SELECT count(*) AS n FROM trips",
    "a count in one day": f"SELECT count(*) AS n FROM trips WHERE {DAY}",
    "a count of nulls": "SELECT count(*) AS n FROM trips WHERE passengers IS NULL",
    "trips per hour of one day": f"SELECT date_trunc('hour', pickup_at) AS hour, count(*) AS n FROM trips WHERE {DAY} "
                                 "GROUP BY 1",
    "every zone": "SELECT * FROM zones",
    "two keys, seven aggregates": ("SELECT payment, vendor, count(*) AS n, sum(fare) AS fare, avg(tip) AS tip, "
                                   "min(distance) AS lo, max(distance) AS hi, sum(passengers) AS people, "
                                   "avg(fare) AS mean_fare FROM trips GROUP BY payment, vendor"),
    "filter with IN": ("SELECT count(*) AS n, sum(fare) AS fare FROM trips "
                       "WHERE pickup_zone IN ('JFK Airport', 'Hell''s Kitchen')"),
    "like": "SELECT pickup_zone, count(*) AS n FROM trips WHERE pickup_zone LIKE '%Airport' GROUP BY pickup_zone",
    "order by and limit": "SELECT fare, pickup_zone FROM trips ORDER BY fare DESC, pickup_at LIMIT 7",
    "a join with a small dataset": ("SELECT z.borough, count(*) AS n FROM trips JOIN zones z ON z.zone = "
                                    "trips.pickup_zone GROUP BY z.borough"),
    "count distinct per group": "SELECT payment, count(DISTINCT pickup_zone) AS zones FROM trips GROUP BY payment",
    "having": "SELECT pickup_zone, count(*) AS n FROM trips GROUP BY pickup_zone HAVING count(*) > 4000",
}
SELECTIVE = ("a count in one day", "a count of nulls", "trips per hour of one day")
"""The selective aggregates the goal holds to a multiple of DuckDB's time on the files."""

FLIGHTPART, ROAPI, DUCKDB = "flightpart (ADBC)", "roapi (ADBC)", "DuckDB on the Parquet files"
SELECT_1_GOAL_SECONDS = 0.010
SELECTIVE_GOAL = 1.5
"""Each selective aggregate within this multiple of DuckDB's time."""
MIX_GOAL = 1.0
"""The geometric mean of flightpart's times over roapi's, at most this."""


def roapi_binary() -> str | None:
    """roapi's server: ``$FLIGHTPART_ROAPI``, else ``roapi`` beside this Python or on the PATH; None when absent."""
    named = os.environ.get("FLIGHTPART_ROAPI")
    if named:
        return named if os.access(named, os.X_OK) else None
    beside = Path(sys.executable).with_name("roapi")
    return str(beside) if beside.exists() else shutil.which("roapi")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def roapi_server(binary: str, tables: dict[str, Path], timeout: float = 60.0) -> Iterator[str]:
    """roapi serving ``tables`` (name: Parquet file) over Flight SQL on loopback; yields its URI once a
    ``SELECT 1`` is answered, and stops it on leaving."""
    import adbc_driver_flightsql.dbapi as flight_sql

    port = _free_port()
    args = [binary, "--addr-flight-sql", f"127.0.0.1:{port}", "--addr-http", f"127.0.0.1:{_free_port()}",
            "--addr-postgres", f"127.0.0.1:{_free_port()}"]
    for name, path in tables.items():
        args += ["-t", f"{name}={path}"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RUST_LOG": "warn"})
    uri, deadline = f"grpc://127.0.0.1:{port}", time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"roapi exited at start: {proc.stderr.read()[-500:] if proc.stderr else ''}")
            try:
                with flight_sql.connect(uri) as conn:
                    through_driver(conn, "SELECT 1")
                break
            except Exception:  # not listening yet
                if time.monotonic() > deadline:
                    raise RuntimeError(f"roapi did not answer within {timeout:g} s") from None
                time.sleep(0.1)
        yield uri
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def duckdb_on_files(tables: dict[str, Path]) -> Any:
    """DuckDB in this process with a view per Parquet file, under the tables' names."""
    import duckdb

    con = duckdb.connect()
    for name, path in tables.items():
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
    return con


def geometric_mean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def run_sql_bench(rows: int, *, runs: int = 7, quick: bool = False, with_roapi: bool = True,
                  log: Callable[[str], None] = print) -> dict:
    """The mix over ``rows`` taxi-like trips on three nodes (12 partitions), each query timed ``runs`` times per
    contender; the result has the plain bench's shape (``cases``, ``size_bytes``, ``runs``, ...) and ``goals``."""
    from flightpart.client import connect
    from flightpart.local.cluster import LocalCluster

    binary = roapi_binary() if with_roapi else None
    if with_roapi and binary is None:
        log("roapi is not installed (pip install roapi): the mix runs against DuckDB only")
    started, memory = time.perf_counter(), psutil.virtual_memory()
    trips, zones = taxi_table(rows, seed=11), zones_table()
    with tempfile.TemporaryDirectory(prefix="flightpart-bench-sql-") as root:
        files = {"trips": Path(root, "trips.parquet"), "zones": Path(root, "zones.parquet")}
        pq.write_table(trips, files["trips"])
        pq.write_table(zones, files["zones"])
        with contextlib.ExitStack() as stack:
            cluster = stack.enter_context(LocalCluster(Path(root, "cluster"), nodes=3))
            client = stack.enter_context(connect(cluster.uri, host="127.0.0.9", timeout=600))  # a busy machine waits
            client.put("trips", trips, tiling=(12, 1))
            client.put("zones", zones)
            import adbc_driver_flightsql.dbapi as flight_sql

            drivers = {FLIGHTPART: stack.enter_context(flight_sql.connect(cluster.uri))}
            if binary is not None:
                drivers[ROAPI] = stack.enter_context(
                    flight_sql.connect(stack.enter_context(roapi_server(binary, files))))
            cases = _time_mix(drivers, duckdb_on_files(files), runs, log)
    cases.append(_mix_case(cases, ROAPI if binary is not None else DUCKDB))
    result = {"kind": "sql", "size_bytes": trips.nbytes, "rows": rows, "quick": quick, "runs": runs,
              "seconds": time.perf_counter() - started,
              "machine": {"cpus": os.cpu_count(), "memory_bytes": memory.total, "python": sys.version.split()[0],
                          "pyarrow": pa.__version__},
              "cases": [c.as_json() for c in cases]}
    result["goals"] = sql_goals(result)
    return result


def _time_mix(drivers: dict[str, Any], duck: Any, runs: int, log: Callable[[str], None]) -> list[Case]:
    """One case per query of :data:`SQL_MIX`: every contender's answer checked against DuckDB's, then timed."""
    cases = []
    for name, sql in SQL_MIX.items():
        log(f"  {name} ...")
        want = canonical(duck.sql(sql).to_arrow_table())
        wrong = [who for who, conn in drivers.items() if not same_answer(canonical(through_driver(conn, sql)), want)]
        contenders: dict[str, Callable[[], Any]] = {
            who: (lambda conn=conn, sql=sql: through_driver(conn, sql)) for who, conn in drivers.items()}
        contenders[DUCKDB] = lambda sql=sql: duck.sql(sql).to_arrow_table()  # Arrow, as the drivers give
        case = Case(f"SQL: {name}", "answer equal to DuckDB's", 0, alternate(contenders, runs),
                    extra={"sql": sql, "wrong_answers": wrong})
        case.ratio = (FLIGHTPART, ROAPI if ROAPI in drivers else DUCKDB)
        case.met = FLIGHTPART not in wrong
        cases.append(case)
    return cases


def _mix_case(cases: list[Case], baseline: str) -> Case:
    """Each run's geometric mean over the queries, per contender: the mix as one figure ``--compare`` can follow."""
    who = list(cases[0].times)
    runs = min(len(c.times[w]) for c in cases for w in who)
    times = {w: [geometric_mean([c.times[w][k] for c in cases]) for k in range(runs)] for w in who}
    case = Case(f"SQL: geometric mean of {len(cases)} queries", f"at most {MIX_GOAL:g}x {baseline}'s", 0, times)
    case.ratio = (FLIGHTPART, baseline)
    case.met = all(c.met for c in cases) and case.median(FLIGHTPART) <= MIX_GOAL * case.median(baseline)
    return case


def sql_goals(result: dict) -> list[dict]:
    """The goals of the mix, each with its value and whether it was met (None: its contender did not run)."""
    cases = {c["case"].removeprefix("SQL: "): c for c in result["cases"]}

    def median(query: str, who: str) -> float | None:
        return cases[query]["median_seconds"].get(who)

    goals = [{"goal": f"SELECT 1 p50 <= {SELECT_1_GOAL_SECONDS * 1e3:g} ms", "value": median("SELECT 1", FLIGHTPART),
              "met": median("SELECT 1", FLIGHTPART) <= SELECT_1_GOAL_SECONDS}]
    for query in SELECTIVE:
        ratio = median(query, FLIGHTPART) / median(query, DUCKDB)
        goals.append({"goal": f"{query} <= {SELECTIVE_GOAL:g}x DuckDB on the files", "value": ratio,
                      "met": ratio <= SELECTIVE_GOAL})
    mix = next(c for name, c in cases.items() if name.startswith("geometric mean"))
    base = mix["median_seconds"].get(ROAPI)
    ratio = mix["median_seconds"][FLIGHTPART] / base if base else None
    goals.append({"goal": f"geometric mean <= {MIX_GOAL:g}x roapi", "value": ratio,
                  "met": None if ratio is None else ratio <= MIX_GOAL})
    wrong = sorted(name for name, c in cases.items() if FLIGHTPART in c.get("wrong_answers", []))
    goals.append({"goal": "every answer equal to DuckDB's", "value": len(wrong), "met": not wrong, "wrong": wrong})
    peer_wrong = sorted(name for name, c in cases.items() if ROAPI in c.get("wrong_answers", []))
    if peer_wrong:
        goals[-1]["roapi_wrong"] = peer_wrong
    return goals


def render_goals(result: dict) -> None:
    """The goals of a ``--sql`` run as a table."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"flightpart bench --sql: {result['rows']:,} rows, 3 nodes, {result['runs']} runs per contender")
    for col in ("goal", "value", "met"):
        t.add_column(col)
    for g in result["goals"]:
        met = "" if g["met"] is None else "[green]yes[/]" if g["met"] else "[red]no[/]"
        t.add_row(g["goal"], _shown(g), met)
    Console().print(t)


def _shown(goal: dict) -> str:
    value = goal["value"]
    return "" if value is None else f"{value * 1e3:,.2f} ms" if "ms" in goal["goal"] else f"{value:,.2f}"


def goals_markdown(result: dict) -> str:
    """The goals of a ``--sql`` run as a Markdown table."""
    lines = ["| goal | value | met |", "| --- | --- | --- |"]
    for g in result["goals"]:
        lines.append(f"| {g['goal']} | {_shown(g)} | {'' if g['met'] is None else 'yes' if g['met'] else '**no**'} |")
    return "\n".join(lines) + "\n"


def plot_sql(result: dict, path: str) -> None:
    """Each query's median per contender, grouped bars on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = result["cases"]
    who = list(cases[0]["median_seconds"])
    fig, ax = plt.subplots(figsize=(max(8.0, 0.9 * len(cases)), 4.8))
    width = 0.8 / len(who)
    for k, name in enumerate(who):
        values = [c["median_seconds"].get(name, float("nan")) * 1e3 for c in cases]
        ax.bar([i + k * width for i in range(len(cases))], values, width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))],
                  [c["case"].removeprefix("SQL: ") for c in cases], rotation=35, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("median ms, log scale (lower is better)")
    ax.legend(fontsize=8)
    ax.set_title(f"flightpart bench --sql: {result['rows']:,} rows, 3 nodes", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
