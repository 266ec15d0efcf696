"""Who may finish a pending version, as the catalog's state records it (the real SQLite state)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightpart.errors import VersionConflict
from flightpart.server.state import CatalogState
from flightpart.server.state.records import LEARNED, Registration

SCHEMA = pa.schema([("a", pa.int64())]).serialize().to_pybytes()


def test_a_version_remembers_its_writer_and_one_learned_from_nodes_has_none(tmp_path):
    state = CatalogState(str(tmp_path / "catalog.db"))
    assert state.writer_of("d", state.begin("d", writer="writer:alice")) == "writer:alice"
    assert state.writer_of("d", state.begin("d")) is None  # begun without one (the catalog's own use)
    state.register_node(Registration("n1", "grpc://10.0.0.1:1", "10.0.0.1", 101, "/d1",
                                     [{"dataset": "p", "version": 7, "part": (0, 0), "nbytes": 5, "stats": None}],
                                     versions=[("p", 7)]))
    assert state.version_state("p", 7)[0] == "pending"  # unsealed files this state never saw: kept, maybe committed
    assert state.writer_of("p", 7) == LEARNED


def test_a_rank_publishes_its_part_once(tmp_path):
    state = CatalogState(str(tmp_path / "catalog.db"))
    for k in range(3):
        state.register_node(Registration(f"n{k}", f"grpc://10.0.0.{k}:1", f"10.0.0.{k}", 100 + k, f"/d{k}", []))
    version = state.join_publish("s", 2, 0, writer="writer:alice")
    assert state.add_rank_part("s", version, 0, 5, 1, 40, "n0", SCHEMA) == 1
    assert state.add_rank_part("s", version, 0, 5, 1, 40, "n0", SCHEMA) == 1  # a retry changes nothing
    with pytest.raises(VersionConflict, match="a rank publishes once"):
        state.add_rank_part("s", version, 0, 777, 1, 40, "n1", SCHEMA)
    assert state.rank_parts("s", version) == [(0, 5, 1, "n0")]
