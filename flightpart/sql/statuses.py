"""The gRPC statuses SQL clients expect for a refused query, on the catalog's Flight SQL calls.

An ADBC driver turns the status into its error class and code: INVALID_ARGUMENT
(a syntax error, an unknown column, a type error) and NOT_FOUND (an unknown
table) are the client's mistake, a DB-API ``ProgrammingError``; the UNKNOWN
that flightpart's other errors travel as reads as the server's failure. A
Python Flight server reaches INVALID_ARGUMENT and NOT_FOUND only by raising
``pyarrow.ArrowInvalid`` and ``ArrowKeyError``, which carry no ``extra_info``
(the code goes at the end of the message, :func:`flightpart.wire.error_with_code`)
and to which pyarrow appends the Python traceback, with the server's paths.
The traceback is left out by the classes used here (:class:`flightpart.server.base.Untraced`): pyarrow formats it with
:mod:`traceback`, which reads the exception type's ``__module__``; a type that
refuses to say it makes pyarrow fall back to the type's bare name (which is
``flightpart``: the message ends ``Detail: Python exception: flightpart``).
CPython's :mod:`traceback` reads ``__module__`` in 3.11 to 3.13; the status
a client sees, with no traceback, is tested in tests/test_flight_sql.py, so
a Python or pyarrow that formats it otherwise is caught there. These
exceptions are made only as the call's error leaves the server, after it
was logged, so nothing in flightpart formats one.

A limit of the catalog's (``LIMIT_EXCEEDED``: an answer, a query's text or
its memory past what the catalog takes for one) would be gRPC's
RESOURCE_EXHAUSTED, which a Python Flight server cannot send (pyarrow sends
a Flight error's status only from the set Flight names, and no Python
exception becomes that status). It goes as every flightpart call sends it:
UNKNOWN with ``LIMIT_EXCEEDED`` in ``extra_info`` and a message saying what
to change; not INVALID_ARGUMENT (the query is well formed) nor UNAVAILABLE
(which a client would retry, to meet the same limit).

``GetSchema`` is answered by pyarrow without its handling of Flight errors:
a Flight error raised there reaches the client as UNKNOWN, with the Python
traceback and without ``extra_info``. It is answered with
:func:`flightpart.server.base.schema_error`, for a Flight SQL command as for a
dataset's path: INVALID_ARGUMENT and NOT_FOUND as :func:`sql_error` gives them
(the same status as the query's ``GetFlightInfo``), and any other error as
UNKNOWN with no traceback and its code at the end of its message.
"""

from __future__ import annotations

import pyarrow.flight as flight

from flightpart.errors import DatasetNotFound, FlightpartError, Forbidden, LimitExceeded, QueryTimeout, RequestRejected
from flightpart.server.base import InvalidArgument, NotFound, flight_error
from flightpart.wire import encode_error, error_with_code


def sql_error(exc: FlightpartError) -> Exception:
    """What a Flight SQL call raises for ``exc``: the status an ADBC client expects (see the module doc)."""
    if isinstance(exc, DatasetNotFound):
        return NotFound(error_with_code(exc))
    if isinstance(exc, RequestRejected) and not isinstance(exc, LimitExceeded):
        return InvalidArgument(error_with_code(exc))
    if isinstance(exc, Forbidden):
        return flight.FlightUnauthorizedError(exc.message, extra_info=encode_error(exc))
    if isinstance(exc, QueryTimeout):
        return flight.FlightTimedOutError(exc.message, extra_info=encode_error(exc))
    return flight_error(exc)
