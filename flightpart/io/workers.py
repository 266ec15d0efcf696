"""Long-lived threads that read streams, reused from one read to the next (decision 0008).

A stream is read in a thread of its own so its caller can leave a frozen server in bounded time
(:func:`flightpart.io.pull.stream`). A worker idle for :data:`IDLE_SECONDS` ends; one stuck on a frozen server
is not idle, so the next read starts another.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

IDLE_SECONDS = 60.0
"""How long a worker with nothing to read waits for the next read before it ends."""

_lock = threading.Lock()
_tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_idle = [0]  # workers waiting for a task


def run_in_worker(task: Callable[[], None]) -> None:
    """Run ``task`` in a reused worker thread (a new one when none is idle); returns at once.
    ``task`` must handle its own errors: what it raises is dropped."""
    with _lock:
        if _idle[0] > 0:
            _idle[0] -= 1  # this task is that worker's: a second task does not count on it too
            _tasks.put(task)
            return
    _tasks.put(task)
    threading.Thread(target=_work, name="flightpart-stream", daemon=True).start()


def _work() -> None:
    """Take tasks until none comes for :data:`IDLE_SECONDS`."""
    while True:
        try:
            task = _tasks.get(timeout=IDLE_SECONDS)
        except queue.Empty:
            with _lock:
                if _tasks.empty():
                    _idle[0] -= 1
                    return
            continue
        try:
            task()
        except BaseException:  # a task reports its own errors; a worker outlives them
            pass
        with _lock:
            _idle[0] += 1
