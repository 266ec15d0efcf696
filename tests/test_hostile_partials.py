"""A node that answers aggregates with what no node would compute: the reader refuses it with a clear error, the SQL
gateway runs the query whole instead (the right answer, from the node's rows) and says why in its log.

The hostile node is the real node server, serving its own partitions, with its answers to aggregate tickets
replaced: wrong types, a missing column, more rows than the dataset has, a group twice.
"""

from __future__ import annotations

import logging

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart.local.inprocess import InProcessCluster, InProcessNode
from flightpart.query.aggregates import partial
from flightpart.server.node import NodeServer
from flightpart.wire import Ticket

LIES = {
    "types": lambda t: pa.table({n: pa.array([str(k) for k in range(t.num_rows)]) for n in t.column_names}),
    "a missing column": lambda t: t.select(t.column_names[:1]),
    "more rows than the dataset": lambda t: pa.concat_tables([t] * 500),
    "a group twice": lambda t: pa.concat_tables([t, t.slice(0, 1)]),
}
GLOBAL_LIES = {"a global partial twice": lambda t: pa.concat_tables([t, t])}


class LyingNode(NodeServer):
    """A node whose answers to aggregate tickets are ``LIES[lie]`` of the true partial (None: the truth)."""

    lie: str | None = None

    def do_get(self, context, ticket):
        spec = Ticket.decode(ticket.ticket)
        if spec.aggregate is None or self.lie is None:
            return super().do_get(context, ticket)
        truth = partial(self.store.open(spec.dataset, spec.version, spec.part), spec.aggregate)
        return flight.RecordBatchStream({**LIES, **GLOBAL_LIES}[self.lie](truth))


@pytest.fixture(scope="module")
def liar(tmp_path_factory):
    root = tmp_path_factory.mktemp("liar")
    cluster = InProcessCluster(root, nodes=0)
    node = LyingNode("127.0.0.31", 0, data_dir=root / "liar", catalog=cluster.catalog.uri, heartbeat_interval=1.0,
                     direct_reads=False)
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
        with pytest.raises(fp.ServerError, match="partial aggregate .*not used"):
            client.open("sales").aggregate([("amount", "sum"), ("amount", "count")], by=["store"])
        query = "SELECT store, sum(amount) AS total, count(*) AS n FROM sales GROUP BY store ORDER BY store"
        with caplog.at_level(logging.WARNING, logger="flightpart.sql"):
            got = client.sql(query).to_arrow()
        assert "the query runs whole" in caplog.text and "not used" in caplog.text
    finally:
        node.lie = None
    want = _duckdb_answer(sales, query)
    assert got.column("store").to_pylist() == want.column("store").to_pylist()
    assert got.column("n").to_pylist() == want.column("n").to_pylist()
    assert np.allclose(got.column("total").to_numpy(), want.column("total").to_numpy())
    truth = client.open("sales").aggregate([("amount", "count")], by=["store"]).sort_by("store")  # the node, honest again
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
        with pytest.raises(fp.ServerError, match="more rows than the 1 it can have"):
            client.open("sales").aggregate([("amount", "sum"), ("amount", "count")])
        got = client.sql("SELECT sum(amount) AS total, count(*) AS n FROM sales").to_arrow()
    finally:
        node.lie = None
    assert got.column("n").to_pylist() == [sales.num_rows]
    assert np.isclose(got.column("total")[0].as_py(), pc.sum(sales.column("amount")).as_py())
