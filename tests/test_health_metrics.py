"""grpc.health.v1 and Prometheus endpoints of a real daemon."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import numpy as np
import pyarrow as pa

import flightpart as fp
from flightpart.tools.cluster import Daemon


def health(address: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightpart", "health", address, "--timeout", "3"], capture_output=True, text=True, timeout=60)


def metric(url: str, name: str) -> float:
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics:\n{body}")


def test_health_follows_the_daemon_and_metrics_count_what_is_served(tmp_path):
    data = tmp_path / "data"
    node = Daemon(["serve", "--host", "127.0.0.81", "--port", "0", "--data-dir", str(data), "--state-dir", str(tmp_path / "s"),
                   "--health-port", "0", "--metrics-port", "0"])
    try:
        address, metrics_url = node.uris["node-health"], node.uris["node-metrics"]
        first = health(address)
        assert (first.returncode, first.stdout.strip()) == (0, "SERVING")
        assert metric(metrics_url, "flightpart_sent_bytes_total") == 0
        with fp.connect(node.uris["catalog"], host="127.0.0.99") as client:
            table = pa.table({"a": np.arange(50_000)})
            client.put("metered", table)
            assert client.open("metered").to_arrow().equals(table)
        assert metric(metrics_url, "flightpart_sent_bytes_total") == table.nbytes
        assert metric(metrics_url, "flightpart_held_partitions") == 1
        assert metric(metrics_url, "flightpart_open_streams") == 0
        data.rename(tmp_path / "gone")  # the node can no longer store anything
        deadline = time.monotonic() + 10
        while health(address).stdout.strip() != "NOT_SERVING" and time.monotonic() < deadline:
            time.sleep(0.2)
        down = health(address)
        assert (down.returncode, down.stdout.strip()) == (1, "NOT_SERVING")
    finally:
        node.stop()
    gone = health(address)
    assert gone.returncode == 2 and "UNREACHABLE" in gone.stderr
