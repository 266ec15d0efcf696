"""A node that answers reads with arrays no reader can read safely: string or list offsets past their data,
dictionary indices past their dictionary (bytes any peer can send, which pass pyarrow's cheap checks).

Every process that computes on what it receives is attacked: a reader (its own conversions, Polars), the SQL
gateway inside the catalog, an honest node assembling a repartition. None is killed by a signal: the replica is
passed over for another, and where there is none the reader gets a coded error. The rogue node, the catalog and
the honest node run as processes of their own, and each reader in a subprocess, so a crash is seen as a signal.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightpart as fp

ROGUE = '''
import sys, time
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
from flightpart.query.apply import apply_ticket
from flightpart.server.node import NodeServer
from flightpart.server.settings import NodeSettings
from flightpart.wire import PartRun, Ticket


def offsets(t):
    """The string column's second offset far past its data (the last one in range)."""
    col = t.column("s").combine_chunks()
    ends = np.frombuffer(col.buffers()[1], dtype=np.int32, count=len(col) + 1, offset=4 * col.offset).copy()
    ends[1] = 1 << 24
    return t.set_column(t.schema.get_field_index("s"), "s",
                        pa.Array.from_buffers(pa.string(), len(col),
                                              [None, pa.py_buffer(ends.tobytes()), col.buffers()[2]]))


def list_offsets(t):
    col = t.column("l").combine_chunks()
    ends = np.frombuffer(col.buffers()[1], dtype=np.int32, count=len(col) + 1, offset=4 * col.offset).copy()
    ends[1] = 1 << 24
    lying = pa.ListArray.from_buffers(col.type, len(col), [None, pa.py_buffer(ends.tobytes())], children=[col.values])
    return t.set_column(t.schema.get_field_index("l"), "l", lying)


def dictionary(t):
    col = t.column("d").combine_chunks()
    indices = np.full(len(col), 1 << 28, dtype=np.int32)
    indices[0] = 0
    lying = pa.DictionaryArray.from_arrays(pa.array(indices, col.type.index_type), col.dictionary, safe=False)
    return t.set_column(t.schema.get_field_index("d"), "d", lying)


def other_type(t):
    """Sound arrays, right rows, one column of another type than the partition was stored with."""
    return t.set_column(t.schema.get_field_index("k"), "k", t.column("k").cast(pa.int32()))


def renamed(t):
    return t.rename_columns(["kk" if n == "k" else n for n in t.column_names])


def dropped(t):
    return t.drop_columns(["s"]) if "s" in t.column_names else t


def extra_rows(t):
    """Sound arrays, one row more than the partition holds."""
    return pa.concat_tables([t, t.slice(0, 1)])


def fewer_rows(t):
    return t.slice(0, t.num_rows - 1)


def doubled(t):
    """Every row sent twice: more than a filter or a top could keep of the partition."""
    return pa.concat_tables([t, t])


LIES = {"offsets": ("s", offsets), "list offsets": ("l", list_offsets), "dictionary indices": ("d", dictionary),
        "extra rows": ("k", extra_rows), "fewer rows": ("k", fewer_rows), "other type": ("k", other_type),
        "renamed": ("k", renamed), "dropped": ("k", dropped), "doubled": ("k", doubled)}


RUN_LIES = {"run rows shifted": (1, -1), "run rows past the batch": (1000, 0)}
COLUMN_LIES = ("other type", "renamed", "dropped")


def lying_run(store, spec, lie):
    """The partitions a shared stream asks for in one batch: honest rows with their PartRun's counts changed (the
    first partition told longer, and the second shorter or nothing past the batch's end to take it from), or
    honest counts with the batch's columns changed as ``LIES`` says."""
    positions = (spec.part, *spec.more)
    tables = [apply_ticket(store.open(spec.dataset, spec.version, p), spec.columns, None) for p in positions]
    told = [t.num_rows for t in tables]
    whole = pa.concat_tables(tables).combine_chunks()
    if lie in RUN_LIES:
        told[0] += RUN_LIES[lie][0]
        told[1] += RUN_LIES[lie][1]
    else:
        whole = LIES[lie][1](whole)
    header = pa.py_buffer(PartRun(tuple(positions), tuple(told)).encode())
    with open(sys.argv[4] + ".told", "a") as f:
        f.write(f"{lie} {len(positions)}\\n")
    return flight.GeneratorStream(whole.schema, iter([(whole.to_batches()[0], header)]))


SENT = 0


def endless(store, spec, empty=False):
    """The partition's rows (as asked: columns, rows, filter, top, aggregate), then the same again, without end; or
    (``empty``) batches of no rows without end."""
    rows = apply_ticket(store.open(spec.dataset, spec.version, spec.part), spec.columns, spec.rows, spec.filter,
                        spec.matched, spec.aggregate, bool(spec.row_numbers), spec.top).combine_chunks()
    batch = rows.to_batches()[0] if rows.num_rows else None
    if empty and batch is not None:
        batch = batch.slice(0, 0)

    def forever():
        global SENT
        while batch is not None:
            SENT += 1
            if SENT % 100 == 0:  # what it sent, for the test: a reader that read on would have taken millions
                with open(sys.argv[4] + ".sent", "w") as f:
                    f.write(str(SENT))
            yield batch

    return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(rows.schema, forever()))


def bloated(store, spec):
    """The rows asked for (several partitions of a shared stream too, with their run header; what a filter, a row
    range, a top or an aggregate keeps), with the text column "s" (where it is sent) at 256 KiB a value or more (32
    MiB in all): sound arrays, the right rows and columns, a thousand times the bytes the catalog says. None when
    the stream has no "s"."""
    positions = (spec.part, *(spec.more or ()))
    tables = [apply_ticket(store.open(spec.dataset, spec.version, p), spec.columns, spec.rows, spec.filter,
                           spec.matched, spec.aggregate, bool(spec.row_numbers), spec.top) for p in positions]
    whole = pa.concat_tables(tables).combine_chunks()
    if "s" not in whole.column_names or not whole.num_rows:
        return None
    size = max(1 << 18, (32 << 20) // whole.num_rows)
    values = pa.array([f"{k:06d}" + "x" * size for k in range(whole.num_rows)])  # distinct: groups stay groups
    whole = whole.set_column(whole.schema.get_field_index("s"), "s", values)
    batches = whole.to_batches(max_chunksize=10)
    if spec.more is None:
        return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(whole.schema, iter(batches)))
    header = pa.py_buffer(PartRun(tuple(positions), tuple(t.num_rows for t in tables)).encode())
    return flight.GeneratorStream(whole.schema, iter([(batches[0], header), *batches[1:]]))


class Rogue(NodeServer):
    def do_get(self, context, ticket):
        with open(sys.argv[4]) as f:
            lie = f.read().strip()
        spec = Ticket.decode(ticket.ticket)
        if lie == "bloated":
            return bloated(self.store, spec) or super().do_get(context, ticket)
        if (lie in RUN_LIES or lie in COLUMN_LIES) and spec.more is not None:
            return lying_run(self.store, spec, lie)
        if lie == "endless":  # a shared stream's too (its first partition's rows), and an aggregate's partial
            return endless(self.store, spec)
        if lie == "endless empty":
            return endless(self.store, spec, empty=True)
        if lie not in LIES or spec.more is not None or spec.aggregate is not None or (spec.top and lie != "doubled"):
            return super().do_get(context, ticket)
        rows = apply_ticket(self.store.open(spec.dataset, spec.version, spec.part), spec.columns, spec.rows,
                            spec.filter, spec.matched, None, bool(spec.row_numbers), spec.top)
        column, lying = LIES[lie]
        if column not in rows.column_names:  # a projection without the lie's column: its true rows
            return super().do_get(context, ticket)
        return flight.RecordBatchStream(lying(rows))


node = Rogue(NodeSettings.in_process(sys.argv[2], data_dir=sys.argv[3], catalog=sys.argv[1], heartbeat=1.0),
             direct_reads=False)
node.register()
print("READY", node.uri, flush=True)
while True:
    time.sleep(3600)
'''

LIES = ["offsets", "list offsets", "dictionary indices"]
HONEST, ROGUE_IP, READER = "127.0.0.61", "127.0.0.62", "127.0.0.63"


@pytest.fixture(scope="module")
def rogue(tmp_path_factory, make_cluster):
    root = tmp_path_factory.mktemp("rogue")
    mode = root / "lie"
    mode.write_text("none")
    script = root / "rogue.py"
    script.write_text(ROGUE)
    cluster = make_cluster(1, process=True, first_ip=61, root=root / "cluster")  # HONEST; the rogue and READER next
    proc = subprocess.Popen([sys.executable, str(script), cluster.uri, ROGUE_IP, str(root / "rogue-data"), str(mode)],
                            stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)  # a rogue that never starts fails the test, not CI
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("READY"), "the rogue node did not start"
        rogue_uri = line.split()[1]
        table = pa.table({"k": list(range(400)), "s": [f"text {k}" for k in range(400)],
                          "l": [[k, k + 1] for k in range(400)],
                          "d": pa.array([f"cat{k % 5}" for k in range(400)]).dictionary_encode()})
        with fp.connect(cluster.uri) as client:
            client.put("alone", table, tiling=(2, 1), nodes=[rogue_uri])
            client.put("twice", table, tiling=(2, 1), replicas=2, nodes=[rogue_uri, cluster.nodes[0].uri])
            client.put("small", table.select(["k", "s"]), tiling=(4, 1), nodes=[rogue_uri])  # shares a read stream
            client.put("plain", table.select(["k", "s"]), tiling=(2, 1), replicas=2,
                       nodes=[rogue_uri, cluster.nodes[0].uri])
        yield cluster, proc, mode, table
    finally:
        proc.kill()
        proc.wait(30)
        cluster.stop()


def _reader(cluster, code: str) -> list:
    """``code`` run in a reader on a host of its own (every read streams); what it printed, a JSON value a line."""
    program = f"import json, flightpart as fp\nclient = fp.connect({cluster.uri!r})\n" + code
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "FLIGHTPART_HOST": READER})
    assert done.returncode == 0, f"the reader ended with {done.returncode}: {done.stderr[-3000:]}"
    return [json.loads(line) for line in done.stdout.splitlines()]


ASK = '''
def ask(what, fn):
    try:
        fn()
        print(json.dumps([what, "answered"]))
    except Exception as exc:  # DuckDB wraps what its Arrow source raised in an error of its own
        print(json.dumps([what, getattr(exc, "code", type(exc).__name__), str(exc)]))
'''



def _told_to_lie(mode, cluster, lie: str, code: str) -> dict:
    """What a reader running ``code`` (after :data:`ASK`) printed while the rogue told ``lie``: each line's first
    value -> the rest."""
    (mode.parent / "lie.told").unlink(missing_ok=True)
    mode.write_text(lie)
    try:
        answers = _reader(cluster, ASK + code)
    finally:
        mode.write_text("none")
    return {a[0]: a[1:] for a in answers}


def _lies_told(mode) -> list[str]:
    """The shared streams the rogue lied in since :func:`_told_to_lie` last set it lying (lie, partitions)."""
    told = mode.parent / "lie.told"
    return told.read_text().splitlines() if told.exists() else []

@pytest.mark.parametrize("lie", LIES)
def test_rows_no_reader_can_read_safely_kill_no_reader_gateway_or_node(rogue, lie):
    cluster, proc, mode, table = rogue
    got = _told_to_lie(mode, cluster, lie, f"HONEST_URI = {cluster.nodes[0].uri!r}\n" + '''
ds = client.open("alone")
ask("to_arrow", ds.to_arrow)
ask("to_polars", ds.to_polars)
ask("to_pandas", ds.to_pandas)
ask("to_duckdb", lambda: ds.to_duckdb().fetchall())
ask("sql", lambda: client.sql("SELECT k, s, l, d, row_number() OVER (ORDER BY k) AS n FROM alone").to_arrow())
ask("sql scan", lambda: client.sql("SELECT s, l, d FROM alone").to_arrow().to_pylist())  # endpoints at the nodes
ask("repartition", lambda: client.repartition("alone", (1, 1), nodes=[HONEST_URI]))
twice = client.open("twice").to_arrow().sort_by("k")
print(json.dumps(["twice", twice.column("k").to_pylist(), twice.column("s").to_pylist()[:3]]))
scanned = client.sql("SELECT k, s FROM twice").to_arrow().sort_by("k")
print(json.dumps(["sql scan twice", scanned.column("k").to_pylist(), scanned.column("s").to_pylist()[:3]]))
''')
    for what in ("to_arrow", "to_polars", "to_pandas"):
        code, message = got[what]
        assert code == "INTERNAL" and "cannot be read safely" in message and ROGUE_IP in message, (what, got[what])
    assert "cannot be read safely" in got["to_duckdb"][1] and ROGUE_IP in got["to_duckdb"][1], got["to_duckdb"]
    assert got["sql"][0] != "answered", got["sql"]
    code, message = got["sql scan"]  # a plain scan's answer is read from the nodes themselves
    assert code == "INTERNAL" and "cannot be read safely" in message and ROGUE_IP in message, got["sql scan"]
    assert got["repartition"][0] != "answered", got["repartition"]
    # a replica that lies is passed over: the honest one's rows
    assert got["twice"] == [table.column("k").to_pylist(), table.column("s").to_pylist()[:3]]
    assert got["sql scan twice"] == got["twice"]  # a plain scan's part passes the lying replica over too
    # nobody was killed: the catalog (with its SQL gateway), the honest node (which assembled) and the rogue
    assert cluster.catalog.proc.poll() is None and cluster.nodes[0].proc.poll() is None and proc.poll() is None
    with fp.connect(cluster.uri) as client:
        assert client.sql("SELECT count(*) AS n FROM twice").to_arrow().column("n").to_pylist() == [table.num_rows]
        assert client.open("alone").version == 1  # no repartition was published


@pytest.mark.parametrize("lie", ["extra rows", "fewer rows"])
def test_a_node_that_sends_other_rows_than_the_catalog_says_is_passed_over(rogue, lie):
    """Sound arrays but a row added or dropped: a reader's frame would silently have another shape than its
    ``__partitioned__`` says. The reader checks the count against the catalog's and asks the next replica."""
    cluster, proc, mode, table = rogue
    got = _told_to_lie(mode, cluster, lie, '''
ds = client.open("alone")
ask("to_arrow", ds.to_arrow)
ask("to_pandas", ds.to_pandas)
twice = client.open("twice").to_arrow().sort_by("k")
print(json.dumps(["twice", twice.num_rows, twice.column("k").to_pylist()]))
''')
    for what in ("to_arrow", "to_pandas"):
        code, message = got[what]
        said = ("more than the 200 rows the catalog says" if lie == "extra rows"
                else "199 rows where the catalog says 200")
        assert code == "INTERNAL" and said in message and ROGUE_IP in message, got[what]
    assert got["twice"] == [table.num_rows, table.column("k").to_pylist()]
    assert proc.poll() is None


def test_a_node_that_sends_more_rows_than_its_partition_holds_for_a_filter_or_a_top_is_passed_over(rogue):
    """A filtered or top read has no exact count to check, but neither can keep more rows than the partition holds:
    a node sending every row twice gave a frame of twice the rows without a word. Now INTERNAL naming it where it is
    the only replica; the honest replica's rows where there are two."""
    cluster, proc, mode, table = rogue
    got = _told_to_lie(mode, cluster, "doubled", '''
import pyarrow.compute as pc
ds = client.open("alone")
ask("filtered", lambda: ds.filter(pc.field("k") >= 0).to_arrow())
ask("top", lambda: ds.top(150, "k"))
twice = client.open("twice")
kept = twice.filter(pc.field("k") >= 0).to_arrow().sort_by("k")
print(json.dumps(["twice", kept.num_rows, kept.column("k").to_pylist(), twice.top(150, "k").column("k").to_pylist()]))
''')
    for what in ("filtered", "top"):
        code, message = got[what]
        assert (code == "INTERNAL"
                and "more than the 200 rows the catalog says the partition holds" in message), got[what]
        assert ROGUE_IP in message, got[what]
    assert got["twice"] == [table.num_rows, table.column("k").to_pylist(), list(range(150))]
    assert proc.poll() is None


def test_a_local_read_with_other_rows_than_the_catalog_says_is_streamed_instead(rogue):
    """A reader on a node's host maps the file the node vouches for: a file with other rows than the node
    registered (changed under a node that vouches for it anyway) is not taken; the read streams, checked."""
    from dataclasses import replace

    from flightpart.client.fetch import read_local
    from flightpart.io.connections import ConnectionPool
    from flightpart.query.catalog_columns import CatalogColumns

    cluster, _proc, _mode, table = rogue
    with fp.connect(cluster.uri) as client:
        ref = client.open("twice").__partitioned__["partitions"][(0, 0)]["data"]
    assert ref.known_rows == 200
    with ConnectionPool() as pool:
        mapped = read_local(ref, frozenset({HONEST}), pool)
        assert mapped is not None and mapped.num_rows == 200  # the honest node's file, mapped here
        assert read_local(replace(ref, expected_rows=199), frozenset({HONEST}), pool) is None
        # a file whose columns are not the catalog's (here: a catalog that says k is int32) is not taken either
        assert read_local(ref, frozenset({HONEST}), pool, CatalogColumns(table.schema)) is not None
        claimed = CatalogColumns(table.schema.set(0, pa.field("k", pa.int32())))
        assert read_local(ref, frozenset({HONEST}), pool, claimed) is None


def test_a_node_that_sends_rows_without_end_is_left_before_the_reader_runs_out_of_memory(rogue):
    """A stream that never ends (the partition's rows, again and again) was read to its end: the reader's memory grew
    until the stream's deadline, an hour, or until the machine killed it. A reader stops at the first batch past the
    rows the catalog says the partition holds (for a filter, a top or an aggregate's groups: at most holds), and
    passes the node over; the SQL gateway inside the catalog, reading partials, too. The rogue counts what it sent:
    every stream's rows until the reader left it and what the link held then (a reader that read on would have
    taken millions of batches, and before the fix hung until the test's subprocess timeout)."""
    cluster, proc, mode, table = rogue
    got = _told_to_lie(mode, cluster, "endless", f"HONEST_URI = {cluster.nodes[0].uri!r}\n" + '''
import resource
import pyarrow.compute as pc
plain_ask = ask
def ask(what, fn):  # and the reader's peak memory (MiB) after it: for the message only, since a process started by
    # fork and exec inherits its parent's peak (a test process grown to 1.6 GiB gave every reader that much)
    plain_ask(what, fn)
    print(json.dumps(["peak after " + what, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10]))
ds = client.open("alone")
ask("to_arrow", ds.to_arrow)
ask("filtered", lambda: ds.filter(pc.field("k") >= 0).to_arrow())
ask("top", lambda: ds.top(150, "k"))
ask("sql scan", lambda: client.sql("SELECT k, s FROM alone").to_arrow())
ask("aggregate", lambda: ds.aggregate([("k", "sum")], by="d"))  # a partial: one row per group, five groups
ask("count", lambda: ds.count_rows(pc.field("k") < 150))  # a partial of one row (statistics cannot answer)
ask("sql aggregate", lambda: client.sql("SELECT sum(k) AS s FROM alone").to_arrow())  # the catalog reads it
ask("repartition", lambda: client.repartition("alone", (1, 1), nodes=[HONEST_URI]))  # an honest node pulls
small = client.open("small").__partitioned__  # four partitions that share one stream
ask("shared stream", lambda: small["get"]([small["partitions"][(i, 0)]["data"] for i in range(4)]))
twice = client.open("twice").to_arrow().sort_by("k")
print(json.dumps(["twice", twice.column("k").to_pylist()]))
''')
    for what in ("to_arrow", "filtered", "top", "sql scan"):
        code, message = got[what]
        assert code == "INTERNAL" and "more than the 200 rows" in message and ROGUE_IP in message, (what, got[what])
    for what, said in (("aggregate", "more than the 400 rows"), ("count", "more than one row")):
        code, message = got[what]  # a partial has one row per group at most (the partition's rows), one without keys;
        # the rogue's two partitions' partials share one stream (the count's filter leaves one partition)
        assert code == "INTERNAL" and said in message and ROGUE_IP in message, (what, got[what])
    assert got["sql aggregate"][0] != "answered" and ROGUE_IP in got["sql aggregate"][-1], got["sql aggregate"]
    assert cluster.catalog.proc.poll() is None
    code, message = got["shared stream"]
    assert code == "INTERNAL" and "more than the 400 rows" in message and ROGUE_IP in message, got["shared stream"]
    code, message = got["repartition"]  # the honest node left the stream too, and published nothing
    assert code == "INTERNAL" and "more than the 200 rows" in message and ROGUE_IP in message, got["repartition"]
    assert got["twice"] == [table.column("k").to_pylist()]  # the honest replica's rows
    counted = mode.parent / "lie.sent"  # every endless stream of the test, each left early (written each 100)
    sent = int(counted.read_text()) if counted.exists() else 0
    peaks = {k: v[0] for k, v in got.items() if k.startswith("peak after")}
    assert sent < 100_000, f"the rogue sent {sent:,} batches of 200 rows; the reader's peak memory (MiB): {peaks}"
    assert cluster.nodes[0].proc.poll() is None and proc.poll() is None
    with fp.connect(cluster.uri) as client:
        assert client.open("alone").version == 1


def test_a_node_that_sends_far_more_bytes_than_the_partition_holds_is_left_at_the_first_batch_past_them(rogue):
    """The right rows and columns, sound arrays, but every text value 256 KiB: a reader took the stream whole (50 MiB
    for a partition of a few kilobytes here; gigabytes, and the reader killed, in a probe) and used it. A reader of
    a whole partition without dictionary columns now stops at the first batch past the bytes the catalog says it
    holds (with a quarter and 16 MiB to spare), and passes the node over for another replica."""
    cluster, proc, mode, table = rogue
    got = _told_to_lie(mode, cluster, "bloated", '''
import resource
small = client.open("small").__partitioned__  # four partitions that share one stream
ask("shared stream", lambda: small["get"]([small["partitions"][(i, 0)]["data"] for i in range(4)]))
one = client.open("small").__partitioned__
ask("one partition", lambda: one["get"](one["partitions"][(0, 0)]["data"]))
plain = client.open("plain").to_arrow().sort_by("k")
print(json.dumps(["plain", plain.column("k").to_pylist(), plain.column("s").to_pylist()[:2]]))
print(json.dumps(["peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10]))
''')
    for what in ("shared stream", "one partition"):
        code, message = got[what]
        assert code == "INTERNAL" and "bytes" in message and "more than the" in message and ROGUE_IP in message, \
            (what, got[what])
    assert got["plain"] == [table.column("k").to_pylist(), table.column("s").to_pylist()[:2]]  # the honest replica's
    assert proc.poll() is None


def test_a_node_that_sends_more_bytes_than_a_filter_a_top_or_an_aggregate_could_keep_is_left(rogue):
    """What a filter, a row range, a top or an aggregate keeps of a partition is some of its stored values (an
    aggregate's groups with their partials): a reader had bounded such a stream in rows only, and took a lying
    node's 32 MiB (gigabytes as well) of text for a partition of a few kilobytes. It now stops at the first batch
    past what the partition's values could give, through ``get``, the SQL gateway's reads, a plain scan's parts and
    an honest node pulling pieces for a repartition (which had published the rogue's text as the new version's), and
    reads the honest replica where there is one."""
    cluster, proc, mode, table = rogue
    got = _told_to_lie(mode, cluster, "bloated", f"HONEST_URI = {cluster.nodes[0].uri!r}\n" + '''
small = client.open("small")  # on the rogue alone
ask("filter", lambda: small.filter("k >= 0").to_arrow())
ask("row range", lambda: small[50:150].to_arrow())
ask("top", lambda: small.top(5, "s"))
ask("aggregate", lambda: small.aggregate([("k", "sum")], by="s"))
ask("sql gateway", lambda: client.sql("SELECT s, count(*) AS n FROM small WHERE k >= 0 GROUP BY s").to_arrow())
ask("sql scan", lambda: client.sql("SELECT s FROM small WHERE k >= 0").to_arrow())
ask("repartition", lambda: client.repartition("small", (1, 1), nodes=[HONEST_URI]))
plain = client.open("plain").filter("k >= 10").to_arrow().sort_by("k")
print(json.dumps(["plain", plain.column("k").to_pylist(), plain.column("s").to_pylist()[:2]]))
''')
    for what in ("filter", "row range", "top", "aggregate", "sql gateway", "sql scan", "repartition"):
        assert what in got and got[what][0] != "answered", (what, got.get(what))
        code, message = got[what]
        assert "bytes" in message and "more than the" in message and ROGUE_IP in message, (what, got[what])
    rows = table.filter(pc.field("k") >= 10)
    assert got["plain"] == [rows.column("k").to_pylist(), rows.column("s").to_pylist()[:2]]  # the honest replica's
    assert proc.poll() is None and cluster.catalog.proc.poll() is None
    with fp.connect(cluster.uri) as client:
        assert client.open("small").version == 1  # the honest node assembled nothing from the rogue's pieces


def test_an_honest_aggregate_of_long_text_is_not_taken_for_a_lie(rogue):
    """The bytes an aggregate's stream may carry allow for its ``min`` and ``max`` of a text column, which send some of
    that column's values each: by a key of distinct values, the min and max of 700-byte texts are twice the stored
    bytes, which the first bound (16 bytes a partial) refused from an honest node, ``client.sql`` running the query
    whole instead."""
    cluster, _proc, _mode, _table = rogue
    rows = 40_000
    texts = [f"{k:07d}" * 100 for k in range(rows)]
    with fp.connect(cluster.uri, host=READER) as client:
        ds = client.put("long_text", pa.table({"k": list(range(rows)), "s": texts}), nodes=[cluster.nodes[0].uri])
        try:
            got = ds.aggregate([("s", "min"), ("s", "max")], by="k").sort_by("k")
            assert got.column("s_min").to_pylist() == texts and got.column("s_max").to_pylist() == texts
            by_text = ds.aggregate([("s", "min"), ("s", "max"), ("k", "count")], by="s")
            assert by_text.num_rows == rows and set(by_text.column("k_count").to_pylist()) == {1}
        finally:
            client.drop("long_text")


@pytest.mark.slow  # 100,000 messages from a rogue: in the slow tier, which CI runs
def test_a_node_that_sends_empty_batches_without_end_is_left(rogue):
    """Batches of no rows never reach the row bound: a node sending them without end is left after
    ``EMPTY_MESSAGES`` of them, none of which the reader kept."""
    cluster, proc, mode, table = rogue
    got = _told_to_lie(mode, cluster, "endless empty", '''
ask("to_arrow", client.open("alone").to_arrow)
twice = client.open("twice").to_arrow().sort_by("k")
print(json.dumps(["twice", twice.column("k").to_pylist()]))
''')
    code, message = got["to_arrow"]
    assert code == "INTERNAL" and "messages without rows" in message and ROGUE_IP in message, got["to_arrow"]
    assert got["twice"] == [table.column("k").to_pylist()]
    assert proc.poll() is None


@pytest.mark.parametrize("lie", ["run rows shifted", "run rows past the batch"])
def test_a_node_that_misplaces_partitions_in_a_shared_stream_is_read_one_partition_at_a_time(rogue, lie):
    """Small partitions share one read stream, cut back into partitions by the counts in its ``PartRun``. A node that
    lies in them (a row moved from one partition to its neighbour, which leaves the whole the same, or counts past
    the batch) would give partitions of other shapes than the catalog's: each is read alone instead, and checked."""
    cluster, proc, mode, table = rogue
    got = _told_to_lie(mode, cluster, lie, '''
ds = client.open("small")
parts = ds.__partitioned__
tables = parts["get"]([parts["partitions"][(i, 0)]["data"] for i in range(4)])
print(json.dumps(["get", [t.num_rows for t in tables], [t.column("k").to_pylist()[:2] for t in tables]]))
print(json.dumps(["to_arrow", ds.to_arrow().column("k").to_pylist()]))
''')
    assert got["get"] == [[100, 100, 100, 100], [[0, 1], [100, 101], [200, 201], [300, 301]]]
    assert got["to_arrow"] == [table.column("k").to_pylist()]
    # the lie was told (a stream of the four partitions), so the reads above came from the partitions alone
    assert _lies_told(mode)[:1] == [f"{lie} 4"]
    assert proc.poll() is None


SAID = {"other type": "column 'k' as int32 where the catalog says int64", "renamed": "'kk' the dataset does not have",
        "dropped": "without column 's' of its column group"}
ASKED = {"other type": "column 'k' as int32 where the catalog says int64",
         "renamed": "['kk', 's'] where ['k', 's'] were asked", "dropped": "['k'] where ['k', 's'] were asked"}


@pytest.mark.parametrize("lie", list(SAID))
def test_a_node_that_sends_other_columns_than_the_catalog_says_is_passed_over(rogue, lie):
    """Sound arrays and the right rows, but a column of another type (int32 for int64), renamed or left out: a reader
    handed its user a frame of another schema than the dataset's without a word, or failed in Arrow's own error (or
    a KeyError) with the honest replica never asked. What a node sends is checked against the catalog's columns."""
    cluster, proc, mode, table = rogue
    got = _told_to_lie(mode, cluster, lie, '''
ds = client.open("alone")
ask("to_arrow", ds.to_arrow)
ask("to_pandas", ds.to_pandas)
ask("to_polars", ds.to_polars)
ask("to_duckdb", lambda: ds.to_duckdb().fetchall())
ask("selected", lambda: ds.select(["k", "s"]).to_arrow())
ask("sql", lambda: client.sql("SELECT k + 1 AS k1, s FROM alone").to_arrow())
ask("sql scan", lambda: client.sql("SELECT k, s FROM alone").to_arrow())  # endpoints at the nodes
twice = client.open("twice").to_arrow().sort_by("k")
print(json.dumps(["twice", str(twice.schema.field("k").type), twice.column("k").to_pylist(), twice.num_columns]))
scanned = client.sql("SELECT k, s FROM twice").to_arrow().sort_by("k")
print(json.dumps(["sql scan twice", str(scanned.schema.field("k").type), scanned.column("k").to_pylist()]))
''')
    for what in ("to_arrow", "to_pandas", "to_polars", "selected"):
        code, message = got[what]
        said = ASKED[lie] if what == "selected" else SAID[lie]
        assert code == "INTERNAL" and said in message and ROGUE_IP in message, (what, got[what])
    # DuckDB asks for the columns it needs, by name
    assert any(said in got["to_duckdb"][1] for said in (SAID[lie], ASKED[lie])), got["to_duckdb"]
    assert ROGUE_IP in got["to_duckdb"][1], got["to_duckdb"]
    assert got["sql"][0] != "answered" and ROGUE_IP in got["sql"][1], got["sql"]  # the gateway's scans are checked
    code, message = got["sql scan"]  # a plain scan's parts, read from the nodes by the client, are checked too
    assert code == "INTERNAL" and any(said in message for said in (SAID[lie], ASKED[lie])) and ROGUE_IP in message, \
        got["sql scan"]
    # the honest replica's columns, as stored
    assert got["twice"] == ["int64", table.column("k").to_pylist(), table.num_columns]
    assert got["sql scan twice"] == ["int64", table.column("k").to_pylist()]
    assert proc.poll() is None


@pytest.mark.parametrize("lie", ["other type", "dropped"])
def test_a_shared_stream_with_other_columns_than_the_catalog_says_is_refused(rogue, lie):
    """Small partitions read several to a stream are checked against the catalog's columns too, before they are cut
    back into partitions: the only replica lies, so the reader gets INTERNAL naming it, not its columns."""
    cluster, proc, mode, table = rogue
    got = _told_to_lie(mode, cluster, lie, '''
ds = client.open("small")
parts = ds.__partitioned__
ask("get", lambda: parts["get"]([parts["partitions"][(i, 0)]["data"] for i in range(4)]))
''')
    code, message = got["get"]
    assert code == "INTERNAL" and SAID[lie] in message and ROGUE_IP in message, got["get"]
    assert _lies_told(mode)[:1] == [f"{lie} 4"]  # the lie was a shared stream's
    assert proc.poll() is None


@pytest.mark.slow
def test_dask_and_ray_tasks_check_the_columns_a_node_sends_too(rogue):
    """A dataset's ``get`` pickled into Dask workers and Ray tasks (other processes than the one that opened it)
    carries the catalog's columns: the rogue's int32 for int64 is refused INTERNAL naming it where it holds the only
    replica, and passed over for the honest replica where there are two. Before, a task took the int32 column into
    its block without a word (the frame's meta says int64)."""
    cluster, proc, mode, table = rogue
    got = _told_to_lie(mode, cluster, "other type", '''
import ray
from distributed import Client, LocalCluster

def twice(frame):
    frame = frame.sort_values("k")
    return [str(frame["k"].dtype), frame["k"].tolist()]

with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as dc, Client(dc):
    ask("dask", lambda: client.open("alone").to_dask().compute())
    print(json.dumps(["dask twice", *twice(client.open("twice").to_dask().compute())]))
ray.init(num_cpus=2, include_dashboard=False)
ask("ray", lambda: client.open("alone").to_ray().to_pandas())
print(json.dumps(["ray twice", *twice(client.open("twice").to_ray().to_pandas())]))
ray.shutdown()
''')
    for runtime in ("dask", "ray"):
        assert got[runtime][0] != "answered", got[runtime]
        message = got[runtime][-1]
        assert "INTERNAL" in message or got[runtime][0] == "INTERNAL", got[runtime]
        assert "as int32 where the catalog says int64" in message and ROGUE_IP in message, got[runtime]
        dtype, values = got[f"{runtime} twice"]  # the honest replica's column, as stored
        assert dtype.startswith("int64") and values == table.column("k").to_pylist(), got[f"{runtime} twice"]
    assert proc.poll() is None
