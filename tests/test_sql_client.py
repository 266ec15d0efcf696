"""``client.sql`` and ``flightpart sql``: the catalog's Flight SQL from Python and the command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

import flightpart as fp
from flightpart.wire import Ticket


@pytest.fixture(scope="module")
def sales(cluster):
    rng = np.random.default_rng(9)
    table = pa.table({"store": [f"s{k}" for k in rng.integers(0, 4, 4_000)], "amount": rng.random(4_000) * 100,
                      "units": rng.integers(1, 9, 4_000)})
    with fp.connect(cluster.uri) as client:
        client.put("sql-sales", table, tiling=(4, 1))
    return table


def test_client_sql_answers_as_an_arrow_stream_and_as_frames(cluster, sales):
    with fp.connect(cluster.uri) as client:
        result = client.sql('SELECT store, sum(units) AS units FROM "sql-sales" GROUP BY store ORDER BY store')
        table = pa.table(result)
        want = pl.from_arrow(sales).group_by("store").agg(pl.col("units").sum()).sort("store")
        assert table.column("units").to_pylist() == want["units"].to_list()
        assert result.to_polars().equals(pl.from_arrow(table)) and len(result.to_pandas()) == 4
        with pytest.raises(fp.RequestRejected, match="nope"):
            client.sql('SELECT nope FROM "sql-sales"')
        with pytest.raises(fp.DatasetNotFound):
            client.sql("SELECT * FROM nosuch")
        with pytest.raises(fp.RequestRejected, match="one query"):
            client.sql("CREATE TABLE x AS SELECT 1")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightpart", *args], capture_output=True, text=True, timeout=120)


def test_the_command_prints_writes_and_refuses_clearly(cluster, sales, tmp_path):
    query = 'SELECT store, count(*) AS n FROM "sql-sales" GROUP BY store ORDER BY store'
    shown = cli("sql", query, "--catalog", cluster.uri)
    assert shown.returncode == 0 and "s0" in shown.stdout and "s3" in shown.stdout, shown.stderr
    rows = json.loads(cli("sql", query, "--json", "--catalog", cluster.uri).stdout)
    assert sum(r["n"] for r in rows) == sales.num_rows
    written = cli("sql", query, "-o", str(tmp_path / "counts.parquet"), "--catalog", cluster.uri)
    assert written.returncode == 0 and pq.read_table(tmp_path / "counts.parquet").num_rows == 4
    bad = cli("sql", "SELEC 1", "--catalog", cluster.uri)
    assert bad.returncode != 0 and "syntax" in bad.stderr.lower() and "Traceback" not in bad.stderr


class CancellingEndpoint(flight.FlightServerBase):
    """A server that answers a query with one endpoint, then cancels that endpoint's stream after a batch."""

    def get_flight_info(self, context, descriptor):
        schema = pa.schema([("k", pa.int64())])
        return flight.FlightInfo(schema, descriptor, [flight.FlightEndpoint(b"answer", [])], -1, -1)

    def do_get(self, context, ticket):
        def batches():
            yield pa.record_batch({"k": pa.array(range(10))})
            raise flight.FlightCancelledError("cancelled by the server")

        return flight.GeneratorStream(pa.schema([("k", pa.int64())]), batches())


def test_a_cancelled_answer_stream_is_an_error_where_it_was_read_not_a_later_ctrl_c():
    server = CancellingEndpoint("grpc://127.0.0.1:0")
    try:
        with fp.connect(f"grpc://127.0.0.1:{server.port}") as client:
            with pytest.raises(fp.NodeUnavailable, match="cancelled"):
                client.sql("SELECT k FROM anything")
            for _ in range(10):  # a cancelled pyarrow read_all raises KeyboardInterrupt here, in the main thread, later
                time.sleep(0.05)
    finally:
        server.shutdown()


@pytest.mark.slow  # a fault test: a node frozen for the idle timeout
def test_a_plain_scan_reads_past_a_frozen_replica_as_get_does(make_cluster):
    """A plain scan's endpoints name every replica of their partition: a frozen first one is left after the idle
    timeout for the next (as ``get`` does), not waited on until the call's deadline and then failed."""
    c = make_cluster(3, process=True)
    table = pa.table({"k": np.arange(30_000), "v": np.arange(30_000) * 0.5})
    # an idle timeout that a healthy replica meets on a loaded machine, well short of the call's deadline
    with fp.connect(c.uri, timeout=60.0, idle_timeout=8.0) as client:
        ds = client.put("sql-frozen", table, tiling=(6, 1), replicas=2)
        firsts = {p["data"].replicas[0][0] for p in ds.__partitioned__["partitions"].values()}
        victim = next(n for n in c.nodes if n.uri in firsts)
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            answer = pa.table(client.sql('SELECT k, v FROM "sql-frozen" WHERE k >= 100'))
        finally:
            os.kill(victim.pid, signal.SIGCONT)
    assert answer.sort_by("k").equals(table.filter(pc.field("k") >= 100))


ANSWER = pa.schema([("k", pa.int64()), ("v", pa.float64())])


class PlainScanParts(flight.FlightServerBase):
    """A catalog whose answer is two partitions at itself, as a plain scan's is at the nodes; the second part's
    columns as ``self.second`` says (a node that is faulty, or lies)."""

    second = "honest"

    def get_flight_info(self, context, descriptor):
        here = f"grpc://127.0.0.1:{self.port}"
        parts = [Ticket("t", 1, (i, 0)).encode() for i in range(2)]
        return flight.FlightInfo(ANSWER, descriptor, [flight.FlightEndpoint(t, [here]) for t in parts], -1, -1)

    def do_get(self, context, ticket):
        rows = pa.table({"k": pa.array(range(5), pa.int64()), "v": pa.array([0.5] * 5)})
        if Ticket.decode(ticket.ticket).part == (1, 0):
            rows = {"honest": rows, "swapped": rows.select(["v", "k"]), "short": rows.select(["k"]),
                    "not null": rows.cast(pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.float64())]))
                    }[self.second]
        return flight.RecordBatchStream(rows)


@pytest.mark.parametrize("second", ["swapped", "short", "not null"])
def test_a_plain_scan_part_with_other_columns_is_refused_naming_its_node_and_nullability_does_not_matter(second):
    server = PlainScanParts("grpc://127.0.0.1:0")
    server.second = second
    try:
        with fp.connect(f"grpc://127.0.0.1:{server.port}", idle_timeout=5.0) as client:
            if second == "not null":  # the same columns: the parts join, as the answer's schema
                answer = pa.table(client.sql("SELECT * FROM t"))
                assert answer.schema.equals(ANSWER) and answer.num_rows == 10
            else:  # Arrow's own "Schema at index 1 was different" had reached the caller, or a column went missing
                with pytest.raises(fp.ServerError, match=f"part 1 of the SQL answer.*127.0.0.1:{server.port}"):
                    client.sql("SELECT * FROM t")
    finally:
        server.shutdown()


class Replica(flight.FlightServerBase):
    """One replica of a one-partition answer, sending ``value`` after ``delay`` seconds; as the catalog, it names
    itself first and ``others`` after."""

    def __init__(self, value: float, delay: float = 0.0, others: tuple[str, ...] = (), names_itself: bool = True):
        super().__init__("grpc://127.0.0.1:0")
        self.value, self.delay, self.others, self.names_itself = value, delay, others, names_itself

    def get_flight_info(self, context, descriptor):
        here = [f"grpc://127.0.0.1:{self.port}"] if self.names_itself else []
        return flight.FlightInfo(ANSWER, descriptor, [flight.FlightEndpoint(Ticket("t", 1, (0, 0)).encode(),
                                                                            [*here, *self.others])], -1, -1)

    def do_get(self, context, ticket):
        time.sleep(self.delay)
        return flight.RecordBatchStream(pa.table({"k": pa.array([1], pa.int64()), "v": [self.value]}))


@pytest.mark.slow  # a fault test: replicas that send nothing for seconds
def test_a_plain_scan_part_is_read_with_the_clients_idle_timeout():
    """A first replica that sends nothing for 6 s is left for the next under the default idle timeout (2 s), and
    waited for by a client that allows 60 s, as its ``get`` would (4 s of margin for a loaded machine's watchdog)."""
    fast = Replica(0.5)
    slow = Replica(1.0, delay=6.0, others=(f"grpc://127.0.0.1:{fast.port}",))
    try:
        for idle, value in ((60.0, 1.0), (2.0, 0.5)):
            with fp.connect(f"grpc://127.0.0.1:{slow.port}", idle_timeout=idle, timeout=120) as client:
                assert pa.table(client.sql("SELECT * FROM t")).column("v").to_pylist() == [value], idle
    finally:
        slow.shutdown()
        fast.shutdown()


def test_a_plain_scan_part_at_a_down_first_location_is_read_from_the_next():
    """A first location that refuses connections (its node killed) is passed over at once for the next."""
    gone = Replica(9.0)
    down = f"grpc://127.0.0.1:{gone.port}"
    gone.shutdown()
    alive = Replica(0.5)
    catalog = Replica(0.25, others=(down, f"grpc://127.0.0.1:{alive.port}"), names_itself=False)
    try:
        with fp.connect(f"grpc://127.0.0.1:{catalog.port}", timeout=60) as client:
            assert pa.table(client.sql("SELECT * FROM t")).column("v").to_pylist() == [0.5]
    finally:
        catalog.shutdown()
        alive.shutdown()
