"""SQL tools against real daemons (a catalog and two nodes as child processes): flightsql-dbapi's SQLAlchemy
engine, in a venv of its own (it pins SQLAlchemy 1.4), connects, lists the datasets and their columns and runs a
query; the ADBC driver's ``adbc_get_info`` and ``adbc_get_objects`` answer."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightpart as fp

dbapi = pytest.importorskip("adbc_driver_flightsql.dbapi", reason="adbc-driver-flightsql is in the test extra")

pytestmark = pytest.mark.slow  # installs flightsql-dbapi in a venv of its own

SCRIPT = textwrap.dedent("""
    import json, sys
    import sqlalchemy
    from sqlalchemy import inspect, text
    import flightsql.flightsql_pb2 as proto

    url, dataset, query = sys.argv[1:4]
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as conn:
        seen = inspect(engine)
        tables = seen.get_table_names()
        columns = [[c["name"], type(c["type"]).__name__] for c in seen.get_columns(dataset)]
        rows = [list(r) for r in conn.execute(text(query))]
        info = conn.connection.flightsql_get_sql_info([])
        try:  # a plain scan: flightsql-dbapi reads its first endpoint, at the catalog
            scan = len(list(conn.execute(text(f"SELECT * FROM {dataset}"))))
        except Exception as e:
            scan = str(e)
    every = [v.number for v in proto.DESCRIPTOR.enum_types_by_name["SqlInfo"].values]
    print(json.dumps({"tables": tables, "columns": columns, "rows": rows, "quote": info.get(504),
                      "missing": [i for i in every if i not in info], "scan": scan}))
""")


@pytest.fixture(scope="module")
def flightsql_python(tmp_path_factory) -> Path:
    """The python of a venv holding flightsql-dbapi from the package registry, and pandas, which it reads table
    lists with but does not declare (made once per module)."""
    home = tmp_path_factory.mktemp("flightsql-venv")
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, capture_output=True)
    python = home / "bin" / "python"
    made = subprocess.run([str(python), "-m", "pip", "install", "-q", "flightsql-dbapi", "pandas"], capture_output=True,
                          text=True, timeout=900)
    if made.returncode != 0:
        pytest.skip(f"pip could not install flightsql-dbapi from the package registry: {made.stderr[-400:]}")
    return python


@pytest.fixture(scope="module")
def sql_cluster(make_cluster):
    cluster = make_cluster(2, process=True)
    with fp.connect(cluster.uri) as writer:
        writer.put("trips", pa.table({"k": [i % 3 for i in range(60)], "v": [float(i) for i in range(60)],
                                      "name": [f"n{i}" for i in range(60)]}), tiling=(3, 1))
        writer.put("zones", pa.table({"id": [1, 2, 3], "zone": ["a", "b", "c"]}))
    return cluster


def test_flightsql_dbapi_sqlalchemy_connects_lists_and_queries(sql_cluster, flightsql_python):
    where = urlparse(sql_cluster.uri)
    url = f"datafusion://{where.hostname}:{where.port}?insecure=true"
    query = "SELECT k, sum(v) AS s, count(*) AS n FROM trips GROUP BY k ORDER BY k"
    ran = subprocess.run([str(flightsql_python), "-c", SCRIPT, url, "trips", query], capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    got = json.loads(ran.stdout)
    with fp.connect(sql_cluster.uri) as client:
        read = client.open("trips").to_arrow()
    want = read.group_by("k").aggregate([("v", "sum"), ("v", "count")]).sort_by("k")
    assert sorted(got["tables"]) == ["trips", "zones"]
    assert got["columns"] == [["k", "BIGINT"], ["v", "FLOAT"], ["name", "TEXT"]]
    assert got["rows"] == [[k, s, n] for k, s, n in zip(want["k"].to_pylist(), want["v_sum"].to_pylist(),
                                                          want["v_count"].to_pylist(), strict=True)]
    assert got["quote"] == '"' and got["missing"] == []  # every id of flightsql-dbapi's proto is answered
    assert pc.sum(read["v"]).as_py() == sum(range(60))  # the whole dataset was read directly
    # docs/querying.md: flightsql-dbapi reads a plain scan's first endpoint at the catalog, which names the option
    assert "--sql-through-catalog" in got["scan"]


def test_flightsql_dbapi_reads_every_answer_from_a_catalog_that_sends_them_all(make_cluster, flightsql_python):
    """With ``--sql-through-catalog`` every query of the mix flightsql-dbapi sends is answered whole."""
    cluster = make_cluster(2, process=True, catalog_args=["--sql-through-catalog"])
    table = pa.table({"k": [i % 3 for i in range(60)], "v": [float(i) for i in range(60)]})
    with fp.connect(cluster.uri) as writer:
        writer.put("trips", table, tiling=(3, 1))
    where = urlparse(cluster.uri)
    url = f"datafusion://{where.hostname}:{where.port}?insecure=true"
    ran = subprocess.run([str(flightsql_python), "-c", SCRIPT, url, "trips", "SELECT k, v FROM trips WHERE v >= 30"],
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    got = json.loads(ran.stdout)
    assert got["scan"] == 60  # every partition, not the first endpoint's
    assert sorted(got["rows"]) == sorted([k, v] for k, v in zip(table["k"].to_pylist(), table["v"].to_pylist())
                                         if v >= 30)


MIX_SCRIPT = textwrap.dedent("""
    import json, sys
    from flightsql import FlightSQLClient, connect

    host, port, queries = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    conn = connect(FlightSQLClient(host=host, port=port, insecure=True))
    answers = {}
    for name, query in queries.items():
        cursor = conn.cursor()
        cursor.execute(query)
        answers[name] = [list(row) for row in cursor.fetchall()]
    print(json.dumps(answers, default=str))
""")


def _rows(rows: list) -> list:
    """Rows as comparable values, in one order: floats to 9 significant digits (sums add up in any order), the rest as
    text."""
    return sorted([f"{v:.9g}" if isinstance(v, float) else str(v) for v in row] for row in rows)


def test_flightsql_dbapi_gets_every_query_of_the_bench_mix_answered_through_the_catalog(make_cluster,
                                                                                      flightsql_python):
    """flightsql-dbapi's DB-API, which redeems every ticket at the catalog, runs each query of ``flightpart bench
    --sql``'s mix against a catalog started with ``--sql-through-catalog``: each answer is DuckDB's."""
    import duckdb

    from flightpart.bench.queries import taxi_table
    from flightpart.bench.sql_mix import SQL_MIX
    from flightpart.bench.sql_queries import zones_table

    cluster = make_cluster(2, process=True, catalog_args=["--sql-through-catalog"])
    trips, zones = taxi_table(20_000, seed=3), zones_table()
    with fp.connect(cluster.uri) as writer:
        writer.put("trips", trips, tiling=(4, 1))
        writer.put("zones", zones)
    where = urlparse(cluster.uri)
    ran = subprocess.run([str(flightsql_python), "-c", MIX_SCRIPT, where.hostname, str(where.port),
                          json.dumps(SQL_MIX)], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    got = json.loads(ran.stdout)
    con = duckdb.connect()
    con.register("trips", trips)
    con.register("zones", zones)
    for name, query in SQL_MIX.items():
        want = [list(row) for row in con.sql(query).fetchall()]
        assert _rows(got[name]) == _rows(json.loads(json.dumps(want, default=str))), name


def test_adbc_get_info_and_get_objects(sql_cluster):
    with dbapi.connect(sql_cluster.uri) as conn:
        info = conn.adbc_get_info()
        objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
    assert info["vendor_name"] == "flightpart"
    assert info["vendor_version"] == fp.__version__
    tables = {t["table_name"]: [c["column_name"] for c in t["table_columns"]]
              for catalog in objects for schema in catalog["catalog_db_schemas"] for t in schema["db_schema_tables"]}
    assert tables == {"trips": ["k", "v", "name"], "zones": ["id", "zone"]}


USER_SCRIPT = textwrap.dedent("""
    import json, sys
    from flightsql import FlightSQLClient, connect

    host, port, user, password = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    conn = connect(FlightSQLClient(host=host, port=port, user=user, password=password, insecure=True))
    out = {}
    for name, query in (("granted", "SELECT k, v FROM trips WHERE v >= 30"), ("ungranted", "SELECT * FROM payroll")):
        try:
            cursor = conn.cursor()
            cursor.execute(query)
            out[name] = [list(row) for row in cursor.fetchall()]
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out, default=str))
""")


def test_flightsql_dbapi_signs_in_with_a_user_name_and_password(make_cluster, flightsql_python, tmp_path):
    """flightsql-dbapi's ``user``/``password`` (Flight's basic-token handshake) sign in as a user of the catalog, who
    reads what their grant allows, all of it at the catalog, and is refused the rest."""
    from flightpart import tokens

    secret = tmp_path / "secret"
    secret.write_text(tokens.new_secret() + "\n")
    secret.chmod(0o600)
    cluster = make_cluster(2, process=True, root=tmp_path / "c", extra_args=["--token-file", str(secret)])
    table = pa.table({"k": np.arange(100), "v": np.arange(100) % 50})
    with fp.connect(cluster.uri, token=secret.read_text().strip()) as admin:
        admin.put("trips", table, tiling=(4, 1))
        admin.put("payroll", pa.table({"pay": np.arange(3)}))
        admin.users.add("ana", "ana-password-long")
        admin.users.grant("read", "trips", "ana")
    where = urlparse(cluster.uri)
    ran = subprocess.run([str(flightsql_python), "-c", USER_SCRIPT, where.hostname, str(where.port), "ana",
                          "ana-password-long"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    got = json.loads(ran.stdout)
    assert sorted(got["granted"]) == sorted([k, v] for k, v in zip(range(100), [x % 50 for x in range(100)])
                                            if v >= 30)
    assert "may not read payroll" in got["ungranted"]
