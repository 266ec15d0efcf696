"""Query history: each SQL query is one INFO log line, is listed by `flightpart queries`, on the status page and in
/status.json, and is counted in a latency histogram; an admin's call, refused to a reader."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.local.cluster import Daemon
from flightpart.tokens import new_secret, role_token

QUERIES = {"SELECT sum(x) AS total FROM hist WHERE x > 1": "ok", "SELECT x FROM hist": "endpoints",
           "SELECT * FROM no_such_table": "DATASET_NOT_FOUND"}


@pytest.fixture(scope="module")
def daemons(tmp_path_factory):
    root = tmp_path_factory.mktemp("history")
    secret = root / "secret"
    secret.write_text(new_secret())
    secret.chmod(0o600)
    catalog = Daemon(["--log-level", "INFO", "catalog", "--host", "127.0.0.1", "--port", "0", "--state-dir",
                      str(root / "state"), "--metrics-port", "0", "--secret-file", str(secret)])
    node = Daemon(["serve", "--host", "127.0.0.236", "--port", "0", "--data-dir", str(root / "n"), "--catalog",
                   catalog.uris["catalog"], "--heartbeat", "0.5", "--secret-file", str(secret)])
    yield catalog, node, secret.read_bytes()
    node.stop()
    catalog.stop()


def test_each_query_is_logged_listed_shown_and_timed(daemons):
    catalog, _node, secret = daemons
    uri, admin = catalog.uris["catalog"], role_token(secret, "admin", "ops")
    reader = role_token(secret, "reader", "alice")
    with fp.connect(uri, token=admin) as client:
        client.put("hist", pa.table({"x": [1, 2, 3]}))
    with flight_sql.connect(uri, db_kwargs={"adbc.flight.sql.authorization_header": f"Bearer {reader}"}) as conn:
        for sql in QUERIES:
            with conn.cursor() as cur:
                try:
                    cur.execute(sql)
                    cur.fetch_arrow_table()
                except flight_sql.Error:
                    pass  # the unknown table: refused, and listed as such
    listed = subprocess.run([sys.executable, "-m", "flightpart", "queries", "--json", "--catalog", uri],
                            capture_output=True, text=True, timeout=60, env={"FLIGHTPART_TOKEN": admin, "PATH": ""})
    assert listed.returncode == 0, listed.stderr
    seen = {q["text"]: q for q in json.loads(listed.stdout) if q["text"] in QUERIES}
    assert {text: q["outcome"] for text, q in seen.items()} == QUERIES
    assert all(q["caller"] == "reader:alice" and q["seconds"] >= 0 for q in seen.values())
    assert seen["SELECT sum(x) AS total FROM hist WHERE x > 1"]["rows"] == 1
    log = catalog.log()
    for text, outcome in QUERIES.items():
        assert sum(f"by reader:alice: {outcome} in" in line and line.endswith(text) for line in log.splitlines()) == 1
    metrics_url = catalog.uris["catalog-metrics"]
    status = json.loads(urllib.request.urlopen(metrics_url.replace("/metrics", "/status.json"), timeout=10).read())
    assert {q["text"] for q in status["queries"]["recent"]} >= set(QUERIES)
    page = urllib.request.urlopen(metrics_url.replace("/metrics", "/"), timeout=10).read().decode()
    assert "SQL queries" in page and "SELECT sum(x) AS total FROM hist WHERE x &gt; 1" in page
    metrics = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    count = next(line for line in metrics.splitlines()
                 if line.startswith("flightpart_sql_query_duration_seconds_count"))
    assert float(count.split()[-1]) >= len(QUERIES)


def test_a_reader_may_not_list_the_queries(daemons):
    catalog, _node, secret = daemons
    with fp.connect(catalog.uris["catalog"], token=role_token(secret, "reader", "bob")) as client:
        with pytest.raises(fp.Forbidden):
            client.queries()
