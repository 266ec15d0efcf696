"""A thread's wakes: what tells a stream read whole in C++ from a stalled one. They move each time the thread is
woken and stand still while it is blocked."""

from __future__ import annotations

import threading
import time

import pytest

from flightpart.io.wakes import thread_wakes, visible

pytestmark = pytest.mark.skipif(not visible(), reason="this system shows no thread's context switches (/proc)")


def test_a_blocked_thread_does_not_move_and_a_woken_one_does():
    go, done, ids = threading.Event(), threading.Event(), []

    def blocked() -> None:
        ids.append(threading.get_native_id())
        go.wait()  # no timeout: asleep until set
        for _ in range(20):
            time.sleep(0.001)
        done.wait()

    thread = threading.Thread(target=blocked)
    thread.start()
    while not ids:
        time.sleep(0.01)
    time.sleep(0.1)
    before = thread_wakes(ids[0])
    time.sleep(0.3)
    assert thread_wakes(ids[0]) == before is not None
    go.set()
    deadline = time.monotonic() + 10  # however loaded the machine, it runs again within that
    while thread_wakes(ids[0]) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread_wakes(ids[0]) > before
    done.set()
    thread.join()


def test_a_running_thread_moves():
    me = threading.get_native_id()
    before = thread_wakes(me)
    for _ in range(5):
        time.sleep(0.001)
    assert thread_wakes(me) > before
