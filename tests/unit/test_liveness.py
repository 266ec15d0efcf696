"""When a beat was sent, in the catalog's clock: waits in a queue, clocks that step, jitter, any interval."""

from __future__ import annotations

from flightpart.server.liveness import SentTimes


def test_a_beat_on_time_counts_from_now_and_a_queued_one_from_when_it_was_sent():
    times = SentTimes()
    assert times.sent_at("n", 100.0, skew=-0.002, arrived=0.0) == 100.0   # its clock 2 ms behind ours (the trip)
    assert times.sent_at("n", 102.0, skew=-0.5, arrived=2.0) == 102.0     # 0.5 s slower than usual: still on time
    sent = times.sent_at("n", 110.0, skew=-6.002, arrived=10.0)           # waited 6 s in a frozen catalog's queue
    assert abs(sent - 104.0) < 1e-9 and times.late == 1


def test_a_backlog_does_not_pass_for_a_clock_that_stepped_back():
    for interval in (0.1, 0.3, 2.0):
        times = SentTimes()
        times.sent_at("n", 100.0, skew=0.0, arrived=0.0)
        # a catalog thaws at 130 and handles at once the beats sent from 101 on, one per interval, for 25 s
        sent_times = [101.0 + k * interval for k in range(int(25 / interval))]
        seen = [times.sent_at("n", 130.0, skew=-(130.0 - t), arrived=30.0 + k * 0.0005)
                for k, t in enumerate(sent_times)]
        assert all(abs(s - t) < 1e-6 for s, t in zip(seen, sent_times)), interval  # each counts from when it was sent


def test_a_clock_that_stepped_back_is_learned_again_whatever_the_interval_and_the_jitter():
    for interval in (0.1, 0.3, 2.0, 5.0, 120.0):
        for jitter in (0.0, 0.3):
            times = SentTimes()
            times.sent_at("n", 100.0, skew=0.0, arrived=0.0)
            # from here on the node's clock runs 30 s behind; handling takes 0 or `jitter` s, alternately
            ages = []
            for k in range(1, 40):
                handled = 100.0 + interval * k + (jitter if k % 2 else 0.0)
                ages.append(handled - times.sent_at("n", handled, skew=-30.0 - (jitter if k % 2 else 0.0),
                                                    arrived=handled - 100.0))
            on_time = [age < 1.0 for age in ages]
            assert on_time[-1] and all(on_time[on_time.index(True):]), (interval, jitter, ages)
            assert on_time.index(True) * interval <= max(4 * interval, 4.0), (interval, jitter, ages)  # soon


def test_a_clock_that_stepped_forward_or_a_node_without_one_counts_from_now():
    times = SentTimes()
    times.sent_at("n", 100.0, skew=0.0, arrived=0.0)
    assert times.sent_at("n", 102.0, skew=+20.0, arrived=2.0) == 102.0
    assert times.sent_at("n", 104.0, skew=+20.0, arrived=4.0) == 104.0
    assert times.sent_at("m", 104.0, skew=None) == 104.0 and times.late == 0
