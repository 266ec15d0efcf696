"""Start-up, exposure and odd-but-valid input, attacked with real daemons.

- A daemon is hammered from the moment its port opens: no call ever gets
  ``INTERNAL`` (pyarrow serves before a subclass has built its state), and
  ``flightpart wait`` succeeds every time.
- An open daemon binds loopback only unless the operator says ``--insecure``;
  a client's ``$FLIGHTPART_TOKEN`` without a secret is refused at start;
  each daemon logs one start-up line saying how it is exposed.
- A put whose batches carry different dictionaries is stored and reads back equal.
- A node that answers ``stats`` with garbage shows as "stats unreadable"; the status page still answers 200.
- A 10,000-column table is put and read back.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc
import pytest

import flightpart as fp
from flightpart import tokens, wire
from flightpart.cli.waiting import wait_for
from flightpart.errors import ServerStarting
from flightpart.io.connections import ConnectionPool
from flightpart.local.cluster import Daemon
from flightpart.server.catalog import CatalogServer
from flightpart.server.settings import CatalogSettings
from flightpart.wire import Begin, Heartbeat, ListNodes, ListVersions, RegisterNode

from helpers import code_of, free_port, put_raw, wait_until

STARTS = 20


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m flightpart ...`` as a person types it, with no FLIGHTPART_* variable but those given."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTPART_")}
    return subprocess.run([sys.executable, "-m", "flightpart", *args], capture_output=True, text=True, timeout=timeout,
                          env={**environ, **(env or {})})


def refused(done: subprocess.CompletedProcess, code: str, *words: str) -> str:
    """A daemon that refused to start: non-zero exit, one error line with the code and every word, no traceback."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"Error [{code}]: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# --------------------------------------------------------------------------- ready before serving


def outcome(call) -> str:
    """``ok``, the code a daemon answered, ``unreachable`` (nothing listening yet), or what came without a code."""
    try:
        call()
        return "ok"
    except flight.FlightError as exc:
        decoded = wire.decode_error(getattr(exc, "extra_info", None))
        if decoded is not None:
            return decoded[0]
        if isinstance(exc, flight.FlightUnavailableError):
            return "unreachable"
        return f"no code: {type(exc).__name__}: {str(exc)[:300]}"


def hammer(uri: str, calls: list, stop: threading.Event, seen: list[str]) -> None:
    """Call ``uri`` in a loop on fresh connections (no reconnect backoff) until ``stop``."""
    while not stop.is_set():
        client = flight.FlightClient(uri)
        try:
            for call in calls:
                seen.append(outcome(lambda call=call, client=client: call(client)))
        finally:
            client.close()
        stop.wait(0.002)


def catalog_calls() -> list:
    options = flight.FlightCallOptions(timeout=5)
    return [
        lambda c: list(c.do_action(flight.Action("stats", b"{}"), options=options)),
        lambda c: list(c.do_action(flight.Action("nodes", b"{}"), options=options)),
        lambda c: list(c.list_flights(options=options)),
        lambda c: c.get_flight_info(flight.FlightDescriptor.for_path("nosuch"), options=options),
        lambda c: list(c.do_action(flight.Action("versions", ListVersions("nosuch").encode()), options=options)),
    ]


def node_calls() -> list:
    options = flight.FlightCallOptions(timeout=5)
    return [
        lambda c: list(c.do_action(flight.Action("stats", b"{}"), options=options)),
        lambda c: list(c.do_action(flight.Action("held", b"{}"), options=options)),
        lambda c: c.do_get(flight.Ticket(b"not a ticket"), options=options).read_all(),
        lambda c: list(c.list_actions(options=options)),
    ]


def start_under_fire(argv: list[str], uri: str, calls: list, log: Path) -> list[str]:
    """Start a daemon with threads already calling its address and ``flightpart wait`` racing it; what they saw."""
    stop, seen = threading.Event(), []
    threads = [threading.Thread(target=hammer, args=(uri, calls, stop, seen), daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    with open(log, "a") as err:
        daemon = subprocess.Popen([sys.executable, "-m", "flightpart", *argv], stdout=subprocess.DEVNULL, stderr=err)
    try:
        waited = run_cli("wait", uri, "--timeout", "60", "--json")
        assert waited.returncode == 0, f"flightpart wait failed:\n{waited.stderr[-2000:]}\n{log.read_text()[-2000:]}"
        wait_until(lambda: "ok" in seen, what="a hammering call answered")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        daemon.terminate()
        daemon.wait(30)
    return seen


def assert_no_internal(seen: list[str], allowed: set[str], log: Path) -> None:
    wrong = sorted({s for s in seen if s not in allowed and s != "ok" and s != "unreachable"})
    assert not wrong, f"calls during start-up got {wrong}\n{log.read_text()[-3000:]}"
    assert "Traceback" not in log.read_text() and "AttributeError" not in log.read_text(), log.read_text()[-3000:]


@pytest.mark.slow
def test_a_catalog_hammered_from_its_first_moment_never_answers_internal(tmp_path):
    ip, log, everything = "127.0.0.171", tmp_path / "catalog.log", []
    for _start in range(STARTS):
        port = str(free_port())
        uri = f"grpc://{ip}:{port}"
        seen = start_under_fire(["catalog", "--host", ip, "--port", port, "--state-dir", str(tmp_path / "state")], uri,
                                catalog_calls(), log)
        assert_no_internal(seen, {"STARTING", "DATASET_NOT_FOUND"}, log)
        everything += seen
    assert everything.count("ok") >= STARTS


@pytest.mark.slow
def test_a_node_hammered_from_its_first_moment_never_answers_internal(tmp_path):
    catalog = Daemon(["catalog", "--host", "127.0.0.172", "--port", "0", "--state-dir", str(tmp_path / "state")])
    log = tmp_path / "node.log"
    try:
        for start in range(STARTS):
            ip = "127.0.0.173"
            uri = f"grpc://{ip}:{free_port()}"
            seen = start_under_fire(["serve", "--host", ip, "--port", uri.rsplit(":", 1)[1], "--data-dir",
                                     str(tmp_path / f"node{start}"), "--catalog", catalog.uri, "--heartbeat", "0.5"],
                                    uri, node_calls(), log)
            assert_no_internal(seen, {"STARTING", "INVALID_REQUEST"}, log)
    finally:
        catalog.stop()


class GatedCatalog(CatalogServer):
    """A catalog whose construction stops after the Flight server is listening until the test opens ``gate``."""

    startup_grace = 0.2

    def __init__(self, *args, gate: threading.Event, **kwargs):
        super().__init__(*args, **kwargs)
        gate.wait(60)
        self.finished_building = True


def test_a_call_during_start_up_is_told_starting_and_retried_until_the_daemon_is_built():
    gate, built = threading.Event(), {}
    port = free_port()
    settings = CatalogSettings.in_process(port=port)
    builder = threading.Thread(target=lambda: built.setdefault("server", GatedCatalog(settings, gate=gate)))
    builder.start()
    uri = f"grpc://127.0.0.1:{port}"
    try:
        raw = flight.FlightClient(uri)

        def starting_answer():
            result = outcome(lambda: list(raw.do_action(flight.Action("stats", b"{}"))))
            return result if result != "unreachable" else None

        assert wait_until(starting_answer, what="the half-built catalog answered") == "STARTING"
        try:
            list(raw.do_action(flight.Action("nodes", b"{}")))
        except flight.FlightUnavailableError as exc:  # retryable in gRPC's terms too, with a message for people
            assert code_of(exc) == "STARTING" and "starting" in str(exc)
            assert isinstance(fp.errors.error_for("STARTING", "x"), ServerStarting)
        else:
            raise AssertionError("a half-built catalog answered a call")
        # GetSchema, which pyarrow answers without its handling of Flight errors: no traceback, the code in the line
        with pytest.raises(pa.ArrowException) as schema_refused:
            raw.get_schema(flight.FlightDescriptor.for_path("anything"))
        assert "still starting" in str(schema_refused.value) and "[flightpart STARTING]" in str(schema_refused.value)
        assert "Traceback" not in str(schema_refused.value) and ".py" not in str(schema_refused.value)
        waited: dict = {}
        waiter = threading.Thread(target=lambda: waited.setdefault("result", wait_for(uri, timeout=60)))
        with ConnectionPool() as pool:
            asked: dict = {}
            asker = threading.Thread(target=lambda: asked.setdefault("nodes", pool.action(uri, ListNodes())))
            waiter.start()
            asker.start()
            wait_until(lambda: waiter.is_alive() and asker.is_alive(), what="the callers waiting")
            gate.set()
            waiter.join(60)
            asker.join(60)
        assert waited["result"]["role"] == "catalog" and asked["nodes"].nodes == ()
        raw.close()
    finally:
        gate.set()
        builder.join(60)
        if "server" in built:
            assert built["server"].finished_building and built["server"].built
            built["server"].shutdown()


# --------------------------------------------------------------------------- secure by default


def test_an_open_daemon_refuses_to_listen_beyond_loopback_unless_told_insecure(tmp_path):
    for command in (["catalog", "--state-dir", str(tmp_path / "s")],
                    ["serve", "--data-dir", str(tmp_path / "d"), "--state-dir", str(tmp_path / "s")]):
        line = refused(run_cli(*command, "--host", "0.0.0.0", "--port", "0"), "CANNOT_START", "no cluster secret",
                       "--secret-file", "FLIGHTPART_SECRET", "--insecure", "127.0.0.1")
        assert "0.0.0.0" in line
    assert not (tmp_path / "d").exists()
    insecure = Daemon(["--log-level", "INFO", "catalog", "--host", "0.0.0.0", "--insecure", "--port", "0",
                       "--state-dir", str(tmp_path / "s")], env={"FLIGHTPART_SECRET": ""})
    try:
        wait_for(insecure.uri.replace("0.0.0.0", "127.0.0.1"), timeout=30)
        started = [line for line in insecure.log().splitlines() if "serving at" in line]
        assert len(started) == 1, insecure.log()
        assert "flightpart catalog serving at grpc://0.0.0.0:" in started[0]
        assert "cluster not yet; auth open; TLS off" in started[0]
        assert re.search(r"WARNING .*OPEN \(--insecure\).*--secret-file", insecure.log()), insecure.log()
    finally:
        insecure.stop()


def test_a_daemon_with_a_secret_may_listen_anywhere_and_says_how_it_is_guarded(tmp_path):
    secret = {"FLIGHTPART_SECRET": tokens.new_secret()}
    catalog = Daemon(["--log-level", "INFO", "catalog", "--host", "0.0.0.0", "--port", "0", "--state-dir",
                      str(tmp_path / "s"), "--cluster-id", "5" * 32], env=secret)
    node = None
    try:
        address = catalog.uri.replace("0.0.0.0", "127.0.0.1")
        node = Daemon(["--log-level", "INFO", "serve", "--host", "127.0.0.174", "--port", "0", "--data-dir",
                       str(tmp_path / "d"), "--catalog", address], env=secret)
        catalog_line = [line for line in catalog.log().splitlines() if "serving at" in line]
        node_line = [line for line in node.log().splitlines() if "serving at" in line]
        assert len(catalog_line) == 1 and "auth secret; TLS off" in catalog_line[0] and "OPEN" not in catalog.log()
        assert len(node_line) == 1 and f"flightpart node serving at {node.uri}" in node_line[0], node.log()
        cluster = re.search(r"cluster (5{32}); auth secret; TLS off", node_line[0])  # the id it was given
        assert cluster, node_line[0]
        token = run_cli("token", "--role", "reader", "--name", "t", env=secret)
        assert token.returncode == 0, token.stderr
        refused_without = run_cli("ls", "--catalog", address)
        assert refused_without.returncode != 0 and "UNAUTHENTICATED" in refused_without.stderr
    finally:
        if node is not None:
            node.stop()
        catalog.stop()


def test_a_clients_token_in_a_daemons_environment_without_a_secret_is_refused(tmp_path):
    done = run_cli("catalog", "--host", "127.0.0.175", "--port", "0", "--state-dir", str(tmp_path / "s"),
                   env={"FLIGHTPART_TOKEN": "fp1:writer:bob:0:00"})
    refused(done, "CANNOT_START", "FLIGHTPART_TOKEN", "--secret-file", "FLIGHTPART_SECRET", "unset")
    assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------------- a shared cluster


@pytest.fixture(scope="module")
def shared(make_cluster):
    """A catalog with its status page and two nodes, for the attacks that neither kill nor freeze it."""
    with make_cluster(2, process=True,
                      extra_args=["--metrics-port", "0"]) as c:
        yield c


def dictionary_batch(values: list, dictionary: list) -> pa.RecordBatch:
    indices = pa.array([dictionary.index(v) if v is not None else None for v in values], pa.int16())
    column = pa.DictionaryArray.from_arrays(indices, pa.array(dictionary))
    return pa.record_batch({"city": column, "n": pa.array(range(len(values)), pa.int64())})


def test_a_raw_put_whose_batches_replace_their_dictionary_is_stored_and_reads_back_equal(shared, tmp_path):
    first = dictionary_batch(["oslo", "rome", None, "oslo"], ["oslo", "rome"])
    second = dictionary_batch(["lima", "rome", "kyiv"], ["lima", "kyiv", "rome"])  # replaces, does not extend
    third = dictionary_batch(["oslo"], ["oslo"])
    table = pa.Table.from_batches([first, second, third])
    with fp.connect(shared.uri) as client:
        version = client.call(Begin("dicts")).version
    node = shared.nodes[0]
    put_raw(node.uri, ["dicts", str(version), "0", "0"], table)
    files = list((Path(shared.root) / f"node-{node.uri.split('//')[1].split(':')[0]}").rglob("dicts/*/0_0.arrow"))
    assert len(files) == 1, files
    with ipc.open_file(files[0]) as stored:
        back = stored.read_all()
    assert back.column("city").to_pylist() == table.column("city").to_pylist()
    assert back.column("n").to_pylist() == table.column("n").to_pylist()
    assert back.schema.field("city").type == pa.dictionary(pa.int16(), pa.string())


def test_a_put_of_dictionary_columns_with_different_dictionaries_per_chunk_reads_back_equal(shared):
    chunks = [pa.DictionaryArray.from_arrays(pa.array(idx, pa.int8()), pa.array(words))
              for idx, words in (([0, 1, 1, 0] * 50, ["red", "blue"]), ([2, 0, 1] * 40, ["green", "red", "black"]),
                                 ([0] * 30, ["white"]))]
    table = pa.table({"colour": pa.chunked_array(chunks), "k": np.arange(350)})
    frame = pd.DataFrame({"kind": pd.Categorical(["a", "b", "c", "a"] * 25), "v": np.arange(100.0)})
    with fp.connect(shared.uri) as client:
        client.put("colours", table, tiling=(2, 1))
        back = client.open("colours").to_arrow()
        assert back.column("colour").to_pylist() == table.column("colour").to_pylist()
        assert back.column("k").to_pylist() == table.column("k").to_pylist()
        client.put("categories", frame, tiling=(3, 1))
        read = client.open("categories").to_pandas()
        pd.testing.assert_frame_equal(read, frame)


def test_lists_of_categories_with_other_categories_per_chunk_are_put_appended_and_read_back(shared):
    """A list column of dictionary values whose chunks have other dictionaries had been refused ("replaced a nested
    column's dictionary between batches"): by a put of one partition, by a put cut by rows and by an append."""
    def chunk(words: list[str]) -> pa.Table:
        return pa.table({"tags": pa.ListArray.from_arrays(pa.array([0, 1, 2, len(words)], pa.int32()),
                                                          pa.array(words).dictionary_encode())})

    table = pa.concat_tables([chunk(["a", "b", "c"]), chunk(["x", "y", "z", "x"]), chunk(["b", "q", "a"])])
    with fp.connect(shared.uri) as client:
        assert client.put("tag-lists", table, tiling=(1, 1)).to_arrow().to_pylist() == table.to_pylist()
        assert client.append("tag-lists", table).to_arrow().to_pylist() == table.to_pylist() * 2
        assert client.put("tag-rows", table, rows_per_partition=4).to_arrow().to_pylist() == table.to_pylist()


class LyingNode(flight.FlightServerBase):
    """A peer that registered as a node and answers ``stats`` with whatever the test sets."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.179:0")
        self.reply: object = {}

    def do_action(self, context, action):
        if action.type == "stats":
            return [flight.Result(pa.py_buffer(json.dumps(self.reply).encode()))]
        raise flight.FlightServerError(f"a lying node knows no {action.type}")


GARBAGE = [
    ({"bytes_sent": "lots", "partitions_held": None, "free_bytes": [1, 2], "problems": []},
     ["bytes_sent is the text 'lots'", "partitions_held is null", "free_bytes is a list of 2"]),
    ({"problems": "disk on fire"}, ["bytes_sent is missing", "problems is the text 'disk on fire'"]),
    ({"bytes_sent": 1, "partitions_held": 2, "free_bytes": float("inf"), "problems": [3, None]},
     ["free_bytes is float inf", "problems is a list of 2"]),
    ([1, 2, 3], ["the reply is a list of 3, not an object"]),
    ("just a string", ["the reply is the text 'just a string', not an object"]),
]


@pytest.mark.slow  # an attack that waits for the page's refresh: in the slow tier, which CI runs
def test_the_status_page_survives_a_node_whose_stats_are_garbage(new_cluster):
    """A cluster of its own: the liar stays registered (alive until --dead-after) after the test."""
    liar = LyingNode()
    shared = new_cluster(1, process=True, extra_args=["--metrics-port", "0"])
    page = shared.catalog.uris["catalog-status"]
    try:
        liar_uri = f"grpc://127.0.0.179:{liar.port}"
        with ConnectionPool() as pool:
            pool.action(shared.uri, RegisterNode("f" * 32, liar_uri, "127.0.0.179", os.getpid()))
            for reply, words in GARBAGE:
                liar.reply = reply

                def shown(words: list[str] = words) -> dict | None:
                    pool.action(shared.uri, Heartbeat("f" * 32))  # alive, so its stats are asked
                    status = json.loads(urllib.request.urlopen(page + "status.json", timeout=10).read())
                    mine = [n for n in status["nodes"] if n["uri"] == liar_uri]
                    problems = " ".join(mine[0]["problems"]) if mine else ""
                    return status if all(w in problems for w in words) else None

                status = wait_until(shown, what=f"the status page showing {words}")
                liar_entry = next(n for n in status["nodes"] if n["uri"] == liar_uri)
                assert liar_entry["health"] == "NOT_SERVING" and "stats unreadable" in liar_entry["problems"][0]
                assert all(liar_entry[k] is None or isinstance(liar_entry[k], (int, float))
                           for k in ("bytes_sent", "partitions_held"))
                others = [n for n in status["nodes"] if n["uri"] != liar_uri and n["alive"]]
                assert len(others) == 1 and all(n["health"] == "SERVING" and isinstance(n["partitions_held"], int)
                                                for n in others), others
                with urllib.request.urlopen(page, timeout=10) as response:
                    html = response.read().decode()
                    assert response.status == 200 and "stats unreadable" in html and html.count("SERVING") >= 2
                metrics = urllib.request.urlopen(page + "metrics", timeout=10)
                assert metrics.status == 200 and b"flightpart_nodes" in metrics.read()
    finally:
        shared.stop()
        liar.shutdown()


def test_metrics_leave_out_a_value_that_is_not_a_number():
    from prometheus_client.parser import text_string_to_metric_families

    from server.metrics import exposition, metrics_registry
    from server.telemetry import Telemetry

    stats = {"bytes_sent": "many", "rows_sent": None, "batches_sent": [1], "partitions_held": 7,
             "free_bytes": float("nan"), "problems": "not a list", "nodes_alive": "two"}
    text = exposition(metrics_registry("node", lambda: stats, Telemetry(), lambda: [])).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["flightpart_held_partitions"].samples[0].value == 7
    assert families["flightpart_healthy"].samples[0].value == 1  # problems taken from the daemon, not the bad value
    for missing in ("flightpart_sent_bytes", "flightpart_sent_rows", "flightpart_sent_batches",
                    "flightpart_disk_free_bytes", "flightpart_nodes"):
        assert missing not in families, missing


# --------------------------------------------------------------------------- wide tables


def test_a_table_of_10000_columns_is_put_and_read_back_equal(shared):
    rng = np.random.default_rng(7)
    table = pa.table({f"c{k}": rng.integers(0, 1000, 100) for k in range(10_000)})
    with fp.connect(shared.uri) as client:
        client.put("wide", table)
        assert client.open("wide").to_arrow().equals(table)
        client.put("wide-grid", table, tiling=(2, 3))
        back = client.open("wide-grid").to_arrow()
        assert back.column_names == table.column_names and back.equals(table)


def test_the_start_up_line_says_tls_on_and_mutual(tmp_path):
    from certs import make_pki

    pki = make_pki(tmp_path / "pki", ["127.0.0.183"])
    tls = ["--tls-cert", str(pki["server"]), "--tls-key", str(pki["server_key"])]
    for extra, mode in (([], "on"), (["--tls-client-ca", str(pki["ca"])], "mutual")):
        daemon = Daemon(["--log-level", "INFO", "catalog", "--host", "127.0.0.183", "--port", "0", "--state-dir",
                         str(tmp_path / mode), *tls, *extra])
        try:
            started = [line for line in daemon.log().splitlines() if "serving at" in line]
            assert len(started) == 1 and daemon.uri.startswith("grpc+tls://"), daemon.log()
            assert started[0].endswith(f"flightpart catalog serving at {daemon.uri}; cluster not yet; auth "
                                       f"open; TLS {mode}")
        finally:
            daemon.stop()
