"""grpc.health.v1 and Prometheus endpoints of a real daemon."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart import tokens
from flightpart.cli.waiting import wait_for
from flightpart.local.cluster import Daemon


def health(address: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightpart", "health", address, "--timeout", "3"],
                          capture_output=True, text=True, timeout=60)


def metric(url: str, name: str) -> float:
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith(name if name.endswith('"') else name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics:\n{body}")


def test_health_follows_the_daemon_and_metrics_count_what_is_served(tmp_path):
    data = tmp_path / "data"
    node = Daemon(["serve", "--host", "127.0.0.81", "--port", "0", "--data-dir", str(data), "--state-dir",
                   str(tmp_path / "s"), "--health-port", "0", "--metrics-port", "0"])
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


def json_lines(daemon: Daemon) -> list[dict]:
    out = []
    for line in daemon.log().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def healthz_reply(url: str) -> tuple[int, dict]:
    """The HTTP status and JSON body of a ``/healthz``, 503 included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


@pytest.mark.slow  # waits out a stopped catalog's silence (5 s at least): in the slow tier, which CI runs
def test_logs_metrics_and_health_say_what_happened(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(tokens.new_secret() + "\n")
    secret.chmod(0o600)
    common = ["--secret-file", str(secret), "--log-level", "info", "--log-format", "json"]
    catalog = Daemon([*common[2:], "catalog", "--host", "127.0.0.82", "--port", "0", "--state-dir", str(tmp_path / "s"),
                      "--metrics-port", "0", *common[:2]])
    node = Daemon([*common[2:], "serve", "--host", "127.0.0.83", "--port", "0", "--data-dir", str(tmp_path / "d"),
                   "--catalog", catalog.uris["catalog"], "--heartbeat", "0.3", "--metrics-port", "0", "--health-port",
                   "0", *common[:2]])
    try:
        owner = secret.read_text().strip()
        table = pa.table({"a": np.arange(100_000)})
        with fp.connect(catalog.uris["catalog"], token=owner, host="127.0.0.99") as client:
            client.put("logged", table)
            assert client.open("logged").to_arrow().equals(table)
            client.drop("logged")
        with pytest.raises(fp.Unauthenticated), fp.connect(catalog.uris["catalog"],
                                                           token="fp1:reader:eve:0:forged") as client:
            client.list()

        def event(daemon: Daemon, name: str) -> dict:
            found = [e for e in json_lines(daemon) if e.get("event") == name]
            assert len(found) == 1, (name, daemon.log()[-3000:])
            return found[0]

        put, get = event(node, "put"), event(node, "get")
        assert (put["dataset"], put["version"], put["rows"]) == ("logged", 1, 100_000)
        assert table.nbytes <= put["bytes"] < table.nbytes + 4096  # the stored file: the data and its IPC framing
        assert (get["dataset"], get["bytes"], get["level"]) == ("logged", table.nbytes, "INFO")
        assert get["seconds"] > 0 and get["peer"].startswith("ipv4:127.0.0.1:")
        assert event(catalog, "commit")["rows"] == 100_000 and event(catalog, "drop")["dataset"] == "logged"
        assert "E0000" not in catalog.log() + node.log()  # gRPC's own logging stays quiet

        node_metrics, catalog_metrics = node.uris["node-metrics"], catalog.uris["catalog-metrics"]
        assert metric(node_metrics, "flightpart_sent_bytes_total") == table.nbytes
        assert metric(node_metrics, 'flightpart_rpc_duration_seconds_count{role="node",rpc="do_get"') == 1
        assert metric(catalog_metrics, 'flightpart_refusals_total{reason="unauthenticated"') == 1
        assert metric(catalog_metrics, "flightpart_build_info") == 1
        assert metric(catalog_metrics, 'flightpart_nodes{role="catalog",state="alive"') == 1
        body = urllib.request.urlopen(node_metrics, timeout=10).read().decode()
        assert "process_cpu_seconds_total" in body and "process_resident_memory_bytes" in body
        healthz = node_metrics.replace("/metrics", "/healthz")
        assert healthz_reply(healthz) == (200, {"status": "SERVING", "role": "node", "problems": []})

        catalog.stop()  # the node keeps serving what it holds, but reports that it cannot reach its catalog
        deadline = time.monotonic() + 15
        while health(node.uris["node-health"]).stdout.strip() != "NOT_SERVING" and time.monotonic() < deadline:
            time.sleep(0.3)
        assert health(node.uris["node-health"]).returncode == 1
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(healthz, timeout=10)
        reply = json.loads(refused.value.read())
        assert refused.value.code == 503 and reply["status"] == "NOT_SERVING"
        # not at the first lost heartbeat: only after the catalog was silent for three of them, at least 5 s
        silent = [re.fullmatch(r"the catalog grpc://\S+ has not (answered|registered this node) for (\d+) s", problem)
                  for problem in reply["problems"]]
        assert len(silent) == 1 and silent[0] and int(silent[0][2]) >= 5, reply
        assert metric(node_metrics, "flightpart_healthy") == 0
    finally:
        node.stop()
        catalog.stop()


def test_a_node_the_catalog_refuses_is_not_serving_at_once_and_says_why(tmp_path):
    """A copy of a live node's data directory, started while the catalog is away, claims that node's id: when the
    catalog is back it accepts one of the two and refuses the other, whose health says so from the refusal on (not
    after the silence that a lost heartbeat is allowed)."""
    state = tmp_path / "s"
    catalog = Daemon(["catalog", "--host", "127.0.0.86", "--port", "0", "--state-dir", str(state)])
    address = catalog.uris["catalog"]
    nodes: list[Daemon] = []
    try:
        nodes.append(Daemon(["serve", "--host", "127.0.0.87", "--port", "0", "--data-dir", str(tmp_path / "a"),
                             "--catalog", address, "--heartbeat", "0.3", "--metrics-port", "0"]))
        wait_for(address, min_nodes=1)
        catalog.stop()
        shutil.copytree(tmp_path / "a", tmp_path / "b")
        nodes.append(Daemon(["serve", "--host", "127.0.0.88", "--port", "0", "--data-dir", str(tmp_path / "b"),
                             "--catalog", address, "--heartbeat", "0.3", "--metrics-port", "0"]))
        catalog = Daemon(["catalog", "--host", "127.0.0.86", "--port", address.rsplit(":", 1)[1], "--state-dir",
                          str(state)])
        healthz = [node.uris["node-metrics"].replace("/metrics", "/healthz") for node in nodes]
        deadline = time.monotonic() + 30
        while not any("refused" in str(healthz_reply(url)) for url in healthz) and time.monotonic() < deadline:
            time.sleep(0.2)
        replies = [healthz_reply(url) for url in healthz]
        refused = [k for k, (_, body) in enumerate(replies) if any("refused this node" in p for p in body["problems"])]
        assert len(refused) == 1, replies
        code, body = replies[refused[0]]
        assert code == 503 and len(body["problems"]) == 1 and "already served by" in body["problems"][0], replies
        accepted = nodes[1 - refused[0]]
        with fp.connect(address) as client:
            assert [n.uri for n in client.nodes()] == [accepted.uris["node"]]
    finally:
        for daemon in (*nodes, catalog):
            daemon.stop()


@pytest.mark.slow  # a fault test bound by a deadline: in the slow tier, which CI runs
def test_a_frozen_catalog_makes_its_node_not_serving_until_it_thaws(tmp_path):
    """SIGSTOP, not a clean stop: the catalog's port still accepts connections, it just never answers."""
    catalog = Daemon(["catalog", "--host", "127.0.0.84", "--port", "0", "--state-dir", str(tmp_path / "s")])
    node = Daemon(["serve", "--host", "127.0.0.85", "--port", "0", "--data-dir", str(tmp_path / "d"), "--catalog",
                   catalog.uris["catalog"], "--heartbeat", "0.3", "--health-port", "0", "--metrics-port", "0"])
    healthz = node.uris["node-metrics"].replace("/metrics", "/healthz")

    def until(code: int) -> tuple[int, dict]:
        deadline = time.monotonic() + 30
        while (seen := healthz_reply(healthz))[0] != code and time.monotonic() < deadline:
            time.sleep(0.3)
        return seen

    try:
        assert until(200)[0] == 200
        os.kill(catalog.proc.pid, signal.SIGSTOP)
        try:
            code, reply = until(503)
            assert code == 503 and any("catalog" in p for p in reply["problems"]), reply
            assert health(node.uris["node-health"]).stdout.strip() == "NOT_SERVING"
        finally:
            os.kill(catalog.proc.pid, signal.SIGCONT)
        assert until(200) == (200, {"status": "SERVING", "role": "node", "problems": []})  # registered again by itself
    finally:
        node.stop()
        catalog.stop()


def test_the_http_endpoint_survives_what_is_not_a_scrape(tmp_path):
    """Unknown paths, other methods and bytes that are not HTTP get an answer or a closed socket; the endpoint stays
    up."""
    catalog = Daemon(["catalog", "--host", "127.0.0.86", "--port", "0", "--state-dir", str(tmp_path / "s"),
                      "--metrics-port", "0"])
    try:
        base = catalog.uris["catalog-metrics"].removesuffix("/metrics")
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(base + "/../../etc/passwd", timeout=10)
        assert missing.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as posted:
            urllib.request.urlopen(urllib.request.Request(base + "/metrics", data=b"x" * 100_000, method="POST"),
                                   timeout=10)
        assert posted.value.code == 501
        host, port = base.removeprefix("http://").rsplit(":", 1)
        for garbage in (b"\x00\xff" * 5000 + b"\r\n\r\n", b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", b"GET"):
            with socket.create_connection((host, int(port)), timeout=10) as raw:
                raw.sendall(garbage)
                raw.shutdown(socket.SHUT_WR)
                raw.recv(65536)
        assert json.loads(urllib.request.urlopen(base + "/healthz", timeout=10).read())["status"] == "SERVING"
        assert catalog.proc.poll() is None
    finally:
        catalog.stop()
