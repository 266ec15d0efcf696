"""``$FLIGHTPART_PENDING_PER_WRITER``: the versions a writer may hold begun, read once at the catalog's start."""

from __future__ import annotations

import pytest

from flightpart.errors import CannotStart, LimitExceeded
from flightpart.server.catalog_state import PENDING_PER_WRITER, CatalogState, pending_per_writer_from_env


@pytest.mark.parametrize("text", ["0", "-3", "ten", "1.5", "١٢"])
def test_anything_but_a_whole_number_from_one_stops_the_catalog_at_start(monkeypatch, text):
    monkeypatch.setenv("FLIGHTPART_PENDING_PER_WRITER", text)
    with pytest.raises(CannotStart, match="FLIGHTPART_PENDING_PER_WRITER"):
        pending_per_writer_from_env()


def test_unset_is_the_default_and_a_number_is_taken(monkeypatch):
    monkeypatch.delenv("FLIGHTPART_PENDING_PER_WRITER", raising=False)
    assert pending_per_writer_from_env() == PENDING_PER_WRITER
    monkeypatch.setenv("FLIGHTPART_PENDING_PER_WRITER", " 7 ")
    assert pending_per_writer_from_env() == 7


def test_a_writers_share_counts_only_its_own_pending_versions():
    state = CatalogState(":memory:")
    held = [state.begin("d", writer="writer:w", most_pending=2) for _ in range(2)]
    with pytest.raises(LimitExceeded):
        state.begin("e", writer="writer:w", most_pending=2)
    state.begin("d", writer="writer:other", most_pending=2)
    state.abort("d", held[0])
    state.begin("d", writer="writer:w", most_pending=2)
