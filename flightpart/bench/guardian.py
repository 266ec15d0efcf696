"""What a bench killed in the middle leaves behind, undone by a watcher process that outlives it.

The bench freezes the systems it is not timing with SIGSTOP and keeps gigabytes of partitions in a temporary
folder. Killed with SIGKILL (or by an out-of-memory killer) it cannot thaw or stop anything: Dask, Ray, the
baseline server and its own daemons were left stopped or running for good, and the folder on the disk. The
:class:`Guardian` is told each process as the bench starts or freezes it (its pid and start time, so that a pid
the kernel has since given to another process is never signalled) and each folder; it reads a pipe from the
bench, and the pipe's end without a last ``done`` line means the bench died: it thaws and stops every process it
was told of, removes the folders and, when told ``namespaces``, the network namespaces of clusters whose owner is
gone (``bench --network``: the daemons, drivers and Dask inside them with them).

Started by :class:`Guardian` (:data:`WATCHER_ARGV`), in a session of its own: a Ctrl-C or a signal to the bench's
process group does not reach it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

import psutil

WATCHER_ARGV = [sys.executable, "-c", "from flightpart.bench.guardian import main; main()"]
"""The watcher's command (not ``-m``: the bench package imports this module, and runpy warns of running it so)."""

log = logging.getLogger("flightpart.bench")

STOP_SECONDS = 10.0
"""How long the watcher waits for the processes it sent SIGTERM to before it kills them."""


class Guardian:
    """The bench's side: starts the watcher and tells it what to clean up should the bench die."""

    def __init__(self) -> None:
        self._told: set[int] = set()
        self._lost = False
        self._proc = subprocess.Popen(WATCHER_ARGV, stdin=subprocess.PIPE, text=True, start_new_session=True)

    @property
    def pid(self) -> int:
        """The watcher's process."""
        return self._proc.pid

    def watch(self, pids: Iterable[int]) -> None:
        """Processes to thaw and stop if the bench dies (each told once; one gone already is skipped)."""
        lines = []
        for pid in pids:
            if pid in self._told:
                continue
            try:
                started = psutil.Process(pid).create_time()
            except psutil.Error:
                continue
            self._told.add(pid)
            lines.append(f"pid {pid} {started!r}\n")
        self._send("".join(lines))

    def remove(self, folder: str) -> None:
        """A folder to remove if the bench dies."""
        self._send(f"folder {os.path.abspath(folder)}\n")

    def namespaces(self) -> None:
        """Should the bench die, also remove the network namespaces of clusters whose owner is gone (this bench's)."""
        self._send("namespaces\n")

    def close(self) -> None:
        """The bench ended on its own (it stopped what it started): the watcher leaves without doing anything."""
        self._send("done\n")
        try:
            self._proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(30)

    def _send(self, text: str) -> None:
        """``text`` to the watcher; a watcher killed from outside costs the bench its safety net, not the run."""
        if not text or self._lost or self._proc.stdin is None or self._proc.stdin.closed:
            return
        try:
            self._proc.stdin.write(text)
            self._proc.stdin.flush()
        except OSError:  # BrokenPipeError: the watcher is gone
            self._lost = True
            log.warning("the bench's watcher (pid %d) is gone: should this bench be killed, what it started is left "
                        "running", self._proc.pid)


def clean_up(pids: dict[int, float], folders: list[str]) -> None:
    """Thaw and stop every process of ``pids`` (pid: start time) still running as that process, then remove
    ``folders``."""
    procs = []
    for pid, started in pids.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == started:
                procs.append(proc)
        except psutil.Error:
            pass
    for sig in (signal.SIGCONT, signal.SIGTERM):
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
    left = _still_running(procs, STOP_SECONDS)
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    _still_running(left, STOP_SECONDS)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _still_running(procs: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after up to ``seconds`` (a zombie has ended: its parent, not this watcher,
    is the one to reap it)."""
    deadline = time.monotonic() + seconds
    while True:
        left = [p for p in procs if _running(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench's Ctrl-C is the bench's: its own clean-up runs
    pids: dict[int, float] = {}
    folders: list[str] = []
    namespaces = False
    for line in sys.stdin:
        kind, _, rest = line.strip().partition(" ")
        if kind == "done":
            return
        if kind == "pid":
            pid, started = rest.split()
            pids[int(pid)] = float(started)
        elif kind == "folder":
            folders.append(rest)
        elif kind == "namespaces":
            namespaces = True
    clean_up(pids, folders)
    if namespaces:
        from flightpart.local.netcluster import sweep

        sweep()
