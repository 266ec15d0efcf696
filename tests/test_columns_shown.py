"""Columns and their types are shown wherever a dataset is: `show` (text and --json), `ls --long`, the status page."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa

import flightpart as fp
from flightpart.server.state import CatalogState
from flightpart.server.status_page import cluster_status, render, stored_columns

TABLE = pa.table({"pickup_at": pa.array([0, 1], pa.timestamp("us")), "zone": ["a", None], "fare": [1.5, 2.5],
                  "passengers": pa.array([1, None], pa.int16())})


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightpart", *args], capture_output=True, text=True, timeout=120)


def test_show_and_ls_long_name_every_column_and_type(cluster):
    with fp.connect(cluster.uri) as client:
        client.put("typed", TABLE, tiling=(2, 1))
    shown = json.loads(cli("show", "typed", "--json", "--catalog", cluster.uri).stdout)
    assert [(c["name"], c["type"]) for c in shown["columns"]] == [
        ("pickup_at", "timestamp[us]"), ("zone", "string"), ("fare", "double"), ("passengers", "int16")]
    text = cli("show", "typed", "--catalog", cluster.uri).stdout
    assert "pickup_at" in text and "timestamp[us]" in text and "int16" in text
    listed = json.loads(cli("ls", "--long", "--json", "--catalog", cluster.uri).stdout)
    assert ({"name": "zone", "type": "string", "nullable": True}
            in next(r for r in listed if r["name"] == "typed")["columns"])
    long_text = cli("ls", "-l", "--catalog", cluster.uri).stdout
    assert "passengers:" in long_text and "int16" in long_text and "timestamp[us]" in long_text


def test_the_status_page_lists_columns_and_survives_a_schema_it_cannot_read(tmp_path):
    state = CatalogState(tmp_path / "state.db")
    from flightpart.io.access import Access
    from flightpart.io.connections import ConnectionPool

    page = cluster_status(state, ConnectionPool(Access()))
    assert page["datasets"] == []
    entry = {"name": "typed", "version": 1, "shape": [2, 4], "tiling": [1, 1], "nbytes": 10, "partitions": None,
             "columns": [{"name": "zone", "type": "string", "nullable": True},
                         {"name": "<b>", "type": "int64", "nullable": False}]}
    html = render({**page, "datasets": [entry]})
    assert "<code>zone</code> string" in html and "<code>&lt;b&gt;</code> int64" in html
    assert stored_columns(b"not a schema") == [] and stored_columns(None) == []
    assert stored_columns(TABLE.schema.serialize().to_pybytes())[0] == {"name": "pickup_at", "type": "timestamp[us]",
                                                                        "nullable": True}
