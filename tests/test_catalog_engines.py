"""The catalog's state rules give the same answers on SQLite and on PostgreSQL.

One scenario drives every method of :class:`CatalogState` (register, begin,
commit, SPMD publish, abort, drop, tombstones and manifests from a node,
replicas, heartbeats, retirement, pending expiry) and records what each
answers; the transcript on a real PostgreSQL must equal SQLite's. Then the
PostgreSQL-only parts: a write is refused once the lease row names another
epoch, and reads answer from memory while the database is away.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from flightpart.errors import DatasetNotFound, FlightpartError, NotLeader, StateUnavailable
from flightpart.local.postgres import LocalPostgres, missing_reason
from flightpart.server.state import CatalogState
from flightpart.server.state.database import LEASE_TABLE, PostgresDatabase
from flightpart.server.state.records import OnTop, PartRecord, Registration, VersionRecord
from flightpart.wire import Tombstones

needs_postgres = pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason()))
SCHEMA = pa.schema([("x", pa.int64())]).serialize().to_pybytes()


@pytest.fixture(scope="module")
def postgres():
    if missing_reason() is not None:
        pytest.skip(str(missing_reason()))
    with LocalPostgres() as pg:
        yield pg


def leased(url: str, epoch: int = 1) -> PostgresDatabase:
    """A database this test leads with ``epoch`` (the lease row written by hand)."""
    db = PostgresDatabase(url, fence=lambda: epoch)
    db.script(LEASE_TABLE)
    db.execute("INSERT INTO flightpart_lease VALUES(1, 'test', 'grpc://test:1', ?, clock_timestamp() + "
               "interval '1 hour', clock_timestamp()) ON CONFLICT(id) DO UPDATE SET epoch = excluded.epoch", (epoch,))
    return db


def scenario(state: CatalogState) -> list:
    """Every rule once; what each call answered (errors by code)."""
    out: list = []

    def note(label: str, call) -> None:
        try:
            value = call()
        except FlightpartError as exc:
            value = ("error", exc.code, exc.field)
        out.append((label, _plain(value)))

    note("cluster before", state.cluster)
    note("adopt", lambda: state.adopt_cluster("c1"))
    note("mint keeps", lambda: state.mint_cluster("other"))
    for k in range(3):
        page = Registration(f"n{k}", f"grpc://10.0.0.{k}:1", f"10.0.0.{k}", 100 + k, f"/d{k}", [])
        note(f"register n{k}", lambda page=page: state.register_node(page))
    nodes = {n.node_id: n for n in state.nodes()}

    def parts(count: int, holders: list[list[str]]) -> list[PartRecord]:
        return [PartRecord((i, 0), (10 * i, 0), (10, 1), 80 + i, [nodes[h] for h in holders[i]], {"x": {"min": i}})
                for i in range(count)]

    note("begin 1", lambda: state.begin("d"))
    note("commit 1", lambda: state.commit("d", 1, SCHEMA, (30, 1), (3, 1), parts(3, [["n0", "n1"], ["n1"], ["n2"]]),
                                          replicas=2, on_top=OnTop(None)))
    note("commit 1 again", lambda: state.commit("d", 1, SCHEMA, (30, 1), (3, 1), parts(3, [["n0"], ["n1"], ["n2"]])))
    note("version 1", lambda: state.version("d", 1))
    note("latest", lambda: state.latest("d"))
    note("begin 2", lambda: state.begin("d"))
    note("begin 3", lambda: state.begin("d"))
    note("commit 3 on 1", lambda: state.commit("d", 3, SCHEMA, (10, 1), (1, 1), parts(1, [["n0"]]),
                                               on_top=OnTop(1)))
    note("commit 2 on 1 (stale)", lambda: state.commit("d", 2, SCHEMA, (10, 1), (1, 1), parts(1, [["n0"]]),
                                                       on_top=OnTop(1)))
    note("abort 2", lambda: [n.node_id for n in state.abort("d", 2)])
    note("state 2", lambda: state.version_state("d", 2))
    note("sealed everywhere", lambda: state.sealed_everywhere("d", 3))
    note("add replica", lambda: state.add_replica("d", 3, (0, 0), "n1"))
    note("add replica again", lambda: state.add_replica("d", 3, (0, 0), "n1"))
    note("remove replica", lambda: state.remove_replica("d", 3, (0, 0), "n0"))
    note("remove replica again", lambda: state.remove_replica("d", 3, (0, 0), "n0"))
    note("version 3", lambda: state.version("d"))
    note("versions", lambda: state.versions_of("d"))
    note("datasets", lambda: [r.dataset for r in state.datasets()])
    note("all versions", lambda: [(r.dataset, r.version) for r in state.all_versions()])
    # SPMD publish: two ranks join one pending version
    note("join 0", lambda: state.join_publish("s", 2, 0))
    note("rank 0", lambda: state.add_rank_part("s", 1, 0, 5, 1, 40, "n0", SCHEMA))
    note("join 1", lambda: state.join_publish("s", 2, 1))
    note("rank 1", lambda: state.add_rank_part("s", 1, 1, 7, 1, 56, "n1", SCHEMA))
    note("rank 1 again", lambda: state.add_rank_part("s", 1, 1, 7, 1, 56, "n2", SCHEMA))
    note("rank parts", lambda: state.rank_parts("s", 1))
    note("schema", lambda: state.version_schema("s", 1))
    # drops: one version, then all; numbers are never handed out again
    note("drop 1", lambda: sorted(n.node_id for n in state.drop("d", 1)))
    note("drop 1 again", lambda: state.drop("d", 1))
    note("drop all", lambda: sorted(n.node_id for n in state.drop("d")))
    note("floor", lambda: state.dropped_through("d"))
    note("latest after drop", lambda: state.latest("d"))
    note("begin after drop", lambda: state.begin("d"))
    # a node back with tombstones, a manifest of a version this state never saw, and unsealed files
    manifest = VersionRecord("m", 4, SCHEMA, (10, 1), (1, 1), [PartRecord((0, 0), (0, 0), (10, 1), 0, [])])
    note("register with news", lambda: state.register_node(Registration(
        "n3", "grpc://10.0.0.3:1", "10.0.0.3", 103, None,
        [{"dataset": "m", "version": 4, "part": (0, 0), "nbytes": 99, "stats": None},
         {"dataset": "p", "version": 7, "part": (0, 0), "nbytes": 5, "stats": None},
         {"dataset": "s", "version": 9, "part": (0, 0), "nbytes": 5, "stats": None}],
        manifests=[manifest], versions=[("m", 4), ("p", 7), ("s", 9)], sealed_versions=[("m", 4)],
        granted={("m", 4, (0, 0))}, tombstones=[Tombstones("s", 0, (9,), ()), Tombstones("q", 5, (), ())])))
    note("manifest version", lambda: state.version("m", 4))
    note("found pending", lambda: state.version_state("p", 7))
    note("begin p", lambda: state.begin("p"))
    note("begin q", lambda: state.begin("q"))
    note("expired pending", lambda: state.expired_pending(-1.0))
    # heartbeats in memory, then flushed; silence retires a node
    note("heartbeat", lambda: [state.heartbeat(f"n{k}", 1 << 30, k == 1, 0.5) for k in range(5)])
    note("flush", state.flush_heartbeats)
    note("nodes", lambda: [(n.node_id, n.uri, n.alive, n.free_bytes, n.low_space) for n in state.nodes()])
    note("retire none", lambda: state.retire_dead(3600))
    note("ping", state.ping)
    return out


def _plain(value):
    """A transcript entry without times or object identities: what both engines must agree on."""
    if isinstance(value, VersionRecord):
        return (value.dataset, value.version, bytes(value.schema), value.shape, value.grid, value.replicas,
                [(p.part, p.start, p.shape, p.nbytes, [n.node_id for n in p.nodes], p.stats) for p in value.parts])
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, memoryview)):
        return bytes(value)
    return value


@needs_postgres
@pytest.mark.parametrize("encoding", [None, "SQL_ASCII"])  # SQL_ASCII: a server made without a locale (minimal images)
def test_the_state_rules_answer_the_same_on_postgresql_as_on_sqlite(tmp_path, postgres, encoding):
    on_sqlite = CatalogState(tmp_path / "state.sqlite")
    on_postgres = CatalogState(database=leased(postgres.database(f"engines_{encoding}", encoding)))
    try:
        expected, got = scenario(on_sqlite), scenario(on_postgres)
    finally:
        on_sqlite.close()
        on_postgres.close()
    assert [label for label, _ in got] == [label for label, _ in expected]
    for (label, want), (_, have) in zip(expected, got):
        assert have == want, label
    # the scenario did reach its interesting corners
    answers = dict(expected)
    assert answers["commit 2 on 1 (stale)"][:2] == ["error", "VERSION_CONFLICT"]
    assert answers["begin after drop"] == 4 and answers["floor"] == 3
    assert answers["found pending"] == ["pending", None] and answers["begin q"] == 6


@needs_postgres
def test_a_write_under_a_lost_lease_is_refused_and_reads_answer_from_memory_while_the_database_is_away(postgres):
    url = postgres.database("fence")
    epoch = [1]
    state = CatalogState(database=leased(url))
    state.database.fence = lambda: epoch[0]
    state.register_node(Registration("n0", "grpc://10.0.0.1:1", "10.0.0.1", 1, None, []))
    nodes = {n.node_id: n for n in state.nodes()}
    state.begin("d")
    state.commit("d", 1, SCHEMA, (10, 1), (1, 1), [PartRecord((0, 0), (0, 0), (10, 1), 80, [nodes["n0"]])])
    remembered = state.version("d")
    # another catalog takes the lease (epoch 2): this one's writes are refused, nothing changes
    other = leased(url, epoch=2)
    with pytest.raises(NotLeader):
        state.begin("d")
    with pytest.raises(NotLeader):
        state.drop("d")
    other.close()
    epoch[0] = 2
    assert state.latest("d") == 1 and state.versions_of("d") == [1]
    # the database goes away: what was read answers; writes and unread things are StateUnavailable
    postgres.pause()
    try:
        assert state.latest("d") == 1 and state.version("d").parts[0].nbytes == remembered.parts[0].nbytes
        assert [n.node_id for n in state.nodes()] == ["n0"] and not state.ping()
        with pytest.raises(StateUnavailable):
            state.begin("d")
        with pytest.raises(StateUnavailable):
            state.versions_of("never-read")
    finally:
        postgres.start()
    deadline = time.monotonic() + 30
    while True:  # the connection is made again at the next call
        try:
            assert state.begin("d") == 2
            break
        except StateUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with pytest.raises(DatasetNotFound):
        state.latest("never-read")
    state.close()


@needs_postgres
def test_a_node_registering_again_with_nothing_new_leaves_what_answers_while_the_database_is_away(postgres):
    """Nodes register again routinely (a missed seal, the cluster's identity learned after the first write): when
    nothing they bring is new, what answers opens from memory stays; a new node makes the node list be read again."""
    state = CatalogState(database=leased(postgres.database("again")))
    held = [{"dataset": "d", "version": 1, "part": (0, 0), "nbytes": 80, "stats": None}]
    # d v1 learned from n0's manifest, as a catalog rebuilding lost state learns it: the only kind of version a
    # node's tombstone drops (one a writer committed is kept, see tests/test_trust_attacks.py)
    manifest = VersionRecord("d", 1, SCHEMA, (10, 1), (1, 1), [PartRecord((0, 0), (0, 0), (10, 1), 80, [])])
    state.register_node(Registration("n0", "grpc://10.0.0.1:1", "10.0.0.1", 1, None, held, manifests=[manifest],
                                     versions=[("d", 1)], sealed_versions=[("d", 1)], granted={("d", 1, (0, 0))}))
    state.adopt_cluster("c1")
    assert state.latest("d") == 1 and len(state.version("d", 1).parts) == 1 and len(state.nodes()) == 1  # read once
    assert state.register_node(Registration("n0", "grpc://10.0.0.1:1", "10.0.0.1", 1, None, held, versions=[("d", 1)],
                               sealed_versions=[("d", 1)])) == ([], [], [])
    state.adopt_cluster("c1")
    postgres.pause()
    try:
        assert state.latest("d") == 1 and state.version("d", 1).parts[0].nodes[0].node_id == "n0"
        assert [n.node_id for n in state.nodes()] == ["n0"]
    finally:
        postgres.start()
    _until_it_answers(lambda: state.register_node(Registration("n1", "grpc://10.0.0.2:1", "10.0.0.2", 2, None, [])))
    postgres.pause()
    try:  # the cluster changed: its node list is not answered from memory, the dataset's latest version still is
        assert state.latest("d") == 1
        with pytest.raises(StateUnavailable):
            state.nodes()
    finally:
        postgres.start()
    assert sorted(n.node_id for n in _until_it_answers(state.nodes)) == ["n0", "n1"]
    # a registration that changes the dataset (its node heard it dropped) makes the memory forget it: during the
    # next outage the dropped version is never answered from memory
    assert state.latest("d") == 1 and len(state.version("d", 1).parts) == 1
    assert state.register_node(Registration("n0", "grpc://10.0.0.1:1", "10.0.0.1", 1, None, held, versions=[("d", 1)],
                               sealed_versions=[("d", 1)], tombstones=[Tombstones("d", 0, (1,), ())]))[2] == [("d", 1)]
    postgres.pause()
    try:
        for read in (lambda: state.latest("d"), lambda: state.version("d", 1)):
            with pytest.raises(StateUnavailable):
                read()
    finally:
        postgres.start()
    with pytest.raises(DatasetNotFound):
        _until_it_answers(lambda: state.latest("d"))
    state.close()


def _until_it_answers(call, seconds: float = 30):
    """``call()`` once the database answers again (the connection is made again at the next call)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except StateUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@needs_postgres
def test_a_writers_pending_share_holds_on_postgresql(postgres):
    from flightpart.errors import LimitExceeded

    state = CatalogState(database=leased(postgres.database("pending_share")))
    try:
        held = [state.begin("d", writer="writer:w", most_pending=2) for _ in range(2)]
        with pytest.raises(LimitExceeded):
            state.begin("e", writer="writer:w", most_pending=2)
        with pytest.raises(LimitExceeded):
            state.join_publish("job", 2, 0, writer="writer:w", most_pending=2)
        state.begin("d", writer="writer:other", most_pending=2)
        state.abort("d", held[0])
        state.begin("e", writer="writer:w", most_pending=2)
    finally:
        state.close()


@needs_postgres
def test_a_catalog_starts_beside_a_write_in_flight_without_waiting_for_it(postgres):
    """The schema's CREATE INDEX IF NOT EXISTS locked the versions table before it looked whether the index existed:
    a catalog starting beside a leader with a write in flight waited for it (and queued the writes after it), and
    past the 10 s lock timeout failed to start as busy. An index that exists is now left alone."""
    import psycopg

    url = postgres.database("starting_beside")
    first = CatalogState(database=leased(url))
    writer = psycopg.connect(url)
    try:
        first.begin("d")  # the tables and the index exist
        writer.execute("BEGIN")
        writer.execute("UPDATE versions SET created = created WHERE dataset = 'd'")  # a write in flight: its lock held
        second = CatalogState(database=leased(url))  # refused as busy after the lock timeout, before
        try:
            assert second.begin("e") > 0
        finally:
            second.close()
    finally:
        writer.rollback()
        writer.close()
        first.close()
