"""``progress=`` for reads and writes: a function of (bytes done, bytes total), or a tqdm-like bar (anything with
``update(n)``; its ``total`` is set when it has none). A total of 0 means not known."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

Progress = Callable[[int, int], None]
"""(bytes done, bytes total), called as bytes move; total 0: not known."""


class Reporter:
    """Adds up bytes moved (from any thread) and reports the running total to ``progress``."""

    def __init__(self, progress: Progress | Any, total: int = 0):
        if not callable(progress) and not hasattr(progress, "update"):
            raise TypeError(f"progress: expected a function (done, total) or an object with update(n) such as a tqdm "
                            f"bar, got {type(progress).__name__}")
        self.progress = progress
        self.total = total
        self.done = 0
        self._lock = threading.Lock()
        self.expect(total)

    def expect(self, total: int) -> None:
        """The total is known now (a tqdm bar without one is given it)."""
        self.total = total
        bar: Any = self.progress
        if total and hasattr(bar, "update") and getattr(bar, "total", None) in (None, 0):
            bar.total = total
            if hasattr(bar, "refresh"):
                bar.refresh()

    def add(self, nbytes: int) -> None:
        """``nbytes`` more have moved."""
        with self._lock:
            self.done += nbytes
            done = self.done
            if hasattr(self.progress, "update"):
                self.progress.update(nbytes)
            else:
                self.progress(done, self.total)


def reporter(progress: Progress | Any | None, total: int = 0) -> Reporter | None:
    """A :class:`Reporter` for a ``progress=`` argument, or None when there is none."""
    return None if progress is None else Reporter(progress, total)
