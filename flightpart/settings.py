"""Limits a daemon reads from its environment at start.

Each is a whole number from 1; anything else stops the daemon at start with
:class:`~flightpart.errors.CannotStart` naming the variable, so a typo is
never read as another limit.
"""

from __future__ import annotations

import os

from flightpart.errors import CannotStart


def count_from_env(name: str, default: int, what: str) -> int:
    """The whole number (at least 1) ``$name`` sets, or ``default`` when it is unset or blank; ``what`` says what it
    counts, for the error."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise CannotStart(f"{name}={text!r}: {what}, a whole number from 1")
    return int(text)
