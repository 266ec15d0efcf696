"""How often a thread has run: the sign that a stream read whole in C++ is still moving.

A stream read whole takes the GIL once, not once per message (decision 0007), so the stall watchdog watches the
reading thread instead: it sleeps until gRPC hands it the next message, so its context-switch count moves while
the stream moves and stands still while its server is frozen. Without ``/proc``, :func:`thread_wakes` answers
None and the reader reads chunk by chunk.
"""

from __future__ import annotations

import threading
import time

_FIELDS = (b"voluntary_ctxt_switches:", b"nonvoluntary_ctxt_switches:")


def visible() -> bool:
    """Whether this system shows a thread's context switches and they move (counts that stand still would make every
    long read look stalled)."""
    me = threading.get_native_id()
    before = thread_wakes(me)
    time.sleep(0.001)  # one switch out and back in
    after = thread_wakes(me)
    return before is not None and after is not None and after > before


def thread_wakes(native_id: int) -> int | None:
    """How many times thread ``native_id`` of this process was switched in so far (None when ended or not shown); only
    the change between two calls means anything."""
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
