"""Limits a daemon reads from its environment at start, and the fields its settings values are made of.

Each limit is a whole number from 1; anything else stops the daemon at start with
:class:`~flightpart.errors.CannotStart` naming the variable, so a typo is
never read as another limit. :func:`setting` makes a field that carries its
command-line option (name, default, help), so a daemon's setting is spelled once.
"""

from __future__ import annotations

import os
from dataclasses import field
from typing import Any

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


UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
         "t": 1 << 40, "tib": 1 << 40}
"""What a size's unit may be (any case): binary multiples, ``512MiB`` or ``512M``, or bytes when there is none."""


def bytes_from_env(name: str, default: int, what: str) -> int:
    """The size (at least 1 byte) ``$name`` sets, a whole number with an optional unit of :data:`UNITS`
    (``512MiB``, ``2G``), or ``default`` when it is unset or blank; ``what`` says what it bounds, for the error."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    digits = text.rstrip("KMGTkmgtiIbB ")
    unit = text[len(digits):].strip().lower()
    if not digits.isascii() or not digits.isdigit() or unit not in UNITS or int(digits) < 1:
        raise CannotStart(f"{name}={text!r}: {what}, a whole number of bytes from 1, or with a unit (512MiB, 2GiB)")
    return int(digits) * UNITS[unit]


OPTION_KEYS = {"show_default", "path", "min", "envvar", "metavar", "aliases", "address"}
"""What else a :func:`setting` may say of its command-line option: ``show_default`` (True: the help shows the default),
``path`` (``"dir"``: a directory, made when missing; ``"file"``: a file that exists), ``min`` (the least number
accepted), ``envvar`` (the environment variable read when the option is not given), ``metavar`` (how the help names
the value), ``aliases`` (more option names), ``address`` (True: a daemon's address, written as a Flight URI)."""


def setting(default: Any, option: str, help: str | None = None, **shown: Any) -> Any:
    """A field of a daemon's settings value that is also a command-line option: its default, the option's name, its help
    text and what else :data:`OPTION_KEYS` names, kept in the field's metadata, where the CLI reads them to make the
    option; so a setting is spelled once."""
    unknown = set(shown) - OPTION_KEYS
    if unknown:
        raise TypeError(f"setting {option}: unknown keys {sorted(unknown)}")
    return field(default=default, metadata={"option": option, "help": help, **shown})
