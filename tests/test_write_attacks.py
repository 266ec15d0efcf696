"""Racing writers and frozen nodes: no acknowledged write is lost, and every write returns by its deadline.

Real daemons, each on a loopback address of its own. Two writers are two ``Client`` objects in two
threads released by one barrier, so their reads of the latest version and
their commits interleave as two users' would. A frozen node is a node
process stopped with SIGSTOP (it keeps its sockets open and answers
nothing), continued with SIGCONT in a ``finally``.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.client import reshape
from flightpart.io.errors import translated
from flightpart.local.cluster import LocalCluster
from flightpart.wire import Abort, Begin, Commit, LinkPart, Relink

from helpers import code_of, wait_until

ROUNDS = 10
TIMEOUT = 5.0
"""The client timeout of the frozen-node tests: short, so a failure to honour it shows quickly."""
RETURN_BOUND = 6 * TIMEOUT
"""How long a write may take with a frozen node before the test calls it hung (no assertion on exact times)."""


def rows(start: int, n: int) -> pa.Table:
    k = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": k, "x": k * 0.5})


def ids_of(ds: Any) -> list[int]:
    return sorted(ds.to_arrow().column("id").to_pylist())


def race(*writes: Callable[[], Any]) -> list[tuple[str, Any]]:
    """Run ``writes`` at the same moment, one thread each; ("ok", result) or ("error", exception) per write."""
    barrier = threading.Barrier(len(writes))
    outcomes: list[tuple[str, Any]] = [("hung", None)] * len(writes)

    def run(k: int) -> None:
        barrier.wait()
        try:
            outcomes[k] = ("ok", writes[k]())
        except Exception as exc:  # what the user would see, checked by the test
            outcomes[k] = ("error", exc)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(len(writes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(kind != "hung" for kind, _ in outcomes), outcomes
    return outcomes


@pytest.fixture(scope="module")
def shared(make_cluster):
    """One cluster for the racing tests (none of them kills or freezes a daemon)."""
    with make_cluster(3, process=True) as c:
        yield c


@pytest.fixture(scope="module")
def writers(shared):
    """Two independent clients: two users writing to the same cluster."""
    with fp.connect(shared.uri) as a, fp.connect(shared.uri) as b:
        yield a, b


# --------------------------------------------------------------------------- racing writers


def test_ten_rounds_of_two_racing_appends_keep_all_twenty(writers):
    a, b = writers
    a.put("race-appends", rows(0, 30))
    expected = set(range(30))
    for r in range(ROUNDS):
        first, second = rows(1000 + 200 * r, 7), rows(1100 + 200 * r, 5)
        outcomes = race(partial(a.append, "race-appends", first), partial(b.append, "race-appends", second))
        assert [kind for kind, _ in outcomes] == ["ok", "ok"], outcomes
        for (_, ds), new in zip(outcomes, (first, second)):  # each acknowledged version holds its own rows
            assert set(new.column("id").to_pylist()) <= set(ids_of(ds))
        assert outcomes[0][1].version != outcomes[1][1].version
        expected |= set(first.column("id").to_pylist()) | set(second.column("id").to_pylist())
        latest = a.open("race-appends")
        assert ids_of(latest) == sorted(expected), (f"round {r}: an acknowledged append is missing from "
                                                    f"v{latest.version}")
    assert len(expected) == 30 + ROUNDS * 12


def test_racing_repartition_and_append_keep_the_appended_rows(writers):
    a, b = writers
    a.put("race-reshape", rows(0, 300), tiling=(3, 1))
    for r in range(3):
        new = rows(10_000 + 100 * r, 40)
        outcomes = race(partial(a.repartition, "race-reshape", tiling=(2 + r, 1)),
                        partial(b.append, "race-reshape", new))
        assert [kind for kind, _ in outcomes] == ["ok", "ok"], outcomes
        latest = a.open("race-reshape")
        assert set(new.column("id").to_pylist()) <= set(ids_of(latest)), f"round {r}: the append was lost"
        assert len(ids_of(latest)) == 300 + 40 * (r + 1)
        repartitioned, appended = outcomes[0][1], outcomes[1][1]
        if repartitioned.version > appended.version:  # planned again from the append: it keeps its rows
            assert set(new.column("id").to_pylist()) <= set(ids_of(repartitioned))
            assert repartitioned.__partitioned__["partition_tiling"] == (2 + r, 1)


def test_a_put_racing_an_append_replaces_or_takes_the_append_on_top(writers):
    a, b = writers
    for r in range(3):
        name = f"race-put-{r}"
        a.put(name, rows(0, 50))
        replacement, new = rows(5000, 20), rows(9000, 6)
        outcomes = race(partial(a.put, name, replacement), partial(b.append, name, new))
        assert [kind for kind, _ in outcomes] == ["ok", "ok"], outcomes
        put, appended = outcomes[0][1], outcomes[1][1]
        latest = a.open(name)
        assert latest.version == max(put.version, appended.version)  # the last commit is the latest
        if appended.version > put.version:  # the append was computed again on top of the put
            assert ids_of(latest) == sorted(replacement.column("id").to_pylist() + new.column("id").to_pylist())
        else:  # the append committed first; the put replaced the dataset after it (a replace, as documented)
            assert ids_of(latest) == replacement.column("id").to_pylist()
            assert set(new.column("id").to_pylist()) <= set(ids_of(a.open(name, appended.version)))


def test_an_append_racing_a_drop_is_never_acknowledged_into_a_dropped_dataset(shared, writers):
    a, b = writers
    for r in range(3):
        name = f"race-drop-{r}"
        a.put(name, rows(0, 50))
        before = a.versions(name)[-1]
        new = rows(7000, 9)
        outcomes = race(partial(a.drop, name), partial(b.append, name, new))
        assert outcomes[0][0] == "ok", outcomes
        kind, result = outcomes[1]
        if kind == "error":  # the drop came first: the append says the dataset is gone, nothing is published
            assert isinstance(result, fp.DatasetNotFound), repr(result)
        else:  # the append came first, on top of the version it read; the drop removed it afterwards
            assert result.version > before
        with pytest.raises(fp.DatasetNotFound):
            a.open(name)
        with pytest.raises(fp.DatasetNotFound):
            a.open(name, before)
        assert name not in {e.name for e in a.list()}
        for ip in shared.ips[:3]:  # nor does any node keep a file the append wrote meanwhile
            folder = shared.root / f"node-{ip}" / "datasets" / name
            wait_until(lambda folder=folder: not folder.exists() or not any(folder.glob("v*")),
                       what=f"no file of {name} left on {ip}")


def test_a_drop_in_the_middle_of_an_append_fails_it_and_leaves_no_file(shared, writers):
    """The append has stored part of its stream when the dataset is dropped under it; the rest arrives after the
    drop."""
    a, b = writers
    a.put("drop-mid", rows(0, 50))
    received = lambda: sum(a.stats(n.uri).values["bytes_received"] for n in shared.nodes)  # noqa: E731
    before = received()
    dropped = threading.Event()
    new = rows(8000, 20)

    def slow_stream():
        yield from new.slice(0, 10).to_batches()
        dropped.wait(60)  # a user's slow source: the rest comes once the drop has returned
        yield from new.slice(10).to_batches()

    outcome: dict[str, Any] = {}

    def append() -> None:
        try:
            outcome["ok"] = b.append("drop-mid", pa.RecordBatchReader.from_batches(new.schema, slow_stream()),
                                     rows_per_partition=5)
        except Exception as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=append, daemon=True)
    worker.start()
    try:
        wait_until(lambda: received() > before, what="the append to store its first rows")
        a.drop("drop-mid")
    finally:
        dropped.set()
    worker.join(120)
    assert isinstance(outcome.get("error"), fp.DatasetNotFound), outcome
    with pytest.raises(fp.DatasetNotFound):
        a.open("drop-mid")
    for ip in shared.ips[:3]:
        folder = shared.root / f"node-{ip}" / "datasets" / "drop-mid"
        wait_until(lambda folder=folder: not folder.exists() or not any(folder.glob("v*")),
                   what=f"no file of the dropped dataset left on {ip}")


def test_racing_stream_and_frame_appends_keep_both(shared, writers):
    """A stream is read once: its rows wait under a staging version and are linked into whichever version wins."""
    a, b = writers
    a.put("race-stream", rows(0, 40))
    expected = set(range(40))
    for r in range(5):
        stream_rows, frame_rows = rows(20_000 + 100 * r, 30), rows(30_000 + 100 * r, 3)
        reader = pa.RecordBatchReader.from_batches(stream_rows.schema, stream_rows.to_batches(max_chunksize=10))
        outcomes = race(partial(a.append, "race-stream", reader, rows_per_partition=10),
                        partial(b.append, "race-stream", frame_rows))
        assert [kind for kind, _ in outcomes] == ["ok", "ok"], outcomes
        expected |= set(stream_rows.column("id").to_pylist()) | set(frame_rows.column("id").to_pylist())
        latest = a.open("race-stream")
        assert ids_of(latest) == sorted(expected), f"round {r}: an acknowledged append is missing"
        assert latest.to_arrow().sort_by("id").equals(  # the rows themselves, not only their ids
            pa.concat_tables([rows(0, 40)] + [t for k in range(r + 1) for t in
                                              (rows(20_000 + 100 * k, 30), rows(30_000 + 100 * k, 3))]).sort_by("id"))
    for ip in shared.ips[:3]:  # the staging versions are gone; only published ones are kept
        folder = shared.root / f"node-{ip}" / "datasets" / "race-stream"
        published = {f"v{v}" for v in a.versions("race-stream")}
        wait_until(lambda folder=folder, published=published: {d.name for d in folder.glob("v*")} <= published,
                   what=f"only published versions left on {ip}")


def test_the_catalog_refuses_a_commit_on_a_stale_base_or_behind_a_newer_version(writers):
    """The check itself, step by step: a version built from v1 cannot be published once v1 is no longer the latest."""
    a, b = writers
    a.put("stale-base", rows(0, 60), tiling=(2, 1))
    source = a.info("stale-base")
    version = a.call(Begin("stale-base")).version
    spans = {p.position: (p.start[0], p.start[0] + p.shape[0]) for p in source.parts}
    holders = reshape.live_holders(source, [n for n in a.nodes() if n.alive])
    parts = tuple(reshape.assemble_on_nodes(a.pool, source, version, source.grid[1], spans, holders))
    appended = b.append("stale-base", rows(500, 4))  # another writer commits on top of v1 first
    assert appended.version > version
    for base in (source.version, None):  # an append-like write from v1, and a put-like replace behind the newer version
        commit = Commit("stale-base", version, source.schema, source.shape, source.grid, parts, 1, base=base)
        with pytest.raises(fp.VersionConflict) as info:
            a.call(commit)
        assert info.value.field == "commit.base" and code_of(info.value.__cause__) == "VERSION_CONFLICT"
    a.call(Abort("stale-base", version))
    assert a.versions("stale-base") == [source.version, appended.version]
    assert ids_of(a.open("stale-base")) == list(range(60)) + [500, 501, 502, 503]


def test_a_relink_order_cannot_touch_a_committed_version_or_invent_a_partition(shared, writers):
    a, _ = writers
    first = a.put("relink-guard", rows(0, 30), tiling=(1, 1), nodes=[shared.nodes[0].uri])
    second = a.put("relink-guard", rows(100, 30), tiling=(1, 1), nodes=[shared.nodes[0].uri])
    node = shared.nodes[0].uri
    into_committed = Relink("relink-guard", first.version, second.version, (LinkPart((0, 0), (1, 0)),))
    with pytest.raises(fp.VersionConflict):
        _relink(a, node, into_committed)
    pending = a.call(Begin("relink-guard")).version
    with pytest.raises(fp.PartitionMissing):
        _relink(a, node, Relink("relink-guard", first.version, pending, (LinkPart((5, 0), (0, 0)),)))
    a.call(Abort("relink-guard", pending))
    assert ids_of(a.open("relink-guard", second.version)) == list(range(100, 130))


def _relink(client: Any, uri: str, order: Relink) -> Any:
    with translated():
        return client.pool.action(uri, order)


# --------------------------------------------------------------------------- deadlines with a frozen node


@pytest.fixture(scope="module")
def frozen_cluster(make_cluster):
    """Its own cluster (nodes are frozen here); the catalog counts a silent node alive for long, so writes still pick
    it."""
    with make_cluster(3, process=True, dead_after=600.0) as c:
        with fp.connect(c.uri) as setup:
            setup.put("fz-reshape", rows(0, 3000), tiling=(3, 1))
            setup.put("fz-append", rows(0, 3000), tiling=(3, 1))
            setup.put("fz-balance", rows(0, 3000), tiling=(6, 1), nodes=[n.uri for n in c.nodes[1:]])
        yield c


def _warm(client: Any, cluster: LocalCluster) -> Any:
    """A client that already holds a connection to every node (and the catalog)."""
    for node in cluster.nodes:
        client.stats(node.uri)
    return client


OPERATIONS = {
    "repartition": ("fz-reshape", lambda c, r: c.repartition("fz-reshape", tiling=(4 + r, 1))),
    "append": ("fz-append", lambda c, r: c.append("fz-append", rows(100_000 + 100 * r, 30))),
    "rebalance": ("fz-balance", lambda c, r: c.rebalance("fz-balance")),
}


@pytest.mark.slow
@pytest.mark.parametrize("warm", [False, True], ids=["fresh-client", "warm-client"])
@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_a_write_with_a_frozen_target_node_returns_by_its_deadline_and_publishes_nothing_half_done(
        frozen_cluster, operation, warm):
    name, write = OPERATIONS[operation]
    frozen = frozen_cluster.nodes[0]
    with fp.connect(frozen_cluster.uri, timeout=TIMEOUT) as client:
        if warm:
            _warm(client, frozen_cluster)
        before_versions = client.versions(name)
        before = ids_of(client.open(name))
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["ok"] = write(client, int(warm))
            except Exception as exc:
                outcome["error"] = exc

        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            worker = threading.Thread(target=run, daemon=True)
            worker.start()
            worker.join(RETURN_BOUND)
            returned = not worker.is_alive()
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        assert returned, f"{operation} with a frozen node did not return within {RETURN_BOUND:g} s"
        if "error" in outcome:
            error = outcome["error"]
            assert isinstance(error, fp.NodeUnavailable), repr(error)
            assert frozen.uri in str(error) or frozen.uri.split("//")[-1].split(":")[0] in str(error), str(error)
            assert client.versions(name) == before_versions, "a failed write published a version"
            assert ids_of(client.open(name)) == before
        else:  # it finished without the frozen node: a whole new version
            ds = outcome["ok"]
            assert client.versions(name)[-1] == ds.version
            assert set(before) <= set(ids_of(ds))


def test_a_writer_beginning_versions_in_a_loop_is_refused_past_its_share_and_others_go_on(tmp_path, new_cluster):
    """A writer that began versions in a loop (some 130 a second) kept a row of state each until the pending TTL,
    whose cleanup it outran without end. Past ``$FLIGHTPART_PENDING_PER_WRITER`` versions begun and neither committed
    nor aborted it is refused LIMIT_EXCEEDED, and nothing more is recorded; another writer, and the owner, begin as
    before, and the writer begins again once it aborted one."""
    from flightpart import tokens

    secret = tokens.new_secret()
    (tmp_path / "secret").write_text(secret + "\n")
    (tmp_path / "secret").chmod(0o600)
    with new_cluster(1, process=True, root=tmp_path / "c", env={"FLIGHTPART_PENDING_PER_WRITER": "5"},
                      extra_args=["--secret-file", str(tmp_path / "secret")]) as c, \
            fp.connect(c.uri, token=tokens.role_token(secret.encode(), "writer", "mallory")) as mallory, \
            fp.connect(c.uri, token=tokens.role_token(secret.encode(), "writer", "alice")) as alice, \
            fp.connect(c.uri, token=secret) as owner:
        held = [mallory.call(Begin(f"flood-{k % 2}")).version for k in range(5)]
        with pytest.raises(fp.LimitExceeded, match=r"mallory holds as many versions begun .*\(5; "):
            mallory.call(Begin("flood-0"))
        assert alice.call(Begin("flood-0")).version > max(held)  # another writer is not held to mallory's share
        assert [owner.call(Begin("flood-1")).version for _ in range(6)]  # nor is the owner
        mallory.call(Abort("flood-0", held[0]))
        mallory.call(Begin("flood-0"))  # one aborted: one more may be begun
        with pytest.raises(fp.LimitExceeded):
            mallory.call(Begin("flood-1"))
        ds = alice.put("after-flood", pa.table({"x": [1, 2, 3]}))
        assert ds.to_arrow()["x"].to_pylist() == [1, 2, 3]
