"""A node's side of the fencing: the highest catalog epoch it obeyed, kept on disk, decides which orders it takes."""

from __future__ import annotations

from flightpart.server.store import PartitionStore


def test_a_node_obeys_no_lower_epoch_and_none_once_it_followed_a_leased_catalog_even_after_a_restart(tmp_path):
    store = PartitionStore(tmp_path / "node")
    assert store.obey_epoch(None)  # a catalog without a lease, before any leased one: obeyed
    assert store.obey_epoch(3) and store.epoch == 3
    assert store.obey_epoch(3) and store.obey_epoch(5) and store.epoch == 5
    assert not store.obey_epoch(4)  # a deposed leader's order
    assert not store.obey_epoch(None)  # an order carrying no epoch, once a leased catalog was followed
    store.join_cluster("c1")  # the marker keeps the epoch when the cluster is recorded after it
    again = PartitionStore(tmp_path / "node")  # a restart: the epoch was on disk before the order ran
    assert again.epoch == 5 and again.cluster == "c1"
    assert not again.obey_epoch(4) and again.obey_epoch(6) and again.epoch == 6
