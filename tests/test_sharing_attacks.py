"""Capabilities no stronger than their token, clocks that disagree, and a node's streams shared fairly.

Real daemons on loopback, with a cluster secret: a token that expires, a node
whose clock runs an hour ahead and one whose clock runs an hour behind (the
FLIGHTPART_TEST_CLOCK_OFFSET hook: both judge expiry by the catalog's clock), a
reader that opens a node's streams and never reads them, and 64 readers at
once on one replica per partition.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart import tokens, wire
from flightpart.io.access import Access
from flightpart.io.connections import ConnectionPool
from flightpart.local.cluster import Daemon
from flightpart.tokens import TOKEN_PREFIX

from helpers import code_of, run_threads, wait_until

SECRET = tokens.new_secret()
MARGIN = 1.0  # FLIGHTPART_CLOCK_MARGIN for this module's cluster: expiry is seen within a second or two
IDLE = 3.0    # --stream-idle-timeout of this module's nodes
AHEAD = 3600  # seconds the skewed node's clock runs ahead
BEHIND = 3600  # seconds another node's clock runs behind


def reader_token(name: str, expiry: float = 0) -> str:
    return tokens.role_token(SECRET.encode(), "reader", name, int(expiry))


def table_of(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(rows), "x": rng.random(rows)})


@pytest.fixture(scope="module")
def secured(tmp_path_factory, make_cluster):
    """Three nodes, one whose clock runs an hour ahead and one whose clock runs an hour behind; datasets placed on
    known nodes. The two odd clocks are on the fourth and fifth addresses of the cluster's range."""
    root = tmp_path_factory.mktemp("sharing")
    secret = root / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    env = {"FLIGHTPART_CLOCK_MARGIN": str(MARGIN)}
    with make_cluster(3, process=True, root=root, heartbeat=0.3, env=env,
                      extra_args=["--secret-file", str(secret), "--metrics-port", "0"],
                      node_args=["--stream-idle-timeout", str(IDLE)]) as c:
        ahead = Daemon(["serve", "--host", c.ips[3], "--port", "0", "--data-dir", str(root / "ahead"),
                        "--catalog", c.uri, "--heartbeat", "0.3", "--secret-file", str(secret),
                        "--stream-idle-timeout", str(IDLE)],
                       env={**env, "FLIGHTPART_TEST_CLOCK_OFFSET": str(AHEAD)})
        c.nodes.append(ahead)  # stopped with the cluster
        behind = Daemon(["serve", "--host", c.ips[4], "--port", "0", "--data-dir", str(root / "behind"),
                         "--catalog", c.uri, "--heartbeat", "0.3", "--secret-file", str(secret),
                         "--stream-idle-timeout", str(IDLE)],
                        env={**env, "FLIGHTPART_TEST_CLOCK_OFFSET": str(-BEHIND)})
        c.nodes.append(behind)
        with fp.connect(c.uri, token=SECRET) as owner:
            wait_until(lambda: sum(n.alive for n in owner.nodes()) == 5, what="five live nodes")
            owner.put("shared", table_of(4000, 1), tiling=(4, 1), nodes=c.ips[:3])
            owner.put("mirrored", table_of(3000, 2), tiling=(3, 1), replicas=2, nodes=[c.ips[0], c.ips[3]])
            owner.put("only-ahead", table_of(500, 3), tiling=(1, 1), nodes=[c.ips[3]])
            owner.put("only-behind", table_of(700, 6), tiling=(1, 1), nodes=[c.ips[4]])
            owner.put("big", table_of(4_000_000, 4), tiling=(1, 1), nodes=[c.ips[1]])
        yield c


def owner_pool() -> ConnectionPool:
    return ConnectionPool(Access(token=SECRET))


def capability_expiry(ds) -> int:
    """The expiry written in the capability a handle carries (what nodes check)."""
    blob = pickle.dumps(ds.__partitioned__)
    start = blob.index(f"{TOKEN_PREFIX}:cap:".encode())
    return int(blob[start:start + 200].split(b":")[3])


@pytest.mark.slow  # waits for a token to expire: in the slow tier, which CI runs
def test_a_handle_stops_reading_once_the_token_that_opened_it_expired(secured):
    expiry = time.time() + 4
    with fp.connect(secured.uri, token=reader_token("brief", expiry), host="127.0.0.99") as reader:
        ds = reader.open("shared")
        assert capability_expiry(ds) <= int(expiry)  # the catalog's default would be a day
        assert ds.to_arrow().equals(table_of(4000, 1))
        wait_until(lambda: time.time() > expiry + MARGIN + 0.5, timeout=20, what="the token and its margin to pass")
        with pytest.raises(fp.Unauthenticated, match="expired"):
            ds.to_arrow()
    with fp.connect(secured.uri, token=reader_token("forever"), host="127.0.0.99") as reader:
        ds = reader.open("shared")  # a token without expiry keeps the catalog's capability period
        assert capability_expiry(ds) > time.time() + 3600
        assert ds.to_arrow().equals(table_of(4000, 1))


def test_a_node_whose_clock_runs_ahead_serves_a_capability_by_the_catalogs_clock(secured):
    """A node an hour ahead judges expiry by the catalog's clock (told with each heartbeat's answer): it serves a
    capability in date, where it holds one replica of several and where it holds the only one, and refuses nothing."""
    ahead = secured.nodes[3].uri
    pool = owner_pool()
    refused_before = pool.action(ahead, wire.GetStats(), timeout=10)["refused_calls"]
    with fp.connect(secured.uri, token=reader_token("skewed", time.time() + 600), host="127.0.0.99") as reader:
        meta = reader.open("mirrored").__partitioned__
        refs = [p["data"] for p in meta["partitions"].values()]
        assert all(ahead in {r[0] for r in ref.replicas} for ref in refs)
        only_ahead = [dataclasses.replace(ref, replicas=tuple(r for r in ref.replicas if r[0] == ahead))
                      for ref in refs]
        tables = meta["get"](only_ahead)  # every read asks the node an hour ahead, and only it
        assert pa.concat_tables(tables).equals(table_of(3000, 2))
        assert reader.open("only-ahead").to_arrow().equals(table_of(500, 3))
    assert pool.action(ahead, wire.GetStats(), timeout=10)["refused_calls"] == refused_before


def test_a_node_whose_clock_runs_behind_refuses_a_capability_once_expired_by_the_catalogs_clock(secured):
    """A node an hour behind serves a capability until the catalog's clock is past its expiry and the margin, and
    then refuses it (by its own clock it would have an hour to go)."""
    expiry = time.time() + 4
    with fp.connect(secured.uri, token=reader_token("late", expiry), host="127.0.0.99") as reader:
        ds = reader.open("only-behind")  # its one partition is on the node an hour behind
        assert capability_expiry(ds) <= int(expiry)
        assert ds.to_arrow().equals(table_of(700, 6))
        wait_until(lambda: time.time() > expiry + MARGIN + 0.5, timeout=20,
                   what="the capability and its margin to pass")
        with pytest.raises(fp.Unauthenticated, match="expired") as info:
            ds.to_arrow()
        assert "every replica refused" in str(info.value)
    with fp.connect(secured.uri, token=reader_token("fresh"), host="127.0.0.99") as reader:
        assert reader.open("only-behind").to_arrow().equals(table_of(700, 6))  # a capability in date is served


def test_a_node_whose_clock_is_past_the_margin_is_logged_and_shown(secured):
    with fp.connect(secured.uri, token=SECRET) as owner:
        wait_until(lambda: all(n.clock_skew is not None for n in owner.nodes()), what="every node's clock")
        skews = {n.ip: n.clock_skew for n in owner.nodes()}
    assert AHEAD - 5 < skews.pop(secured.ips[3]) < AHEAD + 5
    assert -BEHIND - 5 < skews.pop(secured.ips[4]) < -BEHIND + 5
    assert all(abs(s) < MARGIN for s in skews.values()), skews
    wait_until(lambda: "its clock is +3600" in secured.catalog.log(), what="the catalog's warning")
    assert secured.catalog.log().count("its clock is +") == 1  # once, not on every beat
    page = secured.catalog.uris["catalog-status"]
    status = json.loads(urllib.request.urlopen(page + "status.json", timeout=10).read())
    shown = {n["ip"]: n["clock_skew"] for n in status["nodes"]}
    assert AHEAD - 5 < shown[secured.ips[3]] < AHEAD + 5
    html = urllib.request.urlopen(page, timeout=10).read().decode()
    assert "clock skew" in html and '<span class="bad">+3600.' in html


def bearer(token: str, grant: str | None = None) -> flight.FlightCallOptions:
    """Call options carrying ``token``, as a plain Flight client sends it, and a writer's ``grant`` for its version."""
    headers = [(b"authorization", f"Bearer {token}".encode())]
    return flight.FlightCallOptions(
        headers=headers + ([(tokens.GRANT_HEADER.encode(), grant.encode())] if grant else []))


def writer_of(name: str, dataset: str, version: int) -> flight.FlightCallOptions:
    """A writer's call options for ``dataset`` v``version``, with the grant the catalog gives the writer that began
    it."""
    grant = tokens.version_grant(SECRET.encode(), dataset, version, name, int(time.time()) + 3600)
    return bearer(tokens.role_token(SECRET.encode(), "writer", name), grant)


def abandon(writers: list) -> None:
    """Close put streams without their trailer: the node stores nothing of them (one refused already may raise)."""
    for writer in writers:
        try:
            writer.close()
        except flight.FlightError:
            pass


def node_streams(uri: str) -> int:
    return owner_pool().action(uri, wire.GetStats(), timeout=10)["open_streams"]


def test_a_reader_holding_idle_streams_does_not_lock_others_out_and_loses_them(secured):
    node = secured.nodes[1].uri  # holds the one partition of "big" (32 MB)
    # without gRPC's window growth (BDP probing) a stream's window stays small, so a reader that does not read
    # soon stops the node's writes: a reader on a slow link, or one that means to hold the node's streams
    hog = flight.connect(node, generic_options=[("grpc.http2.bdp_probe", 0)])
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {reader_token('hog')}".encode())])
    ticket = flight.Ticket(wire.Ticket("big", 1, (0, 0)).encode())
    held, refused = [], []
    for _ in range(64):
        try:
            reader = hog.do_get(ticket, options=options)
            reader.read_chunk()  # the first batch: the stream is open, and then never read again
            held.append(reader)
        except flight.FlightError as exc:
            refused.append(code_of(exc))
    # one caller holds at most half of --max-streams 64; the rest of its asks are refused as BUSY (retryable)
    assert len(held) == 32 and refused == ["BUSY"] * 32
    assert node_streams(node) == 32

    with fp.connect(secured.uri, token=reader_token("other"), host="127.0.0.99") as other:
        got = other.open("big").to_arrow()  # another caller reads while the hog holds its share
    assert got.num_rows == 4_000_000 and pc.sum(got.column("id")).as_py() == 4_000_000 * 3_999_999 // 2

    wait_until(lambda: node_streams(node) == 0, timeout=IDLE * 10, what="the idle streams' slots to be freed")
    assert "took nothing for 3 s" in secured.nodes[1].log()
    with pytest.raises(flight.FlightError) as info:  # its unread calls still count against its own share
        hog.do_get(ticket, options=options).read_chunk()
    assert code_of(info.value) == "BUSY"
    failed = None
    for reader in reversed(held):  # the hog comes back: a stream the node had not finished was cancelled
        try:
            reader.read_all()
        except flight.FlightError as exc:
            failed = exc
            break
    assert failed is not None and code_of(failed) == "UNAVAILABLE" and "cancelled" in str(failed), failed
    for reader in held:
        reader.cancel()


def test_a_writer_holding_idle_puts_does_not_lock_others_out_and_loses_their_slots(secured):
    """Puts that send nothing held every stream of a node: readers and other writers were refused BUSY for as long
    as the writer liked. A put now counts against its caller's share and loses its slot when it idles (the node's
    whole limit, reached by two callers, is the next test's)."""
    node = secured.nodes[0].uri
    mallory = flight.connect(node)
    options = writer_of("mallory", "idle-puts", 1)
    schema = pa.schema([("id", pa.int64())])
    held, refused = [], []
    for k in range(64):
        writer, _ = mallory.do_put(flight.FlightDescriptor.for_path("idle-puts", "1", str(k), "0"), schema,
                                   options=options)
        held.append(writer)
    wait_until(lambda: node_streams(node) == 32, 20, "mallory's puts to be admitted or refused")
    for writer in held[:]:  # a refused put's error comes back when its writer writes
        try:
            writer.write_table(pa.table({"id": [1]}, schema=schema))
        except flight.FlightError as exc:
            refused.append(code_of(exc))
            held.remove(writer)
    assert len(refused) == 32 and set(refused) == {"BUSY"}, refused
    with fp.connect(secured.uri, token=tokens.role_token(SECRET.encode(), "writer", "alice"),
                    host="127.0.0.99") as alice:
        truth = table_of(1000, 9)
        # while mallory holds her share
        assert alice.put("alices", truth, nodes=[secured.ips[0]]).to_arrow().equals(truth)
    wait_until(lambda: node_streams(node) == 0, timeout=IDLE * 10, what="the idle puts' slots to be freed")
    assert "its put sent nothing for 3 s" in secured.nodes[0].log()
    with pytest.raises(flight.FlightError) as info:  # her open calls still count against her share
        writer, _ = mallory.do_put(flight.FlightDescriptor.for_path("idle-puts", "1", "99", "0"), schema,
                                   options=options)
        writer.write_table(pa.table({"id": [1]}, schema=schema))
        writer.close()
    assert code_of(info.value) == "BUSY"
    abandon(held)
    assert not list(secured.root.glob("node-*/datasets/idle-puts/v1/*.arrow"))


def test_two_writers_holding_their_shares_of_puts_reach_the_nodes_limit_where_a_reader_is_busy(tmp_path, new_cluster):
    """The node's whole limit, reached by two callers' idle puts (half each), refuses a third caller BUSY. A node of
    its own with a long idle timeout: the module's 3 s would free the first caller's slots on a loaded machine before
    the second's arrive."""
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    with new_cluster(1, process=True, root=tmp_path / "c", extra_args=["--secret-file", str(secret)],
                      node_args=["--max-streams", "4", "--stream-idle-timeout", "600"]) as c:
        node = c.nodes[0].uri
        schema = pa.schema([("id", pa.int64())])
        held = []
        for k, name in enumerate(["bob", "dave", "bob", "dave"]):
            options = writer_of(name, "idle-puts", 1)
            held.append(flight.connect(node).do_put(flight.FlightDescriptor.for_path("idle-puts", "1", str(k), "0"),
                                                    schema, options=options)[0])
        wait_until(lambda: node_streams(node) == 4, 20, "both writers' puts to be admitted")
        with pytest.raises(flight.FlightError, match="busy: 4 streams open") as info:
            flight.connect(node).do_get(flight.Ticket(wire.Ticket("idle-puts", 1, (0, 0)).encode()),
                                        options=bearer(reader_token("carol"))).read_all()
        assert code_of(info.value) == "BUSY"

        # a writer's put refused BUSY waits, retries once the streams are free, and tells its progress once
        told: list[tuple[int, int]] = []
        truth = table_of(200_000, 5)
        refused_before = owner_pool().action(node, wire.GetStats(), timeout=10)["refused_calls"]
        with fp.connect(c.uri, token=tokens.role_token(SECRET.encode(), "writer", "erin"), host="127.0.0.99") as erin:
            with ThreadPoolExecutor(1) as pool:
                putting = pool.submit(erin.put, "erins", truth, nodes=[c.ips[0]],
                                      progress=lambda done, total: told.append((done, total)))
                wait_until(lambda: owner_pool().action(node, wire.GetStats(), timeout=10)["refused_calls"]
                           > refused_before + 1, 30, "erin's put to be refused BUSY")
                abandon(held)
                assert putting.result(timeout=120).to_arrow().equals(truth)
        assert told and told[-1][0] == told[-1][1] == truth.nbytes, told[-3:]
        assert all(done <= total for done, total in told), [t for t in told if t[0] > t[1]][:3]


def test_the_only_replica_paused_longer_than_the_idle_timeout_is_waited_for_not_failed(secured):
    node = secured.nodes[2]  # the third node: a node that stops answering for a moment (a pause, a starved CPU)
    with fp.connect(secured.uri, token=reader_token("patient"), host="127.0.0.99", idle_timeout=0.3) as reader:
        meta = reader.open("shared").__partitioned__
        refs = [p["data"] for p in meta["partitions"].values() if p["data"].replicas[0][0] == node.uri]
        assert refs and all(len(ref.replicas) == 1 for ref in refs)
        expected = meta["get"](refs)
        os.kill(node.pid, signal.SIGSTOP)
        paused = time.monotonic()
        try:
            outcome: dict = {}
            worker = threading.Thread(target=lambda: outcome.update(tables=meta["get"](refs)))
            worker.start()
            wait_until(lambda: time.monotonic() > paused + 6 * 0.3, what="a pause of six idle timeouts")
        finally:
            os.kill(node.pid, signal.SIGCONT)
        worker.join(60)
    assert "tables" in outcome, "the read failed although its only replica answered again"
    assert [t.equals(e) for t, e in zip(outcome["tables"], expected)] == [True] * len(refs)


@pytest.mark.slow
def test_sixty_four_readers_on_one_replica_per_partition_see_no_failed_read(new_cluster):
    readers, rounds = 64, 10
    table = table_of(600_000, 5)
    expected = (table.num_rows, pc.sum(table.column("id")).as_py(), pc.sum(table.column("x")).as_py())
    with new_cluster(3, process=True) as c:  # default settings, no secret
        with fp.connect(c.uri) as client:
            client.put("crowd", table, tiling=(6, 1))
        errors: list[BaseException] = []
        bad: list[tuple] = []
        start = threading.Barrier(readers)

        def reader() -> None:
            try:
                with fp.connect(c.uri, host="127.0.0.99") as mine:
                    start.wait()
                    for _ in range(rounds):
                        got = mine.open("crowd").to_arrow()
                        seen = (got.num_rows, pc.sum(got.column("id")).as_py(), pc.sum(got.column("x")).as_py())
                        if seen[:2] != expected[:2] or seen[2] != pytest.approx(expected[2]):  # sums of floats by chunk
                            bad.append(seen)
            except BaseException as exc:
                errors.append(exc)
                start.abort()

        run_threads(reader, readers, 900)
    assert not errors, f"{len(errors)} of {readers * rounds} reads failed, first: {errors[0]!r}"
    assert not bad, bad[:3]
