"""Long-lived threads that read streams, reused from one read to the next.

A read stream is read in a thread of its own so that its caller can leave a
frozen server in bounded time (:func:`flightpart.io.pull.stream`). A fresh
thread per stream made every remote read two to three times slower in a
process that also runs other threads (a Dask client, a Ray driver): glibc
gives each new thread an arena of its own, so each read's hundreds of
megabytes of gRPC buffers were faulted in from the kernel anew. Measured on a
945 MiB partition over loopback with a Dask client in the process: 1.0–1.4 s
per read with a fresh thread, 0.35–0.45 s with the same thread reused (and
the same as reading in the caller's thread). A worker that finished a read
waits for the next one; one idle for :data:`IDLE_SECONDS` ends.

A worker stuck on a frozen server (its call ends only at its deadline) is
simply not idle: the next read starts another worker, so a stuck read never
holds up the others.
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

    ``task`` must handle its own errors: what it raises is dropped.
    """
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
