"""The datagram heartbeat's rules, on a real socket: what a catalog takes, declines and leaves unanswered."""

from __future__ import annotations

from flightpart.server.beats import BeatListener, BeatSender, catalog_address, pack, unpack
from flightpart.tokens import role_token
from flightpart.wire import Heartbeat

SECRET = b"unit-test-secret"


def listener(take, secret=SECRET) -> BeatListener:
    return BeatListener("127.0.0.1", 0, secret, take)


def sender(beats: BeatListener, token: str | None) -> BeatSender:
    return BeatSender(f"grpc://127.0.0.1:{beats.port}", token, timeout=2.0)


def test_a_declined_beat_is_answered_not_taken_and_does_not_block_a_later_one():
    decisions = [False, True]
    beats = listener(lambda beat: decisions.pop(0))
    try:
        node = sender(beats, role_token(SECRET, "node", "n1"))
        assert node.beat(Heartbeat("n1", 1, False, 1000)) is False  # a standby, say: the node asks over Flight
        assert node.beat(Heartbeat("n1", 1, False, 1000)) is True   # declined was not recorded as the last clock
        assert node.beat(Heartbeat("n1", 1, False, 999)) is False   # older than the last taken: not asked at all
        assert decisions == []
        assert beats.counts() == {"udp_heartbeats_taken": 1, "udp_heartbeats_declined": 2, "udp_datagrams_ignored": 0}
        node.close()
    finally:
        beats.close()


def test_a_beat_without_a_clock_or_with_fields_a_beat_has_not_is_ignored():
    beats = listener(lambda beat: True, secret=None)
    try:
        assert beats.answer(pack({"node_id": "n1", "free_bytes": 1, "low_space": False}, None)) is None
        assert beats.answer(pack({"node_id": "n1", "clock_ms": 5, "extra": 1}, None)) is None
        reply = beats.answer(pack({"node_id": "n1", "clock_ms": 5}, None))
        assert reply is not None and unpack(reply)[2] == {"node_id": "n1", "clock_ms": 5, "taken": True}
    finally:
        beats.close()


def test_beats_go_over_flight_where_nothing_could_sign_them():
    assert catalog_address("grpc+tls://c:8815", signed=False) is None
    assert catalog_address("grpc+tls://c:8815", signed=True) == ("c", 8815)
    assert catalog_address("grpc+unix:///tmp/s", signed=True) is None
    assert catalog_address("grpc://[::1]:9", signed=False) == ("::1", 9)
