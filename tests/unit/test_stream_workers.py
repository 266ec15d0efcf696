"""Stream workers are reused (a fresh thread per read made each read fault its buffers in anew), and a stuck one holds
up nothing."""

from __future__ import annotations

import threading

from flightpart.io.workers import run_in_worker


def _thread_of_next_task() -> int:
    seen: list[int] = []
    done = threading.Event()

    def task() -> None:
        seen.append(threading.get_ident())
        done.set()

    run_in_worker(task)
    assert done.wait(10), "the task never ran"
    return seen[0]


def _workers() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.name == "flightpart-stream"}


def test_reads_one_after_another_reuse_the_workers_there_are():
    _thread_of_next_task()  # at least one worker exists
    existing = _workers()
    for _ in range(20):
        assert _thread_of_next_task() in existing  # no fresh thread (and arena) per read


def test_a_stuck_read_does_not_hold_up_the_next_one():
    release = threading.Event()
    started = threading.Event()

    def stuck() -> None:
        started.set()
        release.wait(30)

    run_in_worker(stuck)
    assert started.wait(10)
    try:
        other = _thread_of_next_task()  # runs although the first worker is busy
        assert other != threading.get_ident()
    finally:
        release.set()


def test_a_task_that_raises_leaves_its_worker_working():
    failed = threading.Event()
    where: list[int] = []

    def broken() -> None:
        where.append(threading.get_ident())
        failed.set()
        raise RuntimeError("a read that failed")

    run_in_worker(broken)
    assert failed.wait(10)
    alive = {t.ident for t in threading.enumerate()}
    assert where[0] in alive
    for _ in range(5):
        assert _thread_of_next_task() in alive  # no new thread: the workers, the one that failed among them, go on
