"""A node that answers aggregates or top rows with what no node would compute: the reader refuses it with a clear
error, the SQL gateway runs the query whole instead (the right answer, from the node's rows) and says why in its log.

The hostile node is the real node server, serving its own partitions, with its answers to aggregate and top tickets
replaced: wrong types, a missing column, more rows than the dataset has, a group twice, string offsets past their
data (which Arrow's grouping and sorting read out of bounds: that reader runs in a subprocess).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart.local.inprocess import InProcessNode
from flightpart.query.aggregates import partial
from flightpart.query.top import candidates
from flightpart.server.node import NodeServer
from flightpart.server.settings import NodeSettings
from flightpart.wire import Ticket

LIES = {
    "types": lambda t: pa.table({n: pa.array([str(k) for k in range(t.num_rows)]) for n in t.column_names}),
    "a missing column": lambda t: t.select(t.column_names[:1]),
    "more rows than the dataset": lambda t: pa.concat_tables([t] * 500),
    "a group twice": lambda t: pa.concat_tables([t, t.slice(0, 1)]),
}
GLOBAL_LIES = {"a global partial twice": lambda t: pa.concat_tables([t, t])}


def _keys_past_their_data(t: pa.Table) -> pa.Table:
    """The answer with its first column's string offsets pointing far past the keys' bytes (the last offset in range,
    so the cheap checks of the reader's IPC decoder pass): Arrow's grouping reads out of bounds on it."""
    keys = t.column(0).combine_chunks()
    ends = np.frombuffer(keys.buffers()[1], dtype=np.int32, count=len(keys) + 1, offset=4 * keys.offset).copy()
    ends[1] = 1 << 24
    lying = pa.Array.from_buffers(pa.string(), len(keys), [None, pa.py_buffer(ends.tobytes()), keys.buffers()[2]])
    return t.set_column(0, t.field(0), lying)


CRASHING_LIES = {"keys whose offsets run past their data": _keys_past_their_data}


class LyingNode(NodeServer):
    """A node whose answers to aggregate tickets are ``LIES[lie]`` of the true partial (None: the truth)."""

    lie: str | None = None

    def do_get(self, context, ticket):
        spec = Ticket.decode(ticket.ticket)
        if (spec.aggregate is None and spec.top is None) or self.lie is None:
            return super().do_get(context, ticket)
        rows = self.store.open(spec.dataset, spec.version, spec.part)
        truth = candidates(rows, spec.top) if spec.aggregate is None else partial(rows, spec.aggregate)
        return flight.RecordBatchStream({**LIES, **GLOBAL_LIES, **CRASHING_LIES}[self.lie](truth))


@pytest.fixture(scope="module")
def liar(tmp_path_factory, make_cluster):
    root = tmp_path_factory.mktemp("liar")
    cluster = make_cluster(0, root=root)
    node = LyingNode(NodeSettings.in_process(cluster.ips[0], data_dir=str(root / "liar"), catalog=cluster.catalog.uri,
                                             heartbeat=1.0), direct_reads=False)
    cluster.nodes.append(InProcessNode(node))
    node.register()
    rng = np.random.default_rng(3)
    sales = pa.table({"store": [f"s{k}" for k in rng.integers(0, 4, 400)], "amount": rng.random(400) * 100})
    with fp.connect(cluster.uri) as client:
        client.put("sales", sales, tiling=(1, 1))
        yield client, node, sales
    node.lie = None
    cluster.stop()


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_lying_partial_is_refused_and_sql_answers_from_the_rows(liar, lie, caplog):
    client, node, sales = liar
    node.lie = lie
    try:
        # more rows than the partition holds are refused as they arrive, by the reader's row bound
        said = "more than the 400 rows the catalog says the partition holds" if lie == "more rows than the dataset" \
            else "partial aggregate .*not used"
        with pytest.raises(fp.ServerError, match=said):
            client.open("sales").aggregate([("amount", "sum"), ("amount", "count")], by=["store"])
        query = "SELECT store, sum(amount) AS total, count(*) AS n FROM sales GROUP BY store ORDER BY store"
        with caplog.at_level(logging.WARNING, logger="flightpart.sql"):
            got = client.sql(query).to_arrow()
        assert "the query runs whole" in caplog.text
        assert any(why in caplog.text for why in ("not used", "could not be used")), caplog.text
    finally:
        node.lie = None
    want = _duckdb_answer(sales, query)
    assert got.column("store").to_pylist() == want.column("store").to_pylist()
    assert got.column("n").to_pylist() == want.column("n").to_pylist()
    assert np.allclose(got.column("total").to_numpy(), want.column("total").to_numpy())
    # the node, honest again
    truth = client.open("sales").aggregate([("amount", "count")], by=["store"]).sort_by("store")
    assert truth.column("amount_count").to_pylist() == want.column("n").to_pylist()


def _duckdb_answer(sales: pa.Table, query: str) -> pa.Table:
    con = duckdb.connect()
    con.register("sales", sales)
    return con.sql(query).to_arrow_table()


@pytest.mark.parametrize("lie", sorted(GLOBAL_LIES))
def test_a_global_aggregate_takes_one_row_per_partition(liar, lie):
    """Without keys a partition's partial is one row: two would be summed twice."""
    client, node, sales = liar
    node.lie = lie
    try:
        # refused as it arrives by the reader's row bound (before, by the partials' check after the read)
        with pytest.raises(fp.ServerError, match="more than one row, the most its ticket can give"):
            client.open("sales").aggregate([("amount", "sum"), ("amount", "count")])
        got = client.sql("SELECT sum(amount) AS total, count(*) AS n FROM sales").to_arrow()
    finally:
        node.lie = None
    assert got.column("n").to_pylist() == [sales.num_rows]
    assert np.isclose(got.column("total")[0].as_py(), pc.sum(sales.column("amount")).as_py())


@pytest.mark.parametrize("lie", sorted(CRASHING_LIES))
def test_an_answer_arrow_would_read_out_of_bounds_is_refused_in_a_reader_that_survives(liar, lie):
    """The reader runs in a subprocess: combining such keys, or ordering such top rows, killed it with a signal. It
    gets the refusal, and SQL
    (whose gateway combines in the catalog's process, this one) answers from the rows."""
    client, node, sales = liar
    node.lie = lie
    code = f"""
import json
import flightpart as fp
with fp.connect({client.uri!r}) as client:
    for ask in (lambda ds: ds.aggregate([("amount", "sum")], by=["store"]), lambda ds: ds.top(5, "store")):
        try:
            ask(client.open("sales"))
        except fp.ServerError as exc:
            print(exc.code, exc)
    print(json.dumps(client.sql("SELECT count(*) AS n FROM sales GROUP BY store").to_arrow().column("n").to_pylist()))
"""
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    finally:
        node.lie = None
    assert done.returncode == 0, f"the reader ended with {done.returncode}: {done.stderr[-2000:]}"
    aggregate, top, counts = done.stdout.splitlines()
    for answer in (aggregate, top):  # refused as it is read, naming the node (flightpart.query.soundness)
        assert (answer.startswith("INTERNAL partition") and "cannot be read safely" in answer
                and node.uri in answer), answer
    assert sorted(json.loads(counts)) == sorted(pc.value_counts(sales.column("store")).field("counts").to_pylist())
