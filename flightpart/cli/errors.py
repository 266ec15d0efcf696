"""What the ``flightpart`` command prints when something goes wrong: one line, with what to do next.

A person at a shell should never see a traceback for a mistake they can fix
(a daemon not started, a wrong address, a missing token), and a script
should be able to tell errors apart without parsing prose: every line reads
``Error [CODE]: what happened. Next: what to do`` where CODE is the stable
code of :mod:`flightpart.errors` (or ``USAGE``, ``INTERNAL``). ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import re

import pyarrow as pa

from flightpart.errors import (
    FlightpartError,
    Forbidden,
    InvalidFilter,
    NodeUnavailable,
    ServerBusy,
    StorageFull,
    Unauthenticated,
)
from flightpart.io.access import CredentialFileError
from flightpart.io.errors import translate

FLIGHT_PREFIX = re.compile(r"Flight returned [\w ]+? error, with message: ")


def _address(address: str | None) -> str:
    return address or "the daemon"


HINTS: tuple[tuple[type[BaseException], str], ...] = (
    (ServerBusy, "retry in a moment; the node is at its --max-streams limit"),
    (NodeUnavailable, "start it (`flightpart catalog`, `flightpart serve --catalog URI`) or wait for it with "
                      "`flightpart wait {address}`; check the address and, for TLS, $FLIGHTPART_TLS_CA"),
    (Unauthenticated, "set $FLIGHTPART_TOKEN to a token made where the cluster secret is "
                      "(`flightpart token --role reader --name YOU --secret-file SECRET`)"),
    (Forbidden, "ask for a token of a role that may do this (`flightpart token --role writer|admin ...`)"),
    (StorageFull, "free disk space on the node or add a node; nothing partial was kept"),
    (CredentialFileError, "fix the file as the message says"),
    (InvalidFilter,
     "write --where as SQL, e.g. --where \"fare > 10 AND zone IN ('JFK', 'LGA')\" (docs/querying.md lists "
     "what is translated)"),
)


def error_line(exc: BaseException, address: str | None = None) -> str:
    """The one line the command prints for ``exc`` (``address``: the daemon the command was talking to)."""
    if isinstance(exc, (pa.ArrowException, ConnectionError)) and not isinstance(exc, FlightpartError):
        exc = translate(exc)
    if isinstance(exc, FlightpartError):
        code, message = exc.code, exc.message
    elif isinstance(exc, (ValueError, KeyError, LookupError)):
        code, message = "USAGE", exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    elif isinstance(exc, OSError):
        code, message = "OS_ERROR", f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    else:
        code, message = "INTERNAL", f"{type(exc).__name__}: {exc}"
    message = " ".join(FLIGHT_PREFIX.sub("", str(message)).split())
    hint = next((text for cls, text in HINTS if isinstance(exc, cls)), None)
    if hint is None and code == "INTERNAL":
        hint = "run again with `flightpart --debug ...` for the traceback, and report it"
    line = f"Error [{code}]: {message.rstrip('.')}"
    return line + (f". Next: {hint.format(address=_address(address))}" if hint else "")
