"""The datagram heartbeat's rules, on a real socket: what a catalog takes, declines and leaves unanswered."""

from __future__ import annotations

import socket
import time

from flightpart.server.beats import BeatListener, BeatSender, catalog_address, pack, unpack
from flightpart.tokens import new_secret, role_token
from flightpart.wire import Heartbeat

SECRET = new_secret().encode()


def listener(take, secret=SECRET, known=("n1",)) -> BeatListener:
    return BeatListener("127.0.0.1", 0, secret, lambda node_id: node_id in known, take)


def sender(beats: BeatListener, token: str | None) -> BeatSender:
    return BeatSender(f"grpc://127.0.0.1:{beats.port}", token, timeout=2.0)


def test_the_catalogs_decision_is_the_answer_and_an_unknown_node_gets_none():
    decisions = [False, True]
    beats = listener(lambda beat: decisions.pop(0))
    try:
        node = sender(beats, role_token(SECRET, "node", "n1"))
        assert node.beat(Heartbeat("n1", 1, False, 1000)) is False  # a standby, say: the node asks over Flight
        assert node.heard is None  # a beat not taken tells the node nothing of the catalog's clock
        assert node.beat(Heartbeat("n1", 1, False, 1001)) is True
        sent, received, catalog = node.heard  # the taken beat's answer: the catalog's clock, for judging expiry
        assert sent == 1.001 and abs(catalog - received) < 600
        node.close()
        stranger = BeatSender(f"grpc://127.0.0.1:{beats.port}", role_token(SECRET, "node", "n2"), timeout=0.3)
        assert stranger.beat(Heartbeat("n2", 1, False, 1000)) is None  # not known: no key made, no answer
        stranger.close()
        assert decisions == []
        expected = {"udp_heartbeats_taken": 1, "udp_heartbeats_declined": 1, "udp_datagrams_ignored": 1}
        deadline = time.monotonic() + 10  # the listener's thread may not have read the stranger's datagram yet
        while beats.counts() != expected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert beats.counts() == expected
    finally:
        beats.close()


def test_a_beat_without_a_clock_or_with_fields_a_beat_has_not_is_ignored():
    beats = listener(lambda beat: True, secret=None)
    try:
        assert beats.answer(pack({"node_id": "n1", "free_bytes": 1, "low_space": False, "nonce": 7}, None)) is None
        assert beats.answer(pack({"node_id": "n1", "clock_ms": 5, "extra": 1, "nonce": 7}, None)) is None
        assert beats.answer(pack({"node_id": "n1", "clock_ms": 5}, None)) is None  # no nonce to echo
        reply = beats.answer(pack({"node_id": "n1", "clock_ms": 5, "nonce": 7}, None))
        assert reply is not None
        answer = unpack(reply)[2]
        catalog_ms = answer.pop("catalog_ms")  # the catalog's clock, which the node judges expiry by
        assert answer == {"node_id": "n1", "clock_ms": 5, "nonce": 7, "taken": True}
        assert abs(catalog_ms / 1000 - time.time()) < 600
    finally:
        beats.close()


def test_tokens_no_node_holds_are_ignored_without_an_exception():
    beats = listener(lambda beat: True, known=("n1", "\ud800"))
    try:
        for token, node_id in ((f"fp3:node:n1:{'9' * 400}", "n1"), ("fp3:node:\ud800:0", "\ud800"),
                               ("fp3:node:n1:-1", "n1"), ("fp3:node:n1", "n1"), ("x" * 5000, "n1")):
            body = {"node_id": node_id, "clock_ms": 5, "token": token, "nonce": 1}
            assert beats.answer(pack(body, b"k" * 64)) is None, token
        assert beats.counts()["udp_datagrams_ignored"] == 5
    finally:
        beats.close()


def test_closing_frees_the_port():
    beats = listener(lambda beat: True)
    port = beats.port
    beats.close()
    again = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    again.bind(("127.0.0.1", port))  # EADDRINUSE while the old thread still held it
    again.close()


def test_beats_go_over_flight_where_nothing_could_sign_them():
    assert catalog_address("grpc+tls://c:8815", signed=False) is None
    assert catalog_address("grpc+tls://c:8815", signed=True) == ("c", 8815)
    assert catalog_address("grpc+unix:///tmp/s", signed=True) is None
    assert catalog_address("grpc://[::1]:9", signed=False) == ("::1", 9)
