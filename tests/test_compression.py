"""The wire: compression (who asks for it, when a node grants it, that any Arrow reader reads the result),
a partition read as parallel row ranges, and the allocator switch.

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
from flightpart.io.compression import PROBE_EVERY, SLOW_LINK, LinkRates, write_options
from flightpart.wire import Ticket

PROCESS_CLUSTER = True  # tests here freeze the shared cluster's nodes (SIGSTOP)


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
    now = [0.0]
    rates = LinkRates(clock=lambda: now[0])
    here = frozenset({"10.0.0.1"})
    far, other = ("grpc://10.0.0.2:1", "10.0.0.2"), ("grpc://10.0.0.3:1", "10.0.0.3")

    def busy(streams: list[tuple[str, int, str | None]], seconds: float) -> None:
        """Streams in flight together for ``seconds``: (uri, bytes, codec)."""
        for uri, _n, _codec in streams:
            rates.started(uri)
        now[0] += seconds
        for uri, n, codec in streams:
            rates.finished(uri, n, codec)

    for mode in ("auto", "zstd", "lz4", "off"):
        assert rates.codec_for(mode, "grpc://127.0.0.3:1", "127.0.0.3", here) is None  # loopback: a memory copy
        assert rates.codec_for(mode, "grpc://10.0.0.1:1", "10.0.0.1", here) is None  # this host
    assert rates.codec_for("zstd", *far, here) == "zstd" and rates.codec_for("off", *far, here) is None
    assert rates.codec_for("auto", *far, here) is None  # not measured yet
    busy([(far[0], 1 << 30, None)], 1.0)  # 1 GiB/s: a fast link
    assert rates.codec_for("auto", *far, here) is None and rates.rate(far[0]) == 1 << 30
    busy([(far[0], 64 << 20, "zstd")], 1.0)  # a compressed stream measures the codec, not the link
    busy([(far[0], 1 << 20, None)], 1.0)  # too little to measure
    assert rates.rate(far[0]) == 1 << 30
    # four streams at once from one node, 100 MiB each in a second: the link carried 400 MiB/s, not 100
    busy([(far[0], 100 << 20, None)] * 4, 1.0)
    assert rates.rate(far[0]) == 400 << 20 and rates.codec_for("auto", *far, here) is None
    # two nodes at 150 MiB/s each over this process's link: each is slow, the process's link is not (300 MiB/s)
    busy([(far[0], 150 << 20, None), (other[0], 150 << 20, None)], 1.0)
    assert rates.rate(far[0]) < SLOW_LINK < rates.rate(rates.ALL) == 300 << 20
    assert rates.codec_for("auto", *far, here) is None
    busy([(far[0], 50 << 20, None)], 1.0)  # 50 MiB/s, alone: both slow
    asked = [rates.codec_for("auto", *far, here) for _ in range(2 * PROBE_EVERY)]
    # compressed, but every PROBE_EVERY-th stream goes plain to measure the link again
    assert asked.count(None) == 2 and asked[PROBE_EVERY - 1] is None and set(asked) == {"zstd", None}
    assert rates.codec_for("auto", "grpc://10.0.0.4:1", "10.0.0.4", here) is None  # a node not measured yet
    rates.finished("grpc://never-started:1", 1 << 30, None)  # an end without a start changes nothing
    assert rates.rate("grpc://never-started:1") is None


def test_a_plain_flight_reader_that_asks_for_zstd_reads_the_same_rows(cluster):
    table = repetitive()
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.put("wire-zstd", table, nodes=["127.0.0.3"])
        ref = ds.__partitioned__["partitions"][(0, 0)]["data"]
        uri = ref.replicas[0][0]
        before = client.stats(uri).values["streams_compressed"]
        reader = flight.connect(uri).do_get(flight.Ticket(Ticket("wire-zstd", ds.version, (0, 0),
                                                                 compression="zstd").encode()))
        assert reader.read_all().equals(table)
        assert client.stats(uri).values["streams_compressed"] == before + 1
        # the client's own reads over loopback never ask
        assert client.open("wire-zstd").to_arrow().equals(table)
        assert client.stats(uri).values["streams_compressed"] == before + 1


def test_a_client_refuses_an_unknown_compression_mode(cluster):
    with pytest.raises(ValueError, match="auto, off, zstd, lz4"):
        fp.connect(cluster.uri, compression="brotli")
    assert compression.check_mode(None) == "off"


SWITCH = """
import json, sys
import flightpart as fp
from flightpart.io.allocator import keep_freed_memory, tuning_state
with fp.connect(sys.argv[1], host="127.0.0.9") as client:
    ds = client.open("switch")
    if sys.argv[2] == "beside-dask":  # its nanny sets MALLOC_TRIM_THRESHOLD_ in this process's os.environ
        import distributed
        cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None, silence_logs=50)
        assert "MALLOC_TRIM_THRESHOLD_" in __import__("os").environ
    if sys.argv[2] == "aggregate-then-stream":  # a few rows of partial sums decide nothing
        assert ds.aggregate([("f", "sum")]).num_rows == 1
        rows = sum(b.num_rows for b in ds.to_batches(window=1 << 20))
    elif sys.argv[2] == "stream":  # a bounded stream first, then a whole read: the first read decides
        rows = sum(b.num_rows for b in ds.to_batches(window=1 << 20))
        assert ds.to_arrow().num_rows == rows
    else:
        rows = ds.to_arrow().num_rows
    if sys.argv[2] == "beside-dask":
        cluster.close()
print(json.dumps({"tuned": keep_freed_memory(), "why": tuning_state(), "rows": rows}))
"""


def _cap_data() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_DATA, (64 << 30, resource.RLIM_INFINITY))  # far above what it uses


@pytest.mark.parametrize("setting, read, extra, tuned, why", [
    (None, "whole", {}, True, "tuned"),
    ("auto", "whole", {}, True, "tuned"),
    ("off", "whole", {}, False, "FLIGHTPART_MALLOC_TUNING=off"),
    ("on", "stream", {}, True, "tuned"),
    (None, "stream", {}, False, "the first read streams under a window"),
    (None, "whole", {"MALLOC_TRIM_THRESHOLD_": "65536"}, False,
     "the allocator is configured by MALLOC_TRIM_THRESHOLD_"),
    (None, "whole", {"cap": True}, False, "RLIMIT_DATA is set"),
    (None, "beside-dask", {}, True, "tuned"),  # glibc read its settings at start: a LocalCluster's don't count
    ("disabled", "whole", {}, False, "FLIGHTPART_MALLOC_TUNING=disabled"),
    # not a known value: off, with a warning
    (None, "aggregate-then-stream", {}, False, "the first read streams under a window"),
])
def test_freed_memory_is_kept_by_whole_readers_and_never_where_it_could_hurt(cluster, setting, read, extra, tuned, why):
    """Kept memory is memory a process does not give back: by default a process that reads whole partitions keeps
    it (its next read takes no page faults), but not one that first streams under a window (whose memory must
    stay flat), one whose memory is capped, or one whose allocator was set up by glibc's own variables (as Dask's
    nanny does for its workers). Reads are the same either way."""
    import json
    import os
    import subprocess
    import sys

    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        if "switch" not in {d.name for d in client.list()}:
            client.put("switch", pa.table({"f": np.arange(100_000)}), nodes=["127.0.0.3"])
    from flightpart.io.allocator import memory_cap

    if tuned and setting != "on" and memory_cap() is not None:
        pytest.skip(f"this test process's memory is capped ({memory_cap()}): its children would not tune")
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLIGHTPART_MALLOC_TUNING", "GLIBC_TUNABLES") and not k.startswith("MALLOC_")}
    if setting is not None:
        env["FLIGHTPART_MALLOC_TUNING"] = setting
    env.update({k: v for k, v in extra.items() if k != "cap"})
    done = subprocess.run([sys.executable, "-c", SWITCH, cluster.uri, read], capture_output=True, text=True, env=env,
                          timeout=120, preexec_fn=_cap_data if extra.get("cap") else None)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"tuned": tuned, "why": why, "rows": 100_000}


def test_a_reader_in_a_cgroup_under_a_capped_one_keeps_no_memory(cluster):
    """A memory limit set above the reader's own cgroup (a container's, a systemd slice's) caps it too."""
    import json
    import os
    import subprocess
    import sys

    from helpers import MemoryCap

    cap = MemoryCap(16 << 30)  # far above what it uses: only its presence matters
    if cap.path is None:
        pytest.skip(cap.unavailable)
    child = cap.path / "reader"
    try:
        child.mkdir()
        with fp.connect(cluster.uri, host="127.0.0.9") as client:
            if "switch" not in {d.name for d in client.list()}:
                client.put("switch", pa.table({"f": np.arange(100_000)}), nodes=["127.0.0.3"])
        env = {k: v for k, v in os.environ.items() if k != "FLIGHTPART_MALLOC_TUNING" and not k.startswith("MALLOC_")}
        done = subprocess.run([sys.executable, "-c", SWITCH, cluster.uri, "whole"], capture_output=True, text=True,
                              env=env, timeout=120,
                              preexec_fn=lambda: (child / "cgroup.procs").write_text(str(os.getpid())))
        assert done.returncode == 0, done.stderr[-2000:]
        result = json.loads(done.stdout)
        assert result["tuned"] is False and result["why"].startswith("a cgroup caps its memory"), result
        assert str(cap.path) in result["why"]  # the parent's limit, not the reader's own cgroup
    finally:
        if child.exists():
            child.rmdir()
        cap.remove()


def test_a_partition_read_as_row_ranges_from_both_replicas_equals_one_stream(cluster, monkeypatch):
    import os
    import signal

    import flightpart.client.dataset as dataset_module

    monkeypatch.setattr(dataset_module, "SPLIT_BYTES", 1 << 20)  # a 16 MB partition splits like a 512 MB one would
    rng = np.random.default_rng(3)
    table = pa.table({"k": np.arange(1_000_000), "f": rng.random(1_000_000)})
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        client.put("split", table, tiling=(1, 1), nodes=["127.0.0.3", "127.0.0.4"], replicas=2)
        holders = {n.ip: n for n in client.nodes() if n.ip in ("127.0.0.3", "127.0.0.4")}
        before = {ip: client.stats(n.uri).values for ip, n in holders.items()}
        with fp.connect(cluster.uri, host="127.0.0.9", streams_per_partition=4) as reader:
            assert reader.open("split").to_arrow().equals(table)
        after = {ip: client.stats(n.uri).values for ip, n in holders.items()}
        # four row ranges, each first asked of the next replica: two streams from each holder, every row once
        assert {ip: after[ip]["partitions_served"] - before[ip]["partitions_served"] for ip in holders} == \
            {"127.0.0.3": 2, "127.0.0.4": 2}
        assert sum(after[ip]["rows_sent"] - before[ip]["rows_sent"] for ip in holders) == 1_000_000
        # a frozen holder: the ranges it was asked for first move to the other replica, nothing is lost
        frozen = holders["127.0.0.4"].pid
        os.kill(frozen, signal.SIGSTOP)
        try:
            with fp.connect(cluster.uri, host="127.0.0.9", streams_per_partition=4, idle_timeout=0.5) as reader:
                assert reader.open("split").to_arrow().equals(table)
        finally:
            os.kill(frozen, signal.SIGCONT)
    for wrong in (0, 9, 2.0, True):
        with pytest.raises(ValueError, match="streams_per_partition"):
            fp.connect(cluster.uri, streams_per_partition=wrong)
