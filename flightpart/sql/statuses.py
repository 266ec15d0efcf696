"""The gRPC statuses SQL clients expect for a refused query (decision 0030).

INVALID_ARGUMENT and NOT_FOUND tell an ADBC client the query is wrong (a DB-API
``ProgrammingError``); UNKNOWN is the server's failure. pyarrow sends those two
only for ``ArrowInvalid`` and ``ArrowKeyError``, which carry no ``extra_info``
(the code ends the message); the classes raised
(:class:`flightpart.server.base.Untraced`) keep the traceback out.
``LIMIT_EXCEEDED`` goes as UNKNOWN with its code in ``extra_info``.
``GetSchema`` sends the same statuses
(:func:`flightpart.server.base.schema_error`).
"""

from __future__ import annotations

import pyarrow.flight as flight

from flightpart.errors import DatasetNotFound, FlightpartError, Forbidden, LimitExceeded, QueryTimeout, RequestRejected
from flightpart.server.base import InvalidArgument, NotFound, flight_error
from flightpart.wire import encode_error, error_with_code


def sql_error(exc: FlightpartError) -> Exception:
    """What a Flight SQL call raises for ``exc`` (see the module doc)."""
    if isinstance(exc, DatasetNotFound):
        return NotFound(error_with_code(exc))
    if isinstance(exc, RequestRejected) and not isinstance(exc, LimitExceeded):
        return InvalidArgument(error_with_code(exc))
    if isinstance(exc, Forbidden):
        return flight.FlightUnauthorizedError(exc.message, extra_info=encode_error(exc))
    if isinstance(exc, QueryTimeout):
        return flight.FlightTimedOutError(exc.message, extra_info=encode_error(exc))
    return flight_error(exc)
