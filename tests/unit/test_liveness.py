"""When a beat was sent, in the catalog's clock: waits in a queue, clocks that step, drift."""

from __future__ import annotations

from flightpart.server.liveness import SentTimes


def test_a_beat_on_time_counts_from_now_and_a_queued_one_from_when_it_was_sent():
    times = SentTimes()
    assert times.sent_at("n", 100.0, skew=-0.002, arrived=0.0) == 100.0   # its clock 2 ms behind ours (the trip)
    assert times.sent_at("n", 102.0, skew=-0.5, arrived=2.0) == 102.0     # 0.5 s slower than usual: still on time
    sent = times.sent_at("n", 110.0, skew=-6.002, arrived=10.0)           # waited 6 s in a frozen catalog's queue
    assert abs(sent - 104.0) < 1e-9 and times.late == 1


def test_a_backlog_does_not_pass_for_a_clock_that_stepped_back():
    times = SentTimes()
    times.sent_at("n", 100.0, skew=0.0, arrived=0.0)
    # a catalog thaws at 110 and handles at once the beats sent at 101, 103, 105, 107 (2 s apart)
    sent = [times.sent_at("n", 110.0, skew=-(110.0 - t), arrived=10.0 + k * 0.001) for k, t in enumerate((101, 103, 105, 107))]
    assert sent == [101.0, 103.0, 105.0, 107.0] and times.late == 4


def test_a_clock_that_stepped_back_is_late_for_a_moment_then_on_time_again():
    times = SentTimes()
    times.sent_at("n", 100.0, skew=0.0, arrived=0.0)
    # from 102 on, the node's clock runs 30 s behind: each beat looks 30 s late, arriving 2 s apart
    seen = [times.sent_at("n", 102.0 + 2 * k, skew=-30.0, arrived=2.0 + 2 * k) for k in range(4)]
    assert seen[0] == 72.0  # counted late at first (as if sent 30 s ago) ...
    assert seen[-1] == 108.0 and times.sent_at("n", 110.0, skew=-30.0, arrived=10.0) == 110.0  # ... then its new offset


def test_a_clock_that_stepped_forward_or_a_node_without_one_counts_from_now():
    times = SentTimes()
    times.sent_at("n", 100.0, skew=0.0, arrived=0.0)
    assert times.sent_at("n", 102.0, skew=+20.0, arrived=2.0) == 102.0
    assert times.sent_at("n", 104.0, skew=+20.0, arrived=4.0) == 104.0
    assert times.sent_at("m", 104.0, skew=None) == 104.0 and times.late == 0


def test_a_clock_that_stepped_back_on_a_short_or_a_long_heartbeat_is_learned_again():
    for interval in (0.1, 0.3, 5.0, 20.0):
        times = SentTimes()
        times.sent_at("n", 100.0, skew=0.0, arrived=0.0)
        seen = [times.sent_at("n", 100.0 + interval * k, skew=-10.0, arrived=interval * k) for k in range(1, 16)]
        assert seen[-1] == 100.0 + interval * 15, (interval, seen)  # on time again: counted from now
