"""Which queries are plain scans, answered by the nodes one endpoint per partition. No cluster needed."""

from __future__ import annotations

import pytest

from flightpart.sql.scans import plain_scan

KNOWN = {"trips"}


@pytest.mark.parametrize("query, expected", [
    ("SELECT * FROM trips", ("trips", None, None)),
    ("SELECT fare, pickup_zone FROM trips WHERE fare > 40", ("trips", ["fare", "pickup_zone"], "fare > 40")),
    ("SELECT trips.fare FROM trips", ("trips", ["fare"], None)),
])
def test_plain_scans(query, expected):
    assert plain_scan(query, KNOWN) == expected


@pytest.mark.parametrize("query", [
    "SELECT fare * 2 FROM trips", "SELECT fare AS f FROM trips", "SELECT DISTINCT fare FROM trips",
    "SELECT fare FROM trips ORDER BY fare", "SELECT fare FROM trips LIMIT 3", "SELECT count(*) FROM trips",
    "SELECT fare, fare FROM trips", "SELECT fare FROM nosuch", "SELECT t.fare FROM trips t",
    "SELECT fare FROM trips WHERE fare > (SELECT avg(fare) FROM trips)", "SELEC fare FROM trips",
])
def test_anything_more_is_answered_at_the_catalog(query):
    assert plain_scan(query, KNOWN) is None
