"""Flight errors from our servers turned into flightpart's own exceptions."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import DatasetNotFound, FlightpartError, InvalidName, NodeUnavailable, SchemaMismatch


class RequestRejected(FlightpartError, ValueError):
    """The server refused a request as malformed; the message says why."""


def server_message(exc: BaseException) -> str:
    """The server's own words, without gRPC's detail and traceback."""
    return str(exc).split(". Detail:")[0].split("\nDetail:")[0].strip()


def translate(exc: BaseException) -> BaseException:
    if isinstance(exc, (flight.FlightUnauthenticatedError, flight.FlightUnauthorizedError)):
        return exc
    message = server_message(exc)
    if isinstance(exc, pa.ArrowKeyError):
        return DatasetNotFound(message.strip("'\""))
    if isinstance(exc, (flight.FlightUnavailableError, flight.FlightTimedOutError, ConnectionError)):
        return NodeUnavailable(message)
    if isinstance(exc, pa.ArrowInvalid):
        if "invalid dataset name" in message:
            return InvalidName(message)
        if "schema" in message or "rows, expected" in message or "not stored on node" in message:
            return SchemaMismatch(message)
        return RequestRejected(message)
    return exc


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raise Flight errors as ours, keeping the original as the cause."""
    try:
        yield
    except (pa.ArrowException, ConnectionError) as exc:
        mapped = translate(exc)
        if mapped is exc:
            raise
        raise mapped from exc
