"""The error boundary every RPC runs in: what a client receives for each kind of failure, and that counting a
failure can never change it."""

from __future__ import annotations

import logging

import pyarrow.flight as flight
import pytest

from flightpart.errors import PartitionMissing
from flightpart.server.base import boundary
from flightpart.server.telemetry import Telemetry
from flightpart.wire import decode_error

log = logging.getLogger("test-boundary")


def test_a_refusal_reaches_the_client_with_its_code_and_is_counted_once():
    telemetry, seen = Telemetry(), []
    with pytest.raises(flight.FlightServerError) as caught:
        with boundary(log, "do_get", telemetry, None, counted=seen.append):
            raise PartitionMissing("partition (0, 0) is not on this node", field="ticket.part")
    assert decode_error(caught.value.extra_info) == ("PARTITION_MISSING", "ticket.part")
    assert caught.value.__suppress_context__  # no server traceback rides along
    assert [type(e) for e in seen] == [PartitionMissing]
    assert telemetry.refusals() == {"partition_missing": 1}
    assert telemetry.histograms()["do_get"][2] == 1


def test_a_counter_that_fails_does_not_change_what_the_client_receives(caplog):
    def broken(_exc: BaseException) -> None:
        raise RuntimeError("the counters are gone")

    with pytest.raises(flight.FlightServerError) as caught, caplog.at_level(logging.ERROR, logger="test-boundary"):
        with boundary(log, "do_get", Telemetry(), None, counted=broken):
            raise PartitionMissing("partition (0, 0) is not on this node", field="ticket.part")
    assert decode_error(caught.value.extra_info) == ("PARTITION_MISSING", "ticket.part")
    assert "counting its error failed" in caplog.text


def test_an_unexpected_error_is_internal_without_its_details_and_an_interrupt_goes_on_as_it_is():
    with pytest.raises(flight.FlightInternalError) as caught:
        with boundary(log, "do_get", Telemetry(), None):
            raise ValueError("connection string user=admin password=hunter2")
    assert "hunter2" not in str(caught.value)
    assert decode_error(caught.value.extra_info)[0] == "INTERNAL"
    with pytest.raises(KeyboardInterrupt):
        with boundary(log, "do_get", Telemetry(), None):
            raise KeyboardInterrupt
