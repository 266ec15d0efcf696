"""``$FLIGHTPART_PENDING_PER_WRITER``: the versions a writer may hold begun, read once at the catalog's start."""

from __future__ import annotations

import pytest

from flightpart.errors import CannotStart, LimitExceeded
from flightpart.server.state import CatalogState
from flightpart.server.state.versions import PENDING_PER_WRITER, pending_per_writer_from_env


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


def test_an_spmd_publish_opens_no_version_past_the_share_and_its_ranks_always_join():
    """Publish-begin opened a version for each new name or rank count whatever the writer held (a way around the
    share, found in review); a job's later ranks join its open publish, never refused."""
    state = CatalogState(":memory:")
    opened = state.join_publish("job", 3, 0, writer="writer:w", most_pending=2)
    assert state.join_publish("job", 3, 1, writer="writer:w", most_pending=2) == opened
    state.begin("d", writer="writer:w", most_pending=2)
    with pytest.raises(LimitExceeded):
        state.join_publish("other-job", 2, 0, writer="writer:w", most_pending=2)
    with pytest.raises(LimitExceeded):
        state.begin("e", writer="writer:w", most_pending=2)
    assert state.join_publish("job", 3, 2, writer="writer:w", most_pending=2) == opened  # the open job goes on
