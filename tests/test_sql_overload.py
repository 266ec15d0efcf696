"""More SQL queries than the catalog runs at once: they wait their turn, and past the waiting room they are refused
with the retryable code BUSY at once, nothing of them run; a bad limit stops the catalog from starting."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

import flightpart as fp
from flightpart.local.cluster import Daemon

from helpers import wait_until

SLOW = "SELECT sum(hash(a.range * b.range)) AS s FROM range(200000) a, range(200000) b"  # runs until it is stopped
HOLD = 20.0
"""Seconds the slow query holds the one slot (until its caller's deadline): room for a loaded machine to start the
waiting queries and look at them before it ends."""


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory):
    daemon = Daemon(["catalog", "--host", "127.0.0.1", "--port", "0", "--state-dir",
                     str(tmp_path_factory.mktemp("one-slot"))], env={"FLIGHTPART_SQL_QUERIES": "1"})
    yield daemon.uris["catalog"]
    daemon.stop()


def stats(uri: str) -> dict:
    with fp.connect(uri) as client:
        return client.call(fp.wire.GetStats()).values


@pytest.mark.slow  # a load test holding a query slot 20 s: in the slow tier, which CI runs
def test_queries_past_the_limit_wait_and_past_the_waiting_room_are_busy(one_slot):
    outcomes: dict[str, list] = {"slow": [], "waited": []}

    def slow() -> None:
        with fp.connect(one_slot) as client:
            try:
                client.sql(SLOW, timeout=HOLD)
            except fp.FlightpartError as exc:
                outcomes["slow"].append(exc)

    def waiting() -> None:
        with fp.connect(one_slot) as client:
            outcomes["waited"].append(client.sql("SELECT 41 + 1 AS x", timeout=60).to_arrow().column("x")[0].as_py())

    first = threading.Thread(target=slow)
    first.start()
    wait_until(lambda: stats(one_slot)["sql_queries_running"] == 1, 30, "the slow query to hold the one slot")
    queued = [threading.Thread(target=waiting) for _ in range(4)]  # the waiting room: 4 per slot
    for t in queued:
        t.start()
    wait_until(lambda: stats(one_slot)["sql_queries_waiting"] == 4, 30, "four queries waiting")
    with fp.connect(one_slot) as client, pytest.raises(fp.ServerBusy, match="1 SQL queries at once and 4 more"):
        client.sql("SELECT 1 AS one", timeout=30)
    for t in [first, *queued]:
        t.join(120)
    assert outcomes["waited"] == [42] * 4  # each ran once the slow one was stopped at its caller's deadline
    assert len(outcomes["slow"]) == 1
    after = stats(one_slot)
    assert after["sql_queries_refused_busy"] == 1 and after["sql_queries_running"] == 0
    assert after["sql_queries_waiting"] == 0


@pytest.mark.slow  # a load test holding a query slot 20 s: in the slow tier, which CI runs
def test_a_waiting_query_whose_caller_gives_up_leaves_the_queue(one_slot):
    holder = threading.Thread(target=lambda: _quietly(lambda: fp.connect(one_slot).sql(SLOW, timeout=HOLD)))
    holder.start()
    wait_until(lambda: stats(one_slot)["sql_queries_running"] == 1, 30, "the slow query to hold the one slot")
    with fp.connect(one_slot) as client, pytest.raises(fp.FlightpartError):
        client.sql("SELECT 2 AS two", timeout=1)  # gives up while waiting
    wait_until(lambda: stats(one_slot)["sql_queries_waiting"] == 0, 10, "the query that gave up to leave the queue")
    holder.join(60)
    with fp.connect(one_slot) as client:
        assert client.sql("SELECT 3 AS three").to_arrow().column("three").to_pylist() == [3]


def _quietly(call) -> None:
    try:
        call()
    except fp.FlightpartError:
        pass


@pytest.mark.parametrize("value", ["0", "two", "-1", "٣"])
def test_a_bad_limit_is_a_clear_error_at_start(tmp_path, value):
    done = subprocess.run([sys.executable, "-m", "flightpart", "catalog", "--host", "127.0.0.1", "--port", "0",
                           "--state-dir", str(tmp_path)], env={**os.environ, "FLIGHTPART_SQL_QUERIES": value},
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode != 0 and "FLIGHTPART_SQL_QUERIES" in done.stderr
            and "Traceback" not in done.stderr), done.stderr


def test_a_query_past_its_callers_deadline_is_a_timeout_not_an_unavailable_catalog(one_slot):
    """The caller's own deadline passing had come back as ``NodeUnavailable`` (UNAVAILABLE, a ConnectionError), which
    invites a retry that would time out the same way."""
    with fp.connect(one_slot) as client, pytest.raises(fp.QueryTimeout,
                                                       match="within the 2 s this call allows") as info:
        client.sql(SLOW, timeout=2)
    assert isinstance(info.value, TimeoutError) and not isinstance(info.value, ConnectionError)
    assert info.value.code == "QUERY_TIMEOUT"
    wait_until(lambda: stats(one_slot)["sql_queries_running"] == 0, 60, "the query to be stopped at the catalog")
