"""Substrait filters received from the network are read once in a child process before the node reads them.

pyarrow's Substrait reader can kill its process on a malformed plan (decision 0023). So each distinct filter is
first deserialized by a checker process; one that kills it is refused with ``INVALID_REQUEST`` (and a new checker
started); one it survives is remembered, so a filter repeated over many partitions is checked once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import select
import struct
import subprocess
import sys
import threading
from collections import OrderedDict

from flightpart.errors import RequestRejected, ServerBusy

log = logging.getLogger("flightpart.node")

CHECK_SECONDS = 10.0
"""How long a checker may take over one filter before it is killed and the filter refused (its start-up is not
counted: a fresh checker says when it is ready)."""

START_SECONDS = 120.0
"""How long a new checker may take to start (import pyarrow) before the filter is answered BUSY instead."""

REMEMBERED = 4096
"""How many filters are remembered (by their SHA-256), read safely or refused."""

CHECK_STACK_BYTES = 2 << 20
"""The stack the checker reads and applies a filter on: a quarter of the 8 MiB a node's Flight threads get (glibc's
default under the usual ``ulimit -s``). Arrow reads and binds a Substrait expression by recursion as deep as the
expression: an ``is_in`` of about 10,000 values overflows 8 MiB (SIGSEGV) and of about 3,500 values 2 MiB, so what
the checker survives, a node survives with room to spare."""

_CHECKER = """
import struct, sys, threading
STACK = int(sys.argv[1])
import pyarrow as pa, pyarrow.substrait as substrait
source, sink = sys.stdin.buffer, sys.stdout.buffer

def read_and_apply(raw):
    try:
        bound = substrait.deserialize_expressions(pa.py_buffer(raw))
        bound.schema.empty_table().filter(bound.expressions["filter"])
    except Exception:
        pass

threading.stack_size(STACK)
import pyarrow.compute as pc
warm = substrait.serialize_expressions([pc.field("x") == 1], ["filter"], pa.schema([("x", pa.int64())]))
read_and_apply(bytes(warm))  # the reader's first use loads what it needs: done before the first filter's time
sink.write(b"R")
sink.flush()
while len(head := source.read(4)) == 4:
    raw = source.read(struct.unpack("<I", head)[0])
    reader = threading.Thread(target=read_and_apply, args=(raw,))
    reader.start()
    reader.join()
    sink.write(b"1")
    sink.flush()
"""
"""The checker: reads length-prefixed Substrait bytes, reads each and applies it to no rows (binding it, which
recurses deeper than reading it) on a thread of :data:`CHECK_STACK_BYTES`, and answers b"1" for each it survived
(an error is the node's own reading's to report; only surviving is asked). It imports pyarrow alone, so it starts
in a tenth of a second, and it ends when its input closes, as it does when the node's process ends."""


class SubstraitChecker:
    """A checker process, started on the first filter and again after a filter killed it (see :func:`shared`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._known: OrderedDict[bytes, bool] = OrderedDict()  # SHA-256 -> survived (a refusal is kept too: a
        # client repeating a filter that kills the checker must not make the node start a checker each time)

    def check(self, raw: bytes) -> None:
        """Return once ``raw`` is known not to crash Substrait's reader; RequestRejected if it does, ServerBusy
        (retryable, not remembered) if a fresh checker gave no answer within :data:`CHECK_SECONDS`."""
        key = hashlib.sha256(raw).digest()
        with self._lock:
            survived = self._known.get(key)
            if survived is None:
                survived = self._survives(raw)
                if survived is None:
                    raise ServerBusy(f"the node's filter check got no answer in {CHECK_SECONDS:g} s (the node is "
                                     "busy); retry shortly", field="ticket.filter")
                self._known[key] = survived
                if len(self._known) > REMEMBERED:
                    self._known.popitem(last=False)
            else:
                self._known.move_to_end(key)
        if not survived:
            raise RequestRejected("ticket.filter: not a Substrait filter this node can read safely (it crashes Arrow's "
                                  "Substrait reader, or is nested too deeply for it: an is_in of thousands of values "
                                  "is; filter such rows in the reader)", field="ticket.filter")

    def close(self) -> None:
        """Stop the checker (it also stops by itself when this process ends: its input closes)."""
        with self._lock:
            self._stop()

    @property
    def pid(self) -> int | None:
        """The checker's process id (None before the first filter, or after one killed it)."""
        return self._proc.pid if self._proc is not None else None

    def _survives(self, raw: bytes) -> bool | None:
        """Whether the checker survives reading ``raw`` (None: it stalled past :data:`CHECK_SECONDS`); a checker
        already gone or stopped is replaced and asked again, so only what a fresh one does counts."""
        fresh = self._proc is None or self._proc.poll() is not None
        while True:
            proc = self._started()
            try:
                assert proc.stdin is not None
                proc.stdin.write(struct.pack("<I", len(raw)) + raw)
                proc.stdin.flush()
                answer = _read_within(proc, CHECK_SECONDS)
            except OSError:
                answer = b""  # its input closed: it died
            if answer == b"1":
                return True
            stalled = answer is None and proc.poll() is None
            self._stop()
            if not fresh:
                fresh = True
                continue
            if stalled:
                log.warning("a ticket's filter stalled the Substrait checker (no answer in %g s); answered busy",
                            CHECK_SECONDS)
                return None
            log.warning("a ticket's filter killed the Substrait checker; refused")
            return False

    def _started(self) -> subprocess.Popen:
        """The checker, started and ready (its imports done), so the time a filter is given counts the check alone."""
        if self._proc is None or self._proc.poll() is not None:
            try:
                self._proc = subprocess.Popen([sys.executable, "-c", _CHECKER, str(CHECK_STACK_BYTES)],
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            except OSError as exc:
                raise ServerBusy(f"cannot check the ticket's filter now ({exc}); retry shortly") from None
            if _read_within(self._proc, START_SECONDS) != b"R":
                self._stop()
                raise ServerBusy("cannot check the ticket's filter now (the checker did not start); retry shortly")
        return self._proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:  # bytes a dead checker never read: closing still frees the pipe
                        pass


def _read_within(proc: subprocess.Popen, seconds: float) -> bytes | None:
    """One answer byte from the checker, b"" if it died (its output closed), None if it took longer than ``seconds``."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    return os.read(proc.stdout.fileno(), 1) if ready else None


_shared: SubstraitChecker | None = None
_shared_lock = threading.Lock()


def shared() -> SubstraitChecker:
    """The process's one checker, shared by its nodes; it ends with the process."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = SubstraitChecker()
        return _shared
