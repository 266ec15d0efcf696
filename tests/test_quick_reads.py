"""Attacks on the reads that skip a step for speed.

A small whole partition (or one its links carry in a fraction of the idle
timeout) is read in the caller's thread with the idle timeout as the call's
deadline, not handed to a watched worker; a node streams a partition of at
most 16 MiB whole, not in row ranges whose pace its idle watch sees. Each
shortcut must keep the promise of the path it skips: a frozen replica is
left, an only replica that is merely paused is waited for, a reader that
takes nothing loses its stream slot, and a slow but steady one keeps it
(of a partition sent whole as of one sent in ranges).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart import wire

from helpers import wait_until

IDLE = 1.5  # --stream-idle-timeout of the nodes of the slot tests


def table_of(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(rows), "x": rng.random(rows)})


def read_in_thread(get, ref) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["table"] = get(ref)
        except BaseException as exc:  # the test asserts what it was
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker, outcome


def read_with_first_replica_frozen(cluster, get, ref, table: pa.Table) -> None:
    """``get(ref)`` in a thread while the node of ``ref``'s first replica is frozen: the read ends while it still is,
    with ``table``."""
    frozen = next(n for n in cluster.nodes if n.uri == ref.replicas[0][0])
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        worker, outcome = read_in_thread(get, ref)
        worker.join(60)
        done_while_frozen = not worker.is_alive()
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    worker.join(60)
    assert done_while_frozen, "the read waited for its frozen first replica"
    assert "error" not in outcome, outcome.get("error")
    assert outcome["table"].equals(table)


@pytest.mark.slow  # freezes nodes for several idle timeouts: in the slow tier, which CI runs
def test_a_lone_small_read_leaves_a_frozen_first_replica_while_it_is_still_frozen(new_cluster):
    table = table_of(20_000, 1)  # 312 KiB: read in the caller's thread
    with (new_cluster(2, process=True) as c,
          fp.connect(c.uri, host="127.0.0.99", idle_timeout=0.5) as client):
        ds = client.put("lone", table, tiling=(1, 1), replicas=2)
        meta = ds.__partitioned__
        ref = meta["partitions"][(0, 0)]["data"]
        assert 0 < ref.shareable_bytes <= 1 << 20 and len(ref.replicas) == 2
        read_with_first_replica_frozen(c, meta["get"], ref, table)


@pytest.mark.slow  # freezes a node for several idle timeouts: in the slow tier, which CI runs
def test_a_lone_16_mib_read_over_a_measured_link_leaves_a_frozen_first_replica(new_cluster):
    """A lone read of up to 32 MiB over links measured fast is read in the caller's thread too (pull.LONE_READ_BYTES):
    a first replica frozen after the links were measured is left while it is still frozen, as a small read's is."""
    from flightpart.io import pull

    table = table_of(1_000_000, 3)  # 16 MB
    # an idle timeout of 2 s: the links, measured on a loaded machine too, carry 16 MB well within its eighth
    with (new_cluster(2, process=True) as c,
          fp.connect(c.uri, host="127.0.0.99", idle_timeout=2.0) as client):
        ds = client.put("lone16", table, tiling=(1, 1), replicas=2)
        meta = ds.__partitioned__
        ref = meta["partitions"][(0, 0)]["data"]
        assert pull.SMALL_READ_BYTES < ref.shareable_bytes <= pull.LONE_READ_BYTES and len(ref.replicas) == 2
        assert meta["get"](ref).equals(table)  # measures the links
        assert pull.is_quick(ref.shareable_bytes, ref.replicas[0][0], 2.0, pull.LONE_READ_BYTES), "not read here"
        read_with_first_replica_frozen(c, meta["get"], ref, table)


@pytest.mark.slow  # pauses a node for several idle timeouts: in the slow tier, which CI runs
def test_a_lone_small_read_of_a_paused_only_replica_is_waited_for_not_failed(new_cluster):
    table = table_of(20_000, 2)
    with (new_cluster(1, process=True) as c,
          fp.connect(c.uri, host="127.0.0.99", idle_timeout=0.3) as client):
        ds = client.put("paused", table, tiling=(1, 1))
        meta = ds.__partitioned__
        ref = meta["partitions"][(0, 0)]["data"]
        assert 0 < ref.shareable_bytes <= 1 << 20 and len(ref.replicas) == 1
        node = c.nodes[0]
        os.kill(node.pid, signal.SIGSTOP)
        paused = time.monotonic()
        try:
            worker, outcome = read_in_thread(meta["get"], ref)
            wait_until(lambda: time.monotonic() > paused + 6 * 0.3, what="a pause of six idle timeouts")
            failed_while_paused = outcome.get("error")
        finally:
            os.kill(node.pid, signal.SIGCONT)
        worker.join(60)
    assert failed_while_paused is None, f"the read failed while its only replica was paused: {failed_while_paused!r}"
    assert "error" not in outcome, outcome.get("error")
    assert outcome["table"].equals(table)


def open_streams(client, uri: str) -> int:
    return client.pool.action(uri, wire.GetStats(), timeout=10)["open_streams"]


def slow_reader(uri: str) -> flight.FlightClient:
    """A client whose stream windows stay small (no BDP probing): the node's writes wait for its reads."""
    return flight.connect(uri, generic_options=[("grpc.http2.bdp_probe", 0)])


def read_slowly(uri: str, ticket: flight.Ticket, pause: float) -> tuple[pa.Table, float]:
    """Every message of a stream, ``pause`` seconds after each: a reader on a slow link, taking steadily."""
    reader = slow_reader(uri)
    stream = reader.do_get(ticket)
    batches, started = [], time.monotonic()
    while True:
        try:
            chunk = stream.read_chunk()
        except StopIteration:
            break
        batches.append(chunk.data)
        time.sleep(pause)
    took = time.monotonic() - started
    reader.close()
    return pa.Table.from_batches(batches), took


@pytest.mark.slow  # reads for several idle timeouts: in the slow tier, which CI runs
@pytest.mark.parametrize(("rows", "pause"), [(6_000_000, 0.08), (2_000_000, 0.15)],
                         ids=["46 MiB in ranges", "15 MiB whole"])
def test_a_slow_but_steady_reader_keeps_its_stream_and_its_slot(new_cluster, rows, pause):
    # 46 MiB: 4 MiB ranges taken at about 12 MiB/s, each 0.3 s, well within the 1.5 s idle timeout; 15 MiB, sent
    # whole, at about 6 MiB/s: some 2.4 s, past the idle timeout, and some 3 s inside the 1.5 + 4 s the node allows
    # a stream of that size (margins a loaded machine does not eat: the pace is the reader's sleeps)
    table = pa.table({"id": np.arange(rows)})
    with new_cluster(1, process=True, node_args=["--stream-idle-timeout", str(IDLE)]) as c, \
            fp.connect(c.uri, host="127.0.0.99") as client:
        client.put("steady", table, tiling=(1, 1))
        node = c.nodes[0]
        got, took = read_slowly(node.uri, flight.Ticket(wire.Ticket("steady", 1, (0, 0)).encode()), pause)
        log = node.log()
        wait_until(lambda: open_streams(client, node.uri) == 0, what="the stream's slot to be given back")
    assert took > IDLE, f"the read took {took:.1f} s, not long enough to show anything"
    assert got.equals(table)
    assert "freed the stream slot" not in log


@pytest.mark.slow  # waits out the idle timeout: in the slow tier, which CI runs
def test_a_reader_that_takes_nothing_of_a_stream_sent_whole_loses_its_slot(new_cluster):
    table = pa.table({"id": np.arange(1_000_000)})  # 7.6 MiB: sent whole, not in row ranges
    with new_cluster(1, process=True, node_args=["--stream-idle-timeout", str(IDLE)]) as c, \
            fp.connect(c.uri, host="127.0.0.99") as client:
        client.put("held", table, tiling=(1, 1))
        node = c.nodes[0]
        reader = slow_reader(node.uri)
        stream = reader.do_get(flight.Ticket(wire.Ticket("held", 1, (0, 0)).encode()))
        first = stream.read_chunk().data  # the stream is open, and then not read again
        assert open_streams(client, node.uri) == 1  # the node is still writing: gRPC's window is full
        wait_until(lambda: open_streams(client, node.uri) == 0, timeout=IDLE * 10,
                   what="the idle stream's slot to be freed")
        assert "its stream, sent whole, was not done" in node.log()
        rest = stream.read_all()  # the reader comes back: the stream was never cut, only its slot freed
        reader.close()
    assert pa.concat_tables([pa.Table.from_batches([first]), rest]).equals(table)
