"""What a small read no longer does each time, and why the answer stays the same.

A ticket's bytes are written once per ticket and decoded once per process; a
mapped table's size is remembered with its map; a partition's path is made
once; a read is done in the caller's thread when it should be quick. A client
flooding the node with distinct tickets does not grow what it keeps, and a
stream sent whole is given time by its size, up to a bound.
"""

from __future__ import annotations

import time
import types

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flightpart.errors import RequestRejected
from flightpart.io import pull
from flightpart.io.compression import LinkRates
from flightpart.io.layout import partition_relpath
from flightpart.io.maps import MappedFiles, stored_facts, stored_nbytes
from flightpart.server import auth
from flightpart.server.auth import OWNER, WHOLE_STREAM_MOST_SECONDS, WHOLE_STREAM_RATE, CallGuard, GuardFactory
from flightpart.server.store import PartitionStore
from flightpart.wire import KNOWN_TICKETS, Message, Ticket

MIB = 1 << 20


def test_a_tickets_bytes_are_what_its_fields_say_and_written_once():
    ticket = Ticket("sales", 3, (1, 2), columns=("a", "b"), compression="zstd")
    first = ticket.encode()
    assert first == Message.encode(ticket)  # the fields' own walk
    assert ticket.encode() is first
    assert Ticket.decode(first) == ticket


def test_a_decoded_ticket_is_kept_only_once_it_passed_every_check():
    raw = Ticket("kept", 1, (0, 0)).encode()
    assert Ticket.decode(raw) is Ticket.decode(raw)
    backwards = b'{"dataset":"bad","version":1,"part":[0,0],"columns":null,"rows":[5,2]}'
    for _ in range(2):  # refused every time, not remembered as good
        with pytest.raises(RequestRejected, match="before start"):
            Ticket.decode(backwards)


def test_a_flood_of_distinct_tickets_keeps_no_more_than_the_known_number():
    first = Ticket("flood", 1, (0, 0)).encode()
    kept = Ticket.decode(first)
    for k in range(KNOWN_TICKETS):  # a client sending as many distinct valid tickets (row ranges) as are kept
        raw = Ticket("flood", 1, (0, 0), rows=(0, k)).encode()
        assert Ticket.decode(raw).rows == (0, k)
    again = Ticket.decode(first)
    assert again == kept and again is not kept  # the cache was let go, not grown: the first is decoded afresh


def test_a_mapped_tables_remembered_bytes_are_exact_and_a_slice_is_measured_itself(tmp_path):
    table = pa.table({"id": np.arange(100_000), "label": [f"r{k}" for k in range(100_000)]})
    path = tmp_path / "t.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=10_000):
            writer.write_batch(batch)
    mapped = MappedFiles().get(path)
    assert stored_nbytes(mapped) == mapped.nbytes == stored_nbytes(mapped)
    assert stored_facts(mapped) == (mapped.nbytes, 10, False)  # one batch per 10,000 rows written, no dictionaries
    assert stored_facts(mapped) is stored_facts(mapped)
    labelled = mapped.set_column(1, "label", pc.dictionary_encode(mapped.column("label")))
    assert stored_facts(labelled).dictionaries  # not a map's table: worked out itself
    part = mapped.slice(10, 100)  # not a map's table: worked out each time
    assert stored_nbytes(part) == part.nbytes < mapped.nbytes // 100


def test_a_partitions_path_is_made_once_and_is_the_same_path(tmp_path):
    store = PartitionStore(tmp_path)
    first = store.path("sales", 3, (1, 2))
    assert store.path("sales", 3, (1, 2)) is first
    assert first == store.root / partition_relpath("sales", 3, (1, 2))
    assert store.path("sales", 3, (2, 1)) != first


def test_a_stream_sent_whole_is_given_its_size_in_time_but_never_more_than_a_minute(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(auth, "time", types.SimpleNamespace(monotonic=clock, time=time.time))  # the guard's clock only
    guards = GuardFactory(max_streams=8)
    guards.stream_idle_timeout = 10.0  # set after construction: no watchdog thread, the test frees by hand
    small, huge = (CallGuard(guards, OWNER, stream=True) for _ in range(2))
    for guard, nbytes in ((small, 16 * MIB), (huge, 1 << 40)):  # 4 s at 4 MB/s; a TiB of dictionaries: days
        guards.open_streams += 1  # what start_call counts
        guards.admit(guard, "ipv4:127.0.0.1:5000")
        guards.sent_whole(guard, nbytes)
    assert 16 * MIB / WHOLE_STREAM_RATE == 4.0
    clock.now = 4.0 + 10.0 - 0.5
    guards.free_idle_streams()
    assert small.holds_slot and huge.holds_slot
    clock.now = 4.0 + 10.0 + 0.5
    guards.free_idle_streams()
    assert not small.holds_slot and huge.holds_slot
    clock.now = WHOLE_STREAM_MOST_SECONDS + 10.0 + 0.5
    guards.free_idle_streams()
    assert not huge.holds_slot and guards.open_streams == 0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_read_is_quick_when_small_and_its_links_carry_it_in_an_eighth_of_the_idle_timeout(monkeypatch):
    clock = Clock()
    rates = LinkRates(clock)
    monkeypatch.setattr(pull, "RATES", rates)
    fast, slow = "grpc://10.0.0.1:1", "grpc://10.0.0.2:1"
    assert not pull.is_quick(0, fast, 2.0)  # unknown size: watched
    assert pull.is_quick(MIB, fast, 2.0) and pull.is_quick(1, slow, 2.0)  # links not measured yet
    assert not pull.is_quick(MIB + 1, fast, 2.0)  # larger reads keep their reused worker
    rates.started(fast)
    clock.now += 0.16
    rates.finished(fast, 16 * MIB, None)  # 100 MiB/s, this process's link too
    assert rates.rate(fast) == 100 * MIB
    assert pull.is_quick(MIB, fast, 2.0)         # 0.01 s of a 0.25 s eighth
    assert not pull.is_quick(16 * MIB, fast, 2.0)  # fast enough, but large
    lone = pull.LONE_READ_BYTES
    assert pull.is_quick(16 * MIB, fast, 2.0, lone)  # a lone read, in a thread that outlives it: 0.16 s of 0.25 s
    assert not pull.is_quick(32 * MIB, fast, 2.0, lone)  # 0.32 s: more than an eighth
    assert not pull.is_quick(16 * MIB, "grpc://10.0.0.3:1", 2.0, lone)  # larger than small over a link not measured
    assert pull.is_quick(MIB, "grpc://10.0.0.3:1", 2.0, lone)  # a small one is read there while unmeasured
    assert not pull.is_quick(MIB, fast, 0.05)    # 0.01 s, more than an eighth of 0.05 s
    for _ in range(30):  # thirty streams in flight share the link: 0.31 s each
        rates.started(fast)
    assert not pull.is_quick(MIB, fast, 2.0)
    for _ in range(30):
        rates.finished(fast, 0, None)
    rates.started(slow)
    clock.now += 16.0
    rates.finished(slow, 16 * MIB, None)  # 1 MiB/s, and this process's link measured slow with it
    assert not pull.is_quick(MIB, slow, 2.0)  # small, but 1 s over this link: watched
    assert not pull.is_quick(MIB, fast, 2.0)  # this process's own link is the slow one now
