"""The reader's stall watchdog against a real Flight server: a stream that trickles (each message well within the
idle timeout, the whole far beyond it) is read to its end; one that stops sending is left once the idle timeout
passes. Both with the stream read whole in C++ and watched by its thread's wakes, and chunk by chunk."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flightpart.io import pull
from flightpart.io.connections import ConnectionPool

BATCHES = 6


def _batch(k: int) -> pa.RecordBatch:
    return pa.record_batch({"k": pa.array(range(k * 100, (k + 1) * 100))})


class Slow(flight.FlightServerBase):
    """``trickle``: a batch every 0.4 s; ``stall``: two batches, then nothing until the test ends."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.release = threading.Event()

    def do_get(self, context, ticket):
        how = ticket.ticket.decode()

        def batches():
            for k in range(BATCHES):
                if k and how == "trickle":
                    self.release.wait(0.4)
                if k == 2 and how == "stall":
                    self.release.wait(60)
                    return
                yield _batch(k)

        return flight.GeneratorStream(_batch(0).schema, batches())


@pytest.fixture
def server():
    srv = Slow()
    yield f"grpc://127.0.0.1:{srv.port}"
    srv.release.set()
    srv.shutdown()


@pytest.fixture(params=["whole", "chunks"])
def mode(request, monkeypatch):
    if request.param == "chunks":
        monkeypatch.setattr(pull, "WAKES_VISIBLE", False)
    elif not pull.WAKES_VISIBLE:
        pytest.skip("this system shows no thread's wakes: streams are read chunk by chunk")
    return request.param


def test_a_stream_that_trickles_past_the_idle_timeout_is_read_to_its_end(server, mode):
    pool = ConnectionPool()
    table = pull.stream(pool, server, flight.Ticket(b"trickle"), idle_timeout=1.0)
    assert table.equals(pa.Table.from_batches([_batch(k) for k in range(BATCHES)]))


def test_a_stream_that_stops_sending_is_left_after_the_idle_timeout(server, mode):
    pool = ConnectionPool()
    with pytest.raises(pull.Stalled):
        pull.stream(pool, server, flight.Ticket(b"stall"), idle_timeout=1.0)
    # the cancelled call ends in the worker; pyarrow's own read_all would now raise a KeyboardInterrupt in this
    # thread (a cancelled read_all is turned into a simulated Ctrl-C): none may come
    for _ in range(10):
        time.sleep(0.05)


def test_a_replica_slower_than_the_least_pace_is_left_for_the_next_and_the_last_is_read_at_its_pace(server,
                                                                                                     monkeypatch):
    """A node that trickles (a message within each idle timeout) had held a reader for the stream's deadline, an
    hour, before the next replica was asked. Scaled down: 8,000 bytes at 8,000 B/s after a 0.5 s grace is 1.5 s,
    and the trickle takes at least 2 s."""
    monkeypatch.setattr(pull, "READ_GRACE", 0.5)
    monkeypatch.setattr(pull, "MIN_READ_RATE", 8000)
    bound = pull.RowBound(BATCHES * 100, bytes=8000, sized=True)
    pool = ConnectionPool()
    with pytest.raises(pull.Stalled, match=r"sent less than its 8,000 bytes in \d+ s, slower than") as info:
        pull.stream(pool, server, flight.Ticket(b"trickle"), idle_timeout=1.0, bound=bound)
    assert info.value.slow  # its node answers: the connection other streams share with it is kept
    table = pull.stream(pool, server, flight.Ticket(b"trickle"), idle_timeout=1.0, bound=bound, patient=True)
    assert table.equals(pa.Table.from_batches([_batch(k) for k in range(BATCHES)]))


@pytest.mark.slow  # waits a stall patience out: in the slow tier, which CI runs
def test_the_last_replica_that_answers_but_never_moves_is_left_after_the_stall_patience(server, mode, monkeypatch):
    """The last replica is waited for while its server answers (a busy node is slow, a frozen one silent), but a
    stream that never moves again is left after STALL_PATIENCE: a wedged node, or one that lies about being busy,
    held the reader until the stream's deadline (an hour)."""
    monkeypatch.setattr(pull, "STALL_PATIENCE", 3.0)
    pool = ConnectionPool()
    started = time.monotonic()
    with pytest.raises(pull.Stalled, match="sent nothing for [3-9] s, though it answered"):
        pull.stream(pool, server, flight.Ticket(b"stall"), idle_timeout=0.5, patient=True)
    assert time.monotonic() - started >= 3.0  # waited the patience out: more than the idle timeout
