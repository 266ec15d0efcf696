"""Heartbeats in datagrams, attacked: real daemons, a lying sender on the wire, a catalog whose UDP port is taken."""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.request

import pytest

import flightpart as fp
from flightpart import tokens
from flightpart.cli.waiting import wait_for
from flightpart.local.cluster import Daemon
from flightpart.server.auth import wall_clock
from flightpart.server.beats import MAGIC, BeatSender, pack, unpack
from flightpart.tokens import role_token, split_token
from flightpart.wire import Heartbeat

SECRET = tokens.new_secret()


def free_port(host: str) -> str:
    """A port free on ``host`` for TCP and UDP both (with --port 0 the catalog's TCP port may be some process's UDP
    port, and then it rightly listens for no datagrams: these tests need it to)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind((host, 0))
            port = tcp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind((host, port))
                except OSError:
                    continue
        return str(port)
    raise RuntimeError(f"no port free for TCP and UDP on {host}")


def counts(client: fp.Client, uri: str) -> dict:
    return {k: v for k, v in client.stats(uri).values.items() if "udp" in k or "datagram" in k}


def until(check, timeout: float = 30.0, pause: float = 0.2):
    deadline = time.monotonic() + timeout
    while not (seen := check()) and time.monotonic() < deadline:
        time.sleep(pause)
    return seen


def alive(client: fp.Client) -> dict[str, bool]:
    return {n.node_id: n.alive for n in client.nodes()}


def decoded(reply: bytes | None) -> dict:
    """The body of the catalog's answer (it must have answered)."""
    assert reply is not None, "no answer"
    return unpack(reply)[2]


def answer(sock: socket.socket, datagram: bytes, timeout: float = 15.0) -> bytes | None:
    """What the catalog answers a datagram (None: nothing in ``timeout``)."""
    sock.send(datagram)
    sock.settimeout(timeout)
    try:
        return sock.recv(4096)
    except TimeoutError:
        return None


@pytest.mark.slow  # restarts the catalog and waits out --dead-after: in the slow tier, which CI runs
def test_beats_go_in_signed_datagrams_and_forged_replayed_or_borrowed_ones_keep_no_node_alive(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    catalog = Daemon(["catalog", "--host", "127.0.0.91", "--port", free_port("127.0.0.91"), "--state-dir",
                      str(tmp_path / "s"), "--dead-after", "3", "--secret-file", str(secret_file), "--metrics-port",
                      "0"])
    address = catalog.uris["catalog"]
    node = Daemon(["serve", "--host", "127.0.0.92", "--port", "0", "--data-dir", str(tmp_path / "d"), "--catalog",
                   address, "--heartbeat", "0.3", "--secret-file", str(secret_file)])
    try:
        with fp.connect(address, token=SECRET, host="127.0.0.99") as client:
            wait_for(address, min_nodes=1, access=client.pool.access)
            node_id = next(iter(alive(client)))
            seen = until(lambda: counts(client, address)["udp_heartbeats_taken"] >= 5 and counts(client, address))
            # the first datagram is declined: this catalog takes a node's datagrams after a beat of it over Flight
            assert seen and seen["udp_heartbeats_taken"] >= 5 and seen["udp_heartbeats_declined"] >= 1, seen

            # a sender holding the node's own token is taken; its very datagram sent again is not
            secret = SECRET.encode()
            own = BeatSender(address, role_token(secret, "node", node_id), timeout=2.0)
            beat = Heartbeat(node_id, 1 << 30, False, int(wall_clock() * 1000) + 2_000)  # past the node's own clock
            assert own.beat(beat) is True
            assert own.beat(beat) is False  # replayed: not taken, the node would send it over Flight
            own.close()

            host, port = address.split("//")[1].rsplit(":", 1)
            wire = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            wire.connect((host, int(port)))
            later = {"node_id": node_id, "free_bytes": 1, "low_space": False,
                     "clock_ms": int(wall_clock() * 1000) + 4_000, "nonce": 12345}
            body, signature = split_token(role_token(secret, "node", node_id))
            other_body, other_signature = split_token(role_token(secret, "node", "somebody-else"))
            expired_body, expired_signature = split_token(role_token(secret, "node", node_id, expiry=1_000_000_000))
            lies = {
                "unsigned": pack(later, None),
                "signed with a wrong key": pack({**later, "token": body}, b"\x00" * 64),
                "another node's token": pack({**later, "token": other_body}, other_signature),
                "an expired token": pack({**later, "token": expired_body}, expired_signature),
                "a reader's token": pack({**later, "token": split_token(role_token(secret, "reader", node_id))[0]},
                                         split_token(role_token(secret, "reader", node_id))[1]),
                "not a beat": MAGIC + b"\x00" * 32 + b"[1, 2]",
                "garbage": os.urandom(300),
            }
            before = counts(client, address)
            for what, datagram in lies.items():
                assert answer(wire, datagram, timeout=0.5) is None, what  # no answer: nothing to learn, nothing taken
            # the listener counts each lie once it has read it (a loaded machine may read the last ones later)
            after = until(lambda: (seen := counts(client, address))["udp_datagrams_ignored"]
                          - before["udp_datagrams_ignored"] >= len(lies) and seen) or counts(client, address)
            assert after["udp_datagrams_ignored"] - before["udp_datagrams_ignored"] == len(lies), (before, after)

            metrics = urllib.request.urlopen(catalog.uris["catalog-metrics"], timeout=10).read().decode()
            taken = [line for line in metrics.splitlines() if line.startswith("flightpart_udp_heartbeats_taken_total")]
            assert len(taken) == 1 and float(taken[0].rsplit(" ", 1)[1]) >= 5, taken

            # the node dies; the datagrams it was seen to send, replayed after a restart of the catalog, are not taken
            node.proc.send_signal(signal.SIGKILL)
            node.proc.wait(timeout=10)
            recorded = pack({**later, "clock_ms": later["clock_ms"] + 1, "token": body}, signature)
            assert decoded(answer(wire, recorded))["taken"] is True  # once: the test holds the secret
            catalog.stop()
            catalog = Daemon(["catalog", "--host", "127.0.0.91", "--port", port, "--state-dir", str(tmp_path / "s"),
                              "--dead-after", "3", "--secret-file", str(secret_file)])
        with fp.connect(address, token=SECRET, host="127.0.0.99") as client:
            # the restarted catalog takes a node's datagrams only after a beat of it over Flight: none came
            assert decoded(answer(wire, recorded))["taken"] is False
            fresh = pack({**later, "clock_ms": later["clock_ms"] + 2, "token": body}, signature)
            assert decoded(answer(wire, fresh))["taken"] is False
            deadline = time.monotonic() + 5  # past --dead-after from the restart, when the catalog counts silence from
            tick = 0
            while time.monotonic() < deadline:  # replayed and forged beats all along: the node is declared dead
                tick += 1
                for datagram in (recorded, fresh,
                                 pack({**later, "clock_ms": later["clock_ms"] + 2 + tick, "token": body},
                                      b"\x01" * 64),
                                 pack({**later, "clock_ms": later["clock_ms"] + 2 + tick}, None)):
                    wire.send(datagram)
                time.sleep(0.05)
            assert alive(client)[node_id] is False
            assert counts(client, address)["udp_heartbeats_taken"] == 0
            wire.close()
    finally:
        node.stop()
        catalog.stop()


@pytest.mark.slow  # waits out --dead-after and three unanswered beats: in the slow tier, which CI runs
def test_a_catalog_that_cannot_listen_for_datagrams_still_hears_its_nodes_over_flight(tmp_path):
    """Another program holds the catalog's port for UDP (and answers nothing): the catalog says so and takes beats
    over Flight; the node, its datagrams unanswered, says so and stays alive and SERVING."""
    squatter = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    squatter.bind(("127.0.0.93", 0))
    port = squatter.getsockname()[1]
    catalog = node = None
    try:
        catalog = Daemon(["catalog", "--host", "127.0.0.93", "--port", str(port), "--state-dir", str(tmp_path / "s"),
                          "--dead-after", "3"])
        address = catalog.uris["catalog"]
        node = Daemon(["--log-level", "info", "serve", "--host", "127.0.0.94", "--port", "0", "--data-dir",
                       str(tmp_path / "d"), "--catalog", address, "--heartbeat", "0.3", "--health-port", "0",
                       "--metrics-port", "0"])
        with fp.connect(address) as client:
            wait_for(address, min_nodes=1)
            assert until(lambda: "three times running" in node.log(), timeout=30), node.log()[-3000:]
            time.sleep(4)  # past --dead-after: only Flight's beats kept it alive
            assert list(alive(client).values()) == [True]
            assert counts(client, address) == {}  # no listener, nothing counted
        assert "heartbeats come over Flight only" in catalog.log()
        squatter.settimeout(1)
        assert squatter.recv(4096).startswith(MAGIC)  # the node did try
        healthz = node.uris["node-metrics"].replace("/metrics", "/healthz")
        with urllib.request.urlopen(healthz, timeout=10) as reply:
            assert reply.status == 200
    finally:
        for daemon in (node, catalog):
            if daemon is not None:
                daemon.stop()
        squatter.close()


@pytest.mark.slow  # waits out --dead-after: in the slow tier, which CI runs
@pytest.mark.parametrize("side", ["node", "catalog"])
def test_datagrams_turned_off_on_either_side_leave_heartbeats_to_flight(tmp_path, side):
    catalog_env = {"FLIGHTPART_UDP_HEARTBEATS": "off"} if side == "catalog" else {}
    node_env = {"FLIGHTPART_UDP_HEARTBEATS": "off"} if side == "node" else {}
    catalog = Daemon(["catalog", "--host", "127.0.0.95", "--port", "0", "--state-dir", str(tmp_path / "s"),
                      "--dead-after", "3"], env=catalog_env)
    address = catalog.uris["catalog"]
    node = Daemon(["serve", "--host", "127.0.0.96", "--port", "0", "--data-dir", str(tmp_path / "d"), "--catalog",
                   address, "--heartbeat", "0.3"], env=node_env)
    try:
        with fp.connect(address) as client:
            wait_for(address, min_nodes=1)
            time.sleep(4)  # past --dead-after
            assert list(alive(client).values()) == [True]
            assert counts(client, address).get("udp_heartbeats_taken", 0) == 0
    finally:
        node.stop()
        catalog.stop()


@pytest.mark.slow  # a fault test bound by deadlines: in the slow tier, which CI runs
@pytest.mark.parametrize("transport", ["datagrams", "flight"])
def test_a_node_that_died_while_its_catalog_was_frozen_is_not_brought_back_by_its_queued_beats(tmp_path, transport):
    """SIGSTOP the catalog: both nodes' beats wait in its UDP socket or gRPC's queue. Kill one node, thaw the catalog
    after --dead-after: the dead node's queued beats say it was alive seconds ago, not now, and must not revive it
    (they did, over Flight as over UDP, before beats counted from when they were sent)."""
    env = {"FLIGHTPART_UDP_HEARTBEATS": "off"} if transport == "flight" else {}
    catalog = Daemon(["catalog", "--host", "127.0.0.97", "--port", free_port("127.0.0.97"), "--state-dir",
                      str(tmp_path / "s"), "--dead-after", "3"], env=env)
    address = catalog.uris["catalog"]
    nodes = [Daemon(["serve", "--host", f"127.0.0.{98 + k}", "--port", "0", "--data-dir", str(tmp_path / f"d{k}"),
                     "--catalog", address, "--heartbeat", "0.3"], env=env) for k in range(2)]
    try:
        with fp.connect(address) as client:
            wait_for(address, min_nodes=2)
            ids = {n.uri: n.node_id for n in client.nodes()}
            doomed, survivor = ids[nodes[0].uris["node"]], ids[nodes[1].uris["node"]]
            assert until(lambda: counts(client, address).get("udp_heartbeats_taken", 10) >= 10)
            os.kill(catalog.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(1.5)  # beats of both nodes queue up in the frozen catalog's socket
                nodes[0].proc.send_signal(signal.SIGKILL)
                nodes[0].proc.wait(timeout=10)
                time.sleep(5)  # past --dead-after, frozen
            finally:
                os.kill(catalog.proc.pid, signal.SIGCONT)
            seen = []
            deadline = time.monotonic() + 4  # longer than --dead-after: a revived node would show here
            while time.monotonic() < deadline:
                seen.append(alive(client).get(doomed))
                time.sleep(0.1)
            assert seen and not any(seen), seen
            assert client.stats(address).values["heartbeats_late"] >= 1
            assert until(lambda: alive(client).get(survivor))  # the live node is heard again (it never stopped)
    finally:
        for daemon in (*nodes, catalog):
            daemon.stop()
