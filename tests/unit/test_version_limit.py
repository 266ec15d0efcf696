"""Version numbers stop at wire.VERSION_LIMIT: a catalog hands out none past it, and a node's registration naming one
has those entries left out (a planted file must not shut its node out of the cluster)."""

from __future__ import annotations

import sqlite3

import pytest

from flightpart import wire
from flightpart.errors import RequestRejected
from flightpart.server.catalog.registry import within_version_limit
from flightpart.server.state import CatalogState


def test_a_dataset_whose_counter_reached_the_limit_gets_no_further_version(tmp_path):
    state = CatalogState(str(tmp_path / "catalog.db"))
    assert state.begin("d") == 1
    with sqlite3.connect(tmp_path / "catalog.db") as db:  # as far as a planted file could push it
        db.execute("UPDATE counters SET next_version=? WHERE dataset='d'", (wire.VERSION_LIMIT,))
    assert state.begin("d") == wire.VERSION_LIMIT  # the last one is still handed out
    with pytest.raises(RequestRejected, match="used every version number"):
        state.begin("d")
    assert state.begin("e") == 1  # other names are not touched


def test_a_registration_keeps_what_it_says_of_versions_within_the_limit_only():
    past = wire.VERSION_LIMIT + 1
    b = wire.RegisterNode("n1", "grpc://127.0.0.2:1", "127.0.0.2", 1,
                          partitions=(wire.HeldPartition("d", 3, (0, 0), 10),
                                      wire.HeldPartition("x", past, (0, 0), 10)),
                          versions=(wire.VersionRef("d", 3), wire.VersionRef("x", past)),
                          sealed_versions=(wire.VersionRef("x", past),),
                          tombstones=(wire.Tombstones("d", past, (2, past), (past,)),))
    kept = within_version_limit(b)
    assert kept.partitions == (wire.HeldPartition("d", 3, (0, 0), 10),)
    assert kept.versions == (wire.VersionRef("d", 3),) and kept.sealed_versions == ()
    # a drop "through" a number past the limit is left out too: kept at the limit, it had moved the name's counter past
    # it (a node token making a name unwritable)
    assert kept.tombstones == (wire.Tombstones("d", 0, (2,), ()),)
    assert within_version_limit(kept) == kept  # nothing past the limit: returned as it was
