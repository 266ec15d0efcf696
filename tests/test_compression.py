"""Compression on the wire: who asks for it, when a node grants it, and that any Arrow reader reads the result.

The shaped-link case (a client that measures a slow link and then asks for
ZSTD) runs on network namespaces in tests/test_netns.py.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart.errors import RequestRejected
from flightpart.io import compression
from flightpart.io.compression import PROBE_EVERY, LinkRates, write_options
from flightpart.wire import Ticket


def repetitive(rows: int = 200_000) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table({"store": pa.array([f"store-{k:02d}" for k in rng.integers(0, 20, rows)]),
                     "day": np.sort(rng.integers(0, 365, rows)).astype(np.int32)})


def test_a_ticket_carries_the_codec_only_when_one_is_asked_for():
    plain = Ticket("d", 1, (0, 0))
    assert b"compression" not in plain.encode()
    asked = Ticket("d", 1, (0, 0), compression="zstd")
    assert Ticket.decode(asked.encode()) == asked
    with pytest.raises(RequestRejected) as refused:
        Ticket.decode(b'{"dataset": "d", "version": 1, "part": [0, 0], "compression": "gzip"}')
    assert refused.value.field == "ticket.compression" and "zstd, lz4" in str(refused.value)


def test_a_node_compresses_only_data_that_shrinks_and_streams_worth_it():
    assert write_options(repetitive(), "zstd").compression == "zstd"
    assert write_options(repetitive(), None) is None
    noise = pa.table({"f": np.random.default_rng(0).random(200_000)})
    assert write_options(noise, "zstd") is None and write_options(noise, "lz4") is None
    assert write_options(repetitive(100), "zstd") is None  # too small to gain anything
    assert write_options(pa.table({}), "zstd") is None


def test_the_reader_asks_only_remote_nodes_whose_link_measured_slow():
    rates = LinkRates()
    here = frozenset({"10.0.0.1"})
    far = ("grpc://10.0.0.2:1", "10.0.0.2")
    for mode in ("auto", "zstd", "lz4", "off"):
        assert rates.codec_for(mode, "grpc://127.0.0.3:1", "127.0.0.3", here) is None  # loopback: a memory copy
        assert rates.codec_for(mode, "grpc://10.0.0.1:1", "10.0.0.1", here) is None  # this host
    assert rates.codec_for("zstd", *far, here) == "zstd" and rates.codec_for("off", *far, here) is None
    assert rates.codec_for("auto", *far, here) is None  # not measured yet
    rates.finished(far[0], 1 << 30, 1.0, None)  # 1 GiB/s: a fast link
    assert rates.codec_for("auto", *far, here) is None
    rates.finished(far[0], 64 << 20, 1.0, "zstd")  # compressed streams measure the codec, not the link
    rates.finished(far[0], 1 << 20, 1.0, None)  # too small to measure
    assert rates.rate(far[0]) == 1 << 30
    rates.finished(far[0], 100 << 20, 1.0, None, sharing=3)  # three streams shared the link: 300 MiB/s
    assert rates.rate(far[0]) == 300 << 20
    rates.finished(far[0], 50 << 20, 1.0, None, sharing=1)  # 50 MiB/s: slow
    asked = [rates.codec_for("auto", *far, here) for _ in range(2 * PROBE_EVERY)]
    # compressed, but every PROBE_EVERY-th stream goes plain to measure the link again
    assert asked.count(None) == 2 and asked[PROBE_EVERY - 1] is None and set(asked) == {"zstd", None}
    assert rates.started(far[0]) == 1 and rates.started(far[0]) == 2


def test_a_plain_flight_reader_that_asks_for_zstd_reads_the_same_rows(cluster):
    table = repetitive()
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.put("wire-zstd", table, nodes=["127.0.0.3"])
        ref = ds.__partitioned__["partitions"][(0, 0)]["data"]
        uri = ref.replicas[0][0]
        before = client.stats(uri)["streams_compressed"]
        reader = flight.connect(uri).do_get(flight.Ticket(Ticket("wire-zstd", ds.version, (0, 0), compression="zstd").encode()))
        assert reader.read_all().equals(table)
        assert client.stats(uri)["streams_compressed"] == before + 1
        # the client's own reads over loopback never ask
        assert client.open("wire-zstd").to_arrow().equals(table)
        assert client.stats(uri)["streams_compressed"] == before + 1


def test_a_client_refuses_an_unknown_compression_mode(cluster):
    with pytest.raises(ValueError, match="auto, off, zstd, lz4"):
        fp.connect(cluster.uri, compression="brotli")
    assert compression.check_mode(None) == "off"
