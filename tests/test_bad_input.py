"""Garbage at every door: each gets a clear Flight error, the servers keep serving,
and nothing is written outside a node's data directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flightpart as fp
from flightpart import wire

from helpers import code_of, put_raw, raw_action, wait_until


def assert_clear(exc: BaseException) -> None:
    """A refusal a client can act on: a code that is not the server failing."""
    assert code_of(exc) != "INTERNAL", f"server error: {exc}"


@pytest.fixture(scope="module")
def guarded(make_cluster):
    with make_cluster(1, process=True,
                      node_args=["--max-partition-bytes", "2000000", "--max-streams", "4"]) as c:
        with fp.connect(c.uri) as client:
            client.put("good", pa.table({"a": np.arange(10_000)}), tiling=(1, 1))
        yield c


def still_serving(c) -> None:
    with fp.connect(c.uri, host="127.0.0.99") as client:
        assert client.open("good").to_arrow().column("a").to_pylist()[:3] == [0, 1, 2]


def files_outside(c) -> list[str]:
    allowed = {c.root / "catalog", c.root / f"node-{c.ips[0]}"}
    return [str(p) for p in c.root.rglob("*") if not any(p == a or a in p.parents for a in allowed)]


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                           | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                           max_leaves=10)
ticket_like = st.fixed_dictionaries(
    {"dataset": st.sampled_from(["good", "../x", "a/b", "", "x" * 300, "nope"]) | st.text(max_size=10),
     "version": st.integers(-5, 10**20) | st.text(max_size=3),
     "part": st.lists(st.integers(-3, 10**12), max_size=3) | st.text(max_size=3)},
    optional={"columns": st.none() | st.lists(st.text(max_size=4), max_size=3),
              "rows": st.none() | st.lists(st.integers(-5, 10**15), max_size=3), "evil": json_values},
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=200), ticket_like.map(lambda d: json.dumps(d).encode()),
                 json_values.map(lambda d: json.dumps(d).encode())))
def test_fuzzed_tickets(guarded, raw):
    node = flight.connect(guarded.nodes[0].uri)
    try:
        node.do_get(flight.Ticket(raw)).read_all()
    except flight.FlightError as exc:
        assert_clear(exc)
        assert wire.error_message(exc).strip()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["node-info", "stats", "held", "drop", "copy-to", "nope", "register-node", "heartbeat", "commit",
                        "begin", "abort", "publish-begin", "publish-part", "repair", "versions"]),
       st.one_of(st.binary(max_size=100), json_values.map(lambda d: json.dumps(d).encode())),
       st.booleans())
def test_fuzzed_action_bodies(guarded, name, body, to_catalog):
    target = flight.connect(guarded.uri if to_catalog else guarded.nodes[0].uri)
    try:
        list(target.do_action(flight.Action(name, body)))
    except flight.FlightError as exc:
        assert_clear(exc)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(max_size=12) | st.sampled_from(["../x", "a/b", "..", "/etc/passwd", "good", "1", "-1",
                                                        "99999999999999"]),
                min_size=0, max_size=5))
def test_fuzzed_descriptors(guarded, path):
    catalog = flight.connect(guarded.uri)
    node = flight.connect(guarded.nodes[0].uri)
    try:
        catalog.get_flight_info(flight.FlightDescriptor.for_path(*path))
    except flight.FlightError as exc:
        assert_clear(exc)
    try:
        writer, _ = node.do_put(flight.FlightDescriptor.for_path(*path), pa.schema([("a", pa.int64())]))
        writer.write_table(pa.table({"a": [1]}))
        writer.close()
    except flight.FlightError as exc:
        assert_clear(exc)


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "x" * (10 << 20), "", "a\x00b"],
                         ids=["dotdot", "slash", "parent", "10MB", "empty", "nul"])
def test_hostile_names_are_refused_and_nothing_escapes(guarded, name):
    node = flight.connect(guarded.nodes[0].uri)
    with pytest.raises(flight.FlightError) as info:
        writer, _ = node.do_put(flight.FlightDescriptor.for_path(name, "1", "0", "0"), pa.schema([("a", pa.int64())]))
        writer.write_table(pa.table({"a": [1]}))
        writer.close()
    if not isinstance(info.value, flight.FlightUnavailableError):  # a 10 MB path may be refused by gRPC itself
        assert code_of(info.value) in ("INVALID_NAME", "INVALID_REQUEST")
        assert "invalid dataset name" in str(info.value) or "expected path" in str(info.value)
    with fp.connect(guarded.uri) as client, pytest.raises(fp.InvalidName):
        client.open(name)
    assert files_outside(guarded) == []
    still_serving(guarded)


def test_put_streams_that_break_the_rules(guarded):
    node = flight.connect(guarded.nodes[0].uri)
    # larger than the node's limit: refused, and no file of it remains
    big = pa.table({"a": np.arange(1_000_000)})  # 8 MB > 2 MB limit
    with pytest.raises(flight.FlightServerError, match="more than the node's limit of 2000000 bytes") as info:
        writer, _ = node.do_put(flight.FlightDescriptor.for_path("big", "1", "0", "0"), big.schema)
        writer.write_table(big, max_chunksize=50_000)
        writer.close()
    assert code_of(info.value) == "LIMIT_EXCEEDED"
    assert not list((guarded.root / f"node-{guarded.ips[0]}").rglob("big/**/*.arrow"))
    # wrong row count: the catalog refuses to publish what the node does not really hold
    with fp.connect(guarded.uri) as client:
        version = client.call(fp.wire.Begin("short")).version
        writer, _ = node.do_put(flight.FlightDescriptor.for_path("short", str(version), "0", "0"),
                                pa.schema([("a", pa.int64())]))
        writer.write_table(pa.table({"a": [1, 2, 3]}))
        writer.write_metadata(pa.py_buffer(b'{"rows": 3}'))
        writer.close()
        info = client.nodes()[0]
        with pytest.raises(fp.SchemaMismatch, match="has 3 rows, expected 5"):
            raw_action(client, "commit", {"dataset": "short", "version": version,
                                          "schema": fp.wire.schema_to_text(pa.schema([("a", pa.int64())])),
                                          "shape": [5, 1], "tiling": [1, 1],
                                          "partitions": [{"part": [0, 0], "start": [0, 0], "shape": [5, 1],
                                                          "nodes": [info.node_id]}]})
        with pytest.raises(fp.DatasetNotFound):
            client.open("short")
    still_serving(guarded)


TRUNCATE = """
import sys, time, numpy as np, pyarrow as pa, pyarrow.flight as flight
node = flight.connect(sys.argv[1])
t = pa.table({"a": np.arange(100_000)})
writer, _ = node.do_put(flight.FlightDescriptor.for_path("cut", "7", "0", "0"), t.schema)
writer.write_table(t.slice(0, 10_000))
print("sent", flush=True)
time.sleep(60)
"""


def test_a_truncated_put_stream_leaves_no_partition(guarded):
    proc = subprocess.Popen([sys.executable, "-c", TRUNCATE, guarded.nodes[0].uri], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "sent"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    node_dir = guarded.root / f"node-{guarded.ips[0]}"
    def temporaries() -> list:
        try:
            return list(node_dir.rglob(".tmp-*"))
        except FileNotFoundError:  # the node is removing the refused put's directory right now
            return ["being removed"]

    deadline = time.monotonic() + 20
    while (temporaries() or (node_dir / "datasets" / "cut").exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not temporaries() and not (node_dir / "datasets" / "cut" / "v7" / "0_0.arrow").exists()
    assert not (node_dir / "datasets" / "cut").exists()  # no debris: the refused put's folders are gone too
    still_serving(guarded)


def test_stream_limit_refuses_with_a_retryable_error(guarded):
    """A caller (here every client: no secret, one host) holds at most half of --max-streams 4, puts and reads alike;
    the node's whole limit, reached by several callers, is tested in tests/test_sharing_attacks.py."""
    node = flight.connect(guarded.nodes[0].uri)
    open_writers = []
    try:
        for k in range(2):
            writer, _ = node.do_put(flight.FlightDescriptor.for_path("held", "1", str(k), "0"),
                                    pa.schema([("a", pa.int64())]))
            writer.write_table(pa.table({"a": [k]}))
            open_writers.append(writer)
        def open_streams() -> int:
            return json.loads(list(node.do_action(flight.Action("stats", b"")))[0].body.to_pybytes())["open_streams"]

        wait_until(lambda: open_streams() == 2, 10, "the two put streams to reach the node")
        with pytest.raises(flight.FlightUnavailableError, match="already holds 2 streams, its share of 4") as info:
            node.do_get(flight.Ticket(json.dumps({"dataset": "good", "version": 1,
                                                  "part": [0, 0]}).encode())).read_all()
        assert code_of(info.value) == "BUSY"
        with pytest.raises(flight.FlightUnavailableError, match="already holds 2 streams") as info:
            put_raw(node, ["held", "1", "2", "0"], pa.table({"a": [2]}))
        assert code_of(info.value) == "BUSY"
    finally:
        for w in open_writers:
            w.write_metadata(pa.py_buffer(b'{"rows": 1}'))
            w.close()
    still_serving(guarded)


def test_a_put_whose_trailer_disagrees_is_not_stored(guarded):
    node = flight.connect(guarded.nodes[0].uri)
    with pytest.raises(flight.FlightServerError, match="ended after 3 rows, the sender declared 5") as info:
        writer, _ = node.do_put(flight.FlightDescriptor.for_path("trailer", "1", "0", "0"),
                                pa.schema([("a", pa.int64())]))
        writer.write_table(pa.table({"a": [1, 2, 3]}))
        writer.write_metadata(pa.py_buffer(b'{"rows": 5}'))
        writer.close()
    assert code_of(info.value) == "INVALID_REQUEST"
    assert not (guarded.root / f"node-{guarded.ips[0]}" / "datasets" / "trailer" / "v1" / "0_0.arrow").exists()


@pytest.mark.parametrize("text, code", [
    ("nope + 1", "INVALID_EXPRESSION"),                      # no such column
    ("a * 1.5", "INVALID_EXPRESSION"),                       # DuckDB would compute a DECIMAL
    ("sqrt(a)", "INVALID_EXPRESSION"),                       # a function not translated
    ("a * 9223372036854775807", "INVALID_EXPRESSION"),       # overflows on the rows: refused, never wrapped
    ("a / 0", "INVALID_EXPRESSION"),                         # infinity: min/max would order it otherwise
    ("'; DROP TABLE good; --", "INVALID_EXPRESSION"),        # text, parsed, never run
    ("+".join(["a"] * 200), "INVALID_EXPRESSION"),          # more operations than a ticket may buy
    ("(" * 2000 + "a" + ")" * 2000, "INVALID_EXPRESSION"),   # deep enough to exhaust a recursive parser
    ("a" * 5000, "LIMIT_EXCEEDED"),                          # longer than a ticket's strings may be
])
def test_a_computed_column_a_node_cannot_compute_exactly_is_refused_with_a_code(guarded, text, code):
    """A ticket's aggregate names columns to compute from SQL text: whatever a client writes there, the node
    answers with a code (never a traceback, never a wrong value) and keeps serving."""
    ticket = wire.Ticket("good", 1, (0, 0), aggregate=wire.Aggregate((("k", "sum"),), (), (("k", text),)))
    node = flight.connect(guarded.nodes[0].uri)
    with pytest.raises(flight.FlightError) as caught:
        node.do_get(flight.Ticket(ticket.encode())).read_all()
    assert code_of(caught.value) == code, caught.value
    assert "\n" not in wire.error_message(caught.value)
    good = wire.Ticket("good", 1, (0, 0), aggregate=wire.Aggregate((("k", "sum"),), (), (("k", "a * 2"),)))
    assert node.do_get(flight.Ticket(good.encode())).read_all().column(0).to_pylist() == [2 * sum(range(10_000))]
    still_serving(guarded)


def test_an_aggregate_grouped_by_a_key_named_twice_is_refused_by_the_client_and_by_the_node(guarded):
    """A result column named twice cannot be built: the client says so before asking, and a node asked anyway
    answers INVALID_REQUEST (it answered INTERNAL, with a traceback in its log)."""
    with fp.connect(guarded.uri, host="127.0.0.99") as client:
        with pytest.raises(fp.PartitionedError, match="'a' twice"):
            client.open("good").aggregate([("a", "sum")], by=["a", "a"])
    ticket = wire.Ticket("good", 1, (0, 0), aggregate=wire.Aggregate((("a", "sum"),), ("a", "a")))
    with pytest.raises(flight.FlightError) as caught:
        flight.connect(guarded.nodes[0].uri).do_get(flight.Ticket(ticket.encode())).read_all()
    assert code_of(caught.value) == "INVALID_REQUEST" and "'a' twice" in str(caught.value)
    still_serving(guarded)


def test_a_filter_that_aborts_arrows_substrait_reader_is_refused_and_the_node_lives(guarded):
    """Substrait bytes whose decimal type has precision 0 abort pyarrow's reader (SIGABRT, beyond any except): the
    node reads each new filter in a checker process first, refuses this one with a code, and goes on serving."""
    import pyarrow.compute as pc
    import pyarrow.substrait as substrait

    schema = pa.schema([("c", pa.decimal128(10, 2))])
    raw = bytes(substrait.serialize_expressions([pc.field("c").is_valid()], ["filter"], schema))
    aborting = raw.replace(b"\x08\x02\x10\x0a", b"\x08\x02\x10\x00")  # Type.Decimal {scale 2, precision 10 -> 0}
    assert aborting != raw
    node = flight.connect(guarded.nodes[0].uri)
    for _ in range(2):  # twice: the second is refused from what the node remembers, with the same code
        with pytest.raises(flight.FlightError) as caught:
            node.do_get(flight.Ticket(wire.Ticket("good", 1, (0, 0), filter=aborting).encode())).read_all()
        assert code_of(caught.value) == "INVALID_REQUEST" and "Substrait" in str(caught.value)
    assert guarded.nodes[0].proc.poll() is None
    with fp.connect(guarded.uri, host="127.0.0.99") as client:
        assert client.open("good").filter("a < 3").to_arrow().column("a").to_pylist() == [0, 1, 2]
    still_serving(guarded)


@pytest.mark.parametrize("values", [12_000, 40_000])
def test_a_filter_nested_deeper_than_a_nodes_stack_is_refused_and_the_node_lives(guarded, values):
    """Arrow reads and binds an is_in by recursion as deep as its list: 12,000 values overflowed a node's Flight
    thread (SIGSEGV), and a reader retrying killed every replica. The node's checker reads and binds each new filter
    on a smaller stack first, so the node refuses it with a code and goes on serving; a list of 500 is read."""
    import pyarrow.compute as pc
    import pyarrow.substrait as substrait

    schema = pa.schema([("a", pa.int64())])
    node = flight.connect(guarded.nodes[0].uri)
    deep = bytes(substrait.serialize_expressions([pc.field("a").isin(list(range(values)))], ["filter"], schema))
    with pytest.raises(flight.FlightError) as caught:
        node.do_get(flight.Ticket(wire.Ticket("good", 1, (0, 0), filter=deep).encode())).read_all()
    assert code_of(caught.value) == "INVALID_REQUEST" and "nested too deeply" in str(caught.value)
    assert guarded.nodes[0].proc.poll() is None
    shallow = bytes(substrait.serialize_expressions([pc.field("a").isin(list(range(0, 1000, 2)))], ["filter"], schema))
    rows = node.do_get(flight.Ticket(wire.Ticket("good", 1, (0, 0), filter=shallow).encode())).read_all()
    assert rows.column("a").to_pylist() == list(range(0, 1000, 2))
    still_serving(guarded)


def test_calls_a_daemon_does_not_serve_are_refused_by_name_without_a_traceback(guarded):
    """GetSchema, DoExchange (and DoGet, DoPut where a daemon takes none) at the wrong daemon were pyarrow's
    UNIMPLEMENTED with its traceback and its paths; each is now refused naming the daemon and where to go."""
    node = flight.connect(guarded.nodes[0].uri)
    catalog = flight.connect(guarded.uri)
    descriptor = flight.FlightDescriptor.for_path("good")
    with pytest.raises(pa.ArrowInvalid, match="is a flightpart node: it describes no datasets") as schema:
        node.get_schema(descriptor)
    assert "[flightpart INVALID_REQUEST at service]" in str(schema.value)
    for client, role in ((node, "node"), (catalog, "catalog")):
        with pytest.raises(flight.FlightError, match=f"is a flightpart {role}: it answers no DoExchange") as exchange:
            writer, reader = client.do_exchange(descriptor)
            writer.begin(pa.schema([("a", pa.int64())]))
            writer.done_writing()
            reader.read_all()
        assert code_of(exchange.value) == "INVALID_REQUEST"
    for refused in (schema.value, exchange.value):
        assert "Traceback" not in str(refused) and ".py" not in str(refused)
    assert node.list_actions() and catalog.list_actions()  # both still serve
