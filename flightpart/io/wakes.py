"""How often a thread has run: the sign that a stream read whole in C++ is still moving.

A stream read chunk by chunk in Python (``read_chunk``) takes the GIL once
per message: 945 times for a 945 MiB partition of 1 MiB batches. In a
process whose other threads hold the GIL now and then (a Dask client's event
loop runs some 200 callbacks a second, a Ray driver's threads), each of those
takes waits its turn, and a remote read measured 0.90-0.93x raw Flight's
``read_all``, against 1.0x in a process without them. Reading the stream with
``read_all`` takes the GIL once; what the stall watchdog then needs is another
sign that messages still arrive. The reading thread sleeps until gRPC hands it
the next message, so every message wakes it: the count of its context
switches (``/proc/self/task/TID/status``) moves while the stream moves and
stands still while its server is frozen (measured: unchanged for 3 s on a
SIGSTOPped server, some 900 wakes for a 945 MiB read). Where there is no
``/proc`` (not Linux), :func:`thread_wakes` answers None and the reader keeps
reading chunk by chunk.
"""

from __future__ import annotations

import threading
import time

_FIELDS = (b"voluntary_ctxt_switches:", b"nonvoluntary_ctxt_switches:")


def visible() -> bool:
    """Whether this system shows a thread's context switches (a Linux ``/proc``) and they move: a sandbox whose
    counts stand still would make every read longer than the idle timeout look stalled."""
    me = threading.get_native_id()
    before = thread_wakes(me)
    time.sleep(0.001)  # one switch out and back in
    after = thread_wakes(me)
    return before is not None and after is not None and after > before


def thread_wakes(native_id: int) -> int | None:
    """How many times the thread ``native_id`` of this process was switched in and out so far (None when it has
    ended or this system does not show it). Only the change between two calls means anything."""
    try:
        with open(f"/proc/self/task/{native_id}/status", "rb") as f:
            text = f.read()
    except OSError:
        return None
    total, found = 0, 0
    for line in text.splitlines():
        if line.startswith(_FIELDS):
            total += int(line.split()[1])
            found += 1
    return total if found == len(_FIELDS) else None
