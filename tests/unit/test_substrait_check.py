"""A filter that aborts Arrow's Substrait reader kills the checker process, never its caller: refused, and the next
filter is checked by a new checker; a filter read once is not sent to the checker again."""

from __future__ import annotations

import os
import signal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.substrait as substrait
import pytest

from flightpart.errors import RequestRejected
from flightpart.server.substrait_check import SubstraitChecker

DECIMAL = pa.schema([("c", pa.decimal128(10, 2))])


def aborting_filter() -> bytes:
    """A filter whose decimal type has precision 0: Arrow's reader aborts the process on it (SIGABRT)."""
    raw = bytes(substrait.serialize_expressions([pc.field("c").is_valid()], ["filter"], DECIMAL))
    precision_10 = b"\x08\x02\x10\x0a"  # Type.Decimal {scale: 2, precision: 10}
    assert raw.count(precision_10) == 1
    return raw.replace(precision_10, b"\x08\x02\x10\x00")


def good_filter(limit: int) -> bytes:
    return bytes(substrait.serialize_expressions([pc.field("c") > pa.scalar(limit, pa.decimal128(10, 2))], ["filter"],
                                                  DECIMAL))


def test_a_filter_that_aborts_the_reader_is_refused_and_the_next_is_checked_by_a_new_checker():
    checker = SubstraitChecker()
    try:
        checker.check(good_filter(1))
        first = checker.pid
        with pytest.raises(RequestRejected, match="crashes Arrow's Substrait reader") as info:
            checker.check(aborting_filter())
        assert info.value.field == "ticket.filter" and checker.pid is None
        with pytest.raises(RequestRejected, match="crashes"):  # refused again from memory: no checker started for it
            checker.check(aborting_filter())
        assert checker.pid is None
        checker.check(good_filter(2))
        assert checker.pid not in (None, first)
        # a checker killed from outside between two filters is replaced, and the next filter is not refused for it
        os.kill(checker.pid, signal.SIGKILL)
        checker.check(good_filter(3))
        # bytes that are no filter at all are the node's own reading's to refuse: the checker survives them
        checker.check(b"\x00not substrait")
    finally:
        checker.close()


def test_a_filter_read_once_is_not_checked_again():
    checker = SubstraitChecker()
    try:
        checker.check(good_filter(5))
        asked = checker.pid
        os.kill(asked, signal.SIGKILL)  # a checker asked again would be replaced by a new one
        checker.check(good_filter(5))
        assert checker.pid == asked
    finally:
        checker.close()


def test_a_stopped_checker_is_replaced_after_its_time_and_the_filter_still_read(monkeypatch):
    """SIGSTOP on the checker: the filter waits for CHECK_SECONDS, then a new checker reads it (not refused)."""
    from flightpart.server import substrait_check

    monkeypatch.setattr(substrait_check, "CHECK_SECONDS", 1.0)
    checker = SubstraitChecker()
    try:
        checker.check(good_filter(6))
        stopped = checker.pid
        os.kill(stopped, signal.SIGSTOP)
        checker.check(good_filter(7))
        assert checker.pid not in (None, stopped)
    finally:
        checker.close()


def test_a_checker_that_gives_no_answer_in_time_makes_the_filter_busy_not_refused(monkeypatch):
    """A stall (a starved machine) proves nothing about the filter: BUSY, retryable, and not remembered."""
    from flightpart.errors import ServerBusy
    from flightpart.server import substrait_check

    checker = SubstraitChecker()
    try:
        checker.check(good_filter(8))  # started and warm
        monkeypatch.setattr(substrait_check, "CHECK_SECONDS", 0.0)  # no checker answers in no time
        with pytest.raises(ServerBusy):
            checker.check(good_filter(9))
        monkeypatch.setattr(substrait_check, "CHECK_SECONDS", 60.0)
        checker.check(good_filter(9))  # asked again, and read
    finally:
        checker.close()
