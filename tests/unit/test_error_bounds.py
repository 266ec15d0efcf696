"""No error echoes more than a small part of what a client sent: :func:`flightpart.errors.bounded`, applied by every
error's constructor, and the Flight SQL message names :mod:`flightpart.sqlwire` reads."""

from __future__ import annotations

from flightpart import sqlwire
from flightpart.errors import MESSAGE_CHARS, QUOTED_CHARS, DatasetNotFound, RequestRejected, bounded, error_for


def test_a_long_run_is_cut_and_a_long_message_keeps_its_start_and_end():
    sent = "y" * (64 << 10)
    message = bounded(f"Flight SQL: {sent} is not answered here")
    assert message == f"Flight SQL: {'y' * QUOTED_CHARS}… is not answered here"
    spaced = bounded("start " + "a b " * 300_000 + "what to do")
    assert len(spaced) <= MESSAGE_CHARS and spaced.startswith("start a b") and spaced.endswith("what to do")
    assert bounded(message) == message and bounded(spaced) == spaced  # bounding twice changes nothing
    short = "query: no dataset 'sales' (`flightpart ls` lists the datasets)"
    assert bounded(short) == short


def test_every_error_is_bounded_whoever_made_it():
    huge = "n" * 1_000_000
    for error in (RequestRejected(f"{huge} is refused", field=huge), DatasetNotFound(f"no dataset {huge}"),
                  error_for("INVALID_REQUEST", huge, huge)):
        assert len(error.message) <= MESSAGE_CHARS and "n" * (QUOTED_CHARS + 1) not in error.message
        assert error.field is None or len(error.field) <= QUOTED_CHARS + 1
        assert len(str(error)) <= MESSAGE_CHARS


def test_a_huge_type_url_is_read_as_a_short_name_that_is_no_flight_sql_message():
    body = sqlwire.message((1, "SELECT 1"))
    for url in (sqlwire.PACKAGE + "x" * (64 << 10), sqlwire.PACKAGE + sqlwire.STATEMENT_QUERY + "x" * (64 << 10)):
        command = sqlwire.unpack(sqlwire.message((1, url), (2, body)))
        assert command is not None and len(command.name) <= sqlwire.MAX_NAME + 1
        assert command.name not in (sqlwire.STATEMENT_QUERY, sqlwire.PREPARED_QUERY) and command.value == body
    assert sqlwire.unpack(sqlwire.pack(sqlwire.STATEMENT_QUERY, body)).name == sqlwire.STATEMENT_QUERY
