"""Nodes that may have missed an order (a drop's, an abort's, any a node did not answer) are kept in the catalog's
database until they acknowledge that order or register again, so a catalog that dies first (a kill -9 between
writing a drop and telling the nodes; a takeover) still has them register at its next start, which tells them the
drop. Before, only the catalog's memory kept them: the nodes went on beating to the next catalog, and the dropped
files stayed for good."""

from __future__ import annotations

import time

import pyarrow as pa

from flightpart.server.state import CatalogState
from flightpart.server.state.records import PartRecord, Registration, order_key

SCHEMA = pa.schema([("a", pa.int64())]).serialize().to_pybytes()


def started(path) -> CatalogState:
    state = CatalogState(path)
    for k in range(3):
        state.register_node(Registration(f"n{k}", f"grpc://10.0.0.{k}:1", f"10.0.0.{k}", k, None, []))
    return state


def put(state: CatalogState, name: str, holders: list[str]) -> int:
    nodes = {n.node_id: n for n in state.nodes()}
    version = state.begin(name)
    state.commit(name, version, SCHEMA, (10, 1), (1, 1),
                 [PartRecord((0, 0), (0, 0), (10, 1), 80, [nodes[h] for h in holders])])
    return version


def taken_after_a_restart(state: CatalogState, path) -> dict[str, bool]:
    """Close ``state`` (the catalog dies) and start again on its database: whose first heartbeat is taken (the
    others must register again)."""
    state.close()
    again = CatalogState(path)
    try:
        return {f"n{k}": again.heartbeat(f"n{k}") for k in range(3)}
    finally:
        again.close()


def held(name: str, version: int) -> list[dict]:
    return [{"dataset": name, "version": version, "part": (0, 0), "nbytes": 80, "stats": None}]


def test_a_drop_written_but_never_told_has_its_holders_register_at_the_next_start(tmp_path):
    state = started(tmp_path / "c.sqlite")
    version = put(state, "d", ["n0", "n1"])
    assert sorted(n.node_id for n in state.drop("d")) == ["n0", "n1"]
    state.close()  # the catalog dies before any node heard of the drop
    again = CatalogState(tmp_path / "c.sqlite")
    assert not again.heartbeat("n0") and not again.heartbeat("n1")  # refused: they register again
    assert again.heartbeat("n2")  # it held nothing of it
    began = time.time()
    page = Registration("n0", "grpc://10.0.0.0:1", "10.0.0.0", 0, None, held("d", version))
    orphans, _seal, _gone = again.register_node(page)
    assert orphans == [("d", version)]  # the registration tells it to delete the files
    again.registered("n0", began)
    again.close()
    third = CatalogState(tmp_path / "c.sqlite")
    assert third.heartbeat("n0") and not third.heartbeat("n1")  # n1 has not registered yet
    third.close()


def test_nodes_that_acknowledged_the_drop_are_not_made_to_register(tmp_path):
    state = started(tmp_path / "c.sqlite")
    put(state, "d", ["n0", "n1"])
    state.drop("d")
    state.told(["n0", "n1", "n2"], order_key("d", None))
    assert all(taken_after_a_restart(state, tmp_path / "c.sqlite").values())


def test_acknowledging_one_drop_does_not_clear_another_still_on_its_way(tmp_path):
    state = started(tmp_path / "c.sqlite")
    put(state, "a", ["n0"])
    put(state, "b", ["n0"])
    state.drop("a")
    state.drop("b")
    state.told(["n0"], order_key("b", None))  # b's order reached n0 first; a's had not when the catalog died
    assert not taken_after_a_restart(state, tmp_path / "c.sqlite")["n0"]


def test_a_registration_clears_only_what_was_written_before_it_began(tmp_path):
    state = started(tmp_path / "c.sqlite")
    put(state, "d", ["n1"])
    began = time.time()
    # it told n1 nothing of d's drop
    state.register_node(Registration("n1", "grpc://10.0.0.1:1", "10.0.0.1", 1, None, []))
    time.sleep(0.01)
    state.drop("d")  # written while the registration was under way
    state.registered("n1", began)
    assert not taken_after_a_restart(state, tmp_path / "c.sqlite")["n1"]


def test_a_node_that_owes_a_registration_keeps_owing_it_across_a_restart_and_an_acknowledged_order(tmp_path):
    state = started(tmp_path / "c.sqlite")
    state.must_register("n2")  # it missed an order (it did not answer)
    put(state, "d", ["n1", "n2"])
    state.drop("d")
    state.told(["n1", "n2"], order_key("d", None))  # n2 acknowledged this one, but still owes the registration
    taken = taken_after_a_restart(state, tmp_path / "c.sqlite")
    assert taken["n1"] and not taken["n2"]


def test_an_aborted_pending_version_has_every_node_register_until_told(tmp_path):
    state = started(tmp_path / "c.sqlite")
    version = state.begin("p")
    assert sorted(n.node_id for n in state.abort("p", version)) == ["n0", "n1", "n2"]  # any may hold its files
    assert not any(taken_after_a_restart(state, tmp_path / "c.sqlite").values())
