"""Right after a start or a takeover the catalog waits for nodes it has not heard from yet (they may be alive, their
last beats only flushed long ago), for ``dead_after`` at most. A node already dead when the heartbeats were last
written is not waited for: a node decommissioned but not yet retired held every node list (so every put) after a
catalog start for the whole ``dead_after``. After a takeover that holds only once the new leader's announcement went
out: the old leader may have been cut off from nodes that are alive."""

from __future__ import annotations

import time

from flightpart.server.state import CatalogState
from flightpart.server.state.records import Registration

DEAD_AFTER = 6.0  # the asserts on what is unsettled run within it of a start, however loaded the machine


def two_nodes_one_dead_at_the_flush(path) -> None:
    state = CatalogState(path, dead_after=DEAD_AFTER)
    for k in range(2):
        state.register_node(Registration(f"n{k}", f"grpc://10.0.0.{k}:1", f"10.0.0.{k}", k, None, []))
    time.sleep(DEAD_AFTER + 0.2)
    assert state.heartbeat("n1")  # n0 stays silent: dead when the beats are written
    state.flush_heartbeats()
    state.close()


def test_a_node_dead_at_the_last_flush_is_not_waited_for_after_a_restart(tmp_path):
    two_nodes_one_dead_at_the_flush(tmp_path / "c.sqlite")
    again = CatalogState(tmp_path / "c.sqlite", dead_after=DEAD_AFTER)
    assert again.unheard() == {"n1"}  # alive at the flush: not known dead until it beats or dead_after passes
    assert again.unsettled_for() > 0
    assert again.heartbeat("n1")
    assert again.unheard() == set() and again.unsettled_for() == 0.0
    assert [(n.node_id, n.alive) for n in again.nodes()] == [("n0", False), ("n1", True)]
    # a takeover: every node not heard from is waited for until the announcement went out
    again.take_over()
    assert again.unheard() == {"n0", "n1"}
    again.heard("n1")
    again.announced()
    assert again.unheard() == set()
    again.close()


def test_without_a_flush_every_recorded_node_is_waited_for(tmp_path):
    state = CatalogState(tmp_path / "c.sqlite", dead_after=DEAD_AFTER)
    for k in range(2):
        state.register_node(Registration(f"n{k}", f"grpc://10.0.0.{k}:1", f"10.0.0.{k}", k, None, []))
    again = CatalogState(tmp_path / "c.sqlite", dead_after=DEAD_AFTER)  # the first never flushed (it was killed)
    assert again.unheard() == {"n0", "n1"}
    again.close()
    state.close()
