"""``progress=`` takes a function of (done, total) or a real tqdm bar; anything else is refused up front."""

from __future__ import annotations

import io
import threading

import pytest
from tqdm import tqdm

from flightpart.client.progress import Reporter, reporter


def test_a_function_hears_the_running_total_and_the_total():
    heard = []
    report = Reporter(lambda done, total: heard.append((done, total)), 300)
    report.add(100)
    report.add(200)
    assert heard == [(100, 300), (300, 300)]


def test_a_tqdm_bar_is_given_the_total_and_moved_by_each_step():
    with tqdm(total=None, unit="B", file=io.StringIO()) as bar:
        report = Reporter(bar)
        report.expect(1_000)
        for _ in range(4):
            report.add(250)
        assert (bar.total, bar.n) == (1_000, 1_000)


def test_a_bar_that_has_a_total_keeps_it():
    with tqdm(total=5_000, file=io.StringIO()) as bar:
        Reporter(bar, 1_000).add(10)
        assert (bar.total, bar.n) == (5_000, 10)


def test_steps_from_many_threads_add_up():
    heard = []
    report = Reporter(lambda done, total: heard.append(done))
    threads = [threading.Thread(target=lambda: [report.add(1) for _ in range(1_000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert report.done == 4_000 and max(heard) == 4_000


def test_no_progress_means_no_reporter_and_a_wrong_one_is_refused():
    assert reporter(None) is None
    with pytest.raises(TypeError, match="tqdm"):
        reporter(42)
