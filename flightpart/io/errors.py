"""Flight errors from our servers turned into flightpart's own exceptions, by code.

A server puts a stable code in ``extra_info`` (:func:`flightpart.wire.encode_error`), or for a SQL client's status
at the end of the message (:func:`flightpart.wire.error_with_code`); :data:`flightpart.errors.BY_CODE` maps codes
to classes. Errors without a code are told apart by Flight status, never by wording.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import FlightpartError, NodeUnavailable, ServerError, Unauthenticated, error_for
from flightpart.wire import code_in_message, decode_error, error_message

BY_STATUS: tuple[tuple[type[BaseException], type[FlightpartError]], ...] = (
    (flight.FlightUnauthenticatedError, Unauthenticated),
    (flight.FlightUnauthorizedError, Unauthenticated),
    (flight.FlightUnavailableError, NodeUnavailable),
    (flight.FlightTimedOutError, NodeUnavailable),
    (flight.FlightCancelledError, NodeUnavailable),
    (ConnectionError, NodeUnavailable),
    (OSError, NodeUnavailable),
)
"""For errors without a code: the class by Flight status (or socket error)."""


def translate(exc: BaseException) -> FlightpartError:
    """The flightpart exception for an error raised by a Flight call."""
    if isinstance(exc, FlightpartError):
        return exc
    decoded = decode_error(getattr(exc, "extra_info", None))
    message = error_message(exc)
    if decoded is not None:
        return error_for(decoded[0], message, decoded[1])
    if isinstance(exc, (pa.ArrowInvalid, pa.ArrowKeyError)):  # a SQL status: its code ends the message
        coded = code_in_message(message)
        if coded is not None:
            return error_for(coded[0], coded[2], coded[1])
    for status, cls in BY_STATUS:
        if isinstance(exc, status):
            return cls(message)
    return ServerError(f"the server failed: {message}")


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raise Flight errors as ours, keeping the original as the cause."""
    try:
        yield
    except FlightpartError:
        raise
    except (pa.ArrowException, ConnectionError, OSError) as exc:
        raise translate(exc) from exc
