"""A node is trusted with its own partitions only: attacks by a process holding one node's credential.

The catalog holds the cluster secret; every node runs on its own node token
(``serve --node-token-file``) and the cluster's verify key
(``--verify-key-file``), as docs/operations/security.md deploys them. The
hostile node is a real daemon with a node token of its own, its data
directory prepared with forged partitions and forged manifests.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart import tokens, wire
from flightpart.io.access import Access
from flightpart.io.connections import ConnectionPool
from flightpart.io.errors import translated
from flightpart.io.transfer import send_partition
from flightpart.local.cluster import LocalCluster
from flightpart.server.store import PartitionStore
from flightpart.tokens import manifest_signature, verify_key

from helpers import code_of, free_port, put_raw, raw_action, wait_until

SECRET = tokens.new_secret().encode()
ROWS = 4000


def table_of(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(rows), "x": rng.random(rows)})


def forged_of(rows: int) -> pa.Table:
    return pa.table({"id": np.full(rows, -1), "x": np.full(rows, -1.0)})


def node_token(name: str) -> str:
    return tokens.role_token(SECRET, "node", name)


def credential_file(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def trusted_cluster(make_cluster, root: Path, names: list[str], **kwargs) -> LocalCluster:
    """A catalog with the cluster secret, and nodes that hold only their own token and the verify key, on the first
    addresses of the range ``make_cluster`` gives it."""
    root.mkdir(parents=True, exist_ok=True)
    secret = credential_file(root / "secret", SECRET.decode())
    credential_file(root / "verify-key", verify_key(SECRET).text())
    cluster = make_cluster(0, process=True, root=root, extra_args=["--secret-file", str(secret)], **kwargs)
    try:
        for k, name in enumerate(names):
            add_node(cluster, name, cluster.ips[k])
    except BaseException:
        cluster.stop()
        raise
    return cluster


def add_node(cluster: LocalCluster, name: str, ip: str, data_dir: Path | None = None):
    """A node of ``cluster`` started with its own credential only (the secret stays with the catalog)."""
    token = credential_file(cluster.root / f"{name}.token", node_token(name))
    saved, cluster.extra_args = cluster.extra_args, []
    try:
        return cluster.add_node(ip, heartbeat=0.3, data_dir=data_dir,
                                args=["--node-token-file", str(token), "--verify-key-file",
                                      str(cluster.root / "verify-key")])
    finally:
        cluster.extra_args = saved


def restart_catalog(cluster: LocalCluster) -> None:
    cluster.catalog = cluster.start_catalog()


def alive(client: fp.Client) -> set[str]:
    return {n.node_id for n in client.nodes() if n.alive}


def holders(client: fp.Client, name: str, version: int | None = None) -> set[str]:
    """The IPs of the nodes the catalog lists as replicas of any partition of ``name``."""
    parts = client.open(name, version).__partitioned__["partitions"].values()
    return {location[0] for p in parts for location in p["location"]}


def forged_manifest(dataset: str, version: int, rows: int, parts: int, holder: str, key: bytes | None) -> wire.Commit:
    """A manifest as a sealed one looks, naming ``holder``; signed with ``key`` (not this cluster's), or unsigned."""
    schema = table_of(1).schema
    step = rows // parts
    manifest = wire.Commit(dataset, 1 if version is None else version, schema, (rows, 2), (parts, 1),
                           tuple(wire.CommitPart((k, 0), (k * step, 0), (step, 2), (holder,)) for k in range(parts)), 1)
    if key is None:
        return manifest
    return dataclasses.replace(manifest, signature=manifest_signature(key, manifest.to_json()))


def hostile_data_dir(path: Path, name: str) -> Path:
    """A node directory holding forged rows for every partition of ``victim`` v1, and forged manifests of
    ``victim`` v1 and v2 and of a dataset ``forged`` that no writer ever put."""
    store = PartitionStore(path, node_id=name)
    forged = forged_of(ROWS // 2)
    for version in (1, 2):
        for k in range(2):
            store.write("victim", version, (k, 0), forged.schema, forged.to_batches())
        store.seal(forged_manifest("victim", version, ROWS, 2, name, b"not the cluster secret"))
    store.write("forged", 1, (0, 0), forged.schema, forged.to_batches())
    store.seal(forged_manifest("forged", 1, ROWS // 2, 1, name, None))
    return path


@pytest.fixture(scope="module")
def trusted(tmp_path_factory, make_cluster):
    root = tmp_path_factory.mktemp("trust")
    with trusted_cluster(make_cluster, root / "c", ["n1", "n2"]) as c:
        with fp.connect(c.uri, token=tokens.role_token(SECRET, "writer", "w"), host="127.0.0.99") as writer:
            wait_until(lambda: alive(writer) == {"n1", "n2"}, 30, "both nodes to register with their own tokens")
            writer.put("victim", table_of(ROWS, 1), tiling=(2, 1))
        yield c


def test_nodes_on_their_own_tokens_pull_from_each_other_for_a_repartition(trusted):
    """Assemble: each node pulls its sources from the others with its own node token (read), nothing more."""
    c = trusted
    with fp.connect(c.uri, token=tokens.role_token(SECRET, "writer", "w"), host="127.0.0.99") as writer:
        writer.put("moved", table_of(3000, 4), tiling=(3, 1))
        regridded = writer.repartition("moved", (2, 1))
        assert regridded.__partitioned__["partition_tiling"] == (2, 1)
        assert regridded.to_arrow().equals(table_of(3000, 4))


def reader(c: LocalCluster) -> fp.Client:
    return fp.connect(c.uri, token=tokens.role_token(SECRET, "reader", "r"), host="127.0.0.99")


def test_a_hostile_node_is_not_made_a_replica_and_publishes_nothing(trusted):
    """Forged rows for every partition of a dataset it was never given, a forged manifest of it, of a new
    version of it and of a new dataset: the catalog lists none, reads return the true rows only."""
    c = trusted
    truth = table_of(ROWS, 1)
    with reader(c) as client:
        true_holders = holders(client, "victim")
        evil_dir = hostile_data_dir(c.root / "evil-data", "evil")
        add_node(c, "evil", c.ips[3], data_dir=evil_dir)
        wait_until(lambda: "evil" in alive(client), 30, "the hostile node to register")
        assert holders(client, "victim") == true_holders and c.ips[3] not in true_holders
        for _ in range(3):
            rows = client.open("victim").to_arrow()
            assert rows.num_rows == ROWS and pc_count(rows, -1) == 0  # 4,000 of 4,000, none forged
            assert rows.equals(truth)
        assert client.versions("victim") == [1]           # the forged v2 manifest published nothing
        assert "forged" not in {d.name for d in client.list()}
        with pytest.raises(fp.DatasetNotFound):
            client.open("forged")
    wait_until(lambda: "never placed there" in c.catalog.log(), 10, "the refused claim to be logged")
    log = c.catalog.log()
    assert "did not sign" in log and "forged v1" in log and "victim v2" in log


def pc_count(table: pa.Table, value: int) -> int:
    return int((table.column("id").to_numpy() == value).sum())


def test_a_node_token_cannot_write_drop_repair_commit_or_speak_for_another_node(trusted):
    c = trusted
    evil = node_token("evil")
    manifest = forged_manifest("victim", 7, ROWS, 2, "n1", None)
    with fp.connect(c.uri, token=evil, host="127.0.0.99") as hostile:
        refusals = [
            lambda: hostile.put("by-node", table_of(10)),
            lambda: hostile.drop("victim"),
            lambda: hostile.call(fp.wire.Repair()),
            lambda: hostile.call(manifest),
            lambda: raw_action(hostile, "register-node",
                               {"node_id": "n1", "uri": f"grpc://{c.ips[3]}:1", "ip": c.ips[3], "pid": 1}),
            lambda: hostile.call(fp.wire.Heartbeat("n1")),
        ]
        for refused in refusals:
            with pytest.raises(fp.Forbidden):
                refused()
    node = flight.connect(c.nodes[0].uri)
    as_evil = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {evil}".encode())])
    order = wire.DropFiles("victim", 1, None, False)
    with pytest.raises(flight.FlightError) as info:  # only the catalog orders a node to drop, seal or copy
        list(node.do_action(flight.Action(order.ACTION, order.encode()), options=as_evil))
    assert code_of(info.value) == "FORBIDDEN"
    # nor write to a node: a node token puts nothing (it stored forged rows, which a repair then took as a replica);
    # a copy carries the catalog's grant for that one partition to that one node, and nothing else passes with it
    n1 = c.nodes[0].uri
    wrong_grants = {"a node token": evil,
                    "a grant for another partition": tokens.put_grant(SECRET, "victim", 1, (1, 0), "n1", 2**40),
                    "a grant for another node": tokens.put_grant(SECRET, "victim", 1, (0, 0), "n2", 2**40),
                    "an expired grant": tokens.put_grant(SECRET, "victim", 1, (0, 0), "n1", 1)}
    for what, token in wrong_grants.items():
        pool = ConnectionPool(Access(token=token))
        try:
            with pytest.raises(flight.FlightError) as info:
                send_partition(pool, n1, "victim", 1, (0, 0), forged_of(ROWS // 2))
            assert code_of(info.value) in ("FORBIDDEN", "UNAUTHENTICATED"), what
        finally:
            pool.close()
    # nor can it claim to lead with a huge epoch, which would make the node refuse its real catalog's orders
    lead = wire.Lead(None, 10**9, "grpc://127.0.0.99:1")
    with pytest.raises(flight.FlightError) as info:
        list(node.do_action(flight.Action(lead.ACTION, lead.encode()), options=as_evil))
    assert code_of(info.value) == "FORBIDDEN"
    # the real catalog's orders still go through: a drop of a fresh put
    with fp.connect(c.uri, token=tokens.role_token(SECRET, "admin", "ops"), host="127.0.0.99") as admin:
        admin.put("fenced", table_of(10))
        alive = sum(n.alive for n in admin.nodes())
        assert admin.call(wire.Drop("fenced")).nodes_cleaned == alive > 0  # every live node obeyed the drop
    with reader(c) as client:
        assert client.open("victim").to_arrow().equals(table_of(ROWS, 1))


def test_a_node_cannot_mint_another_role_from_what_it_holds(trusted):
    """All a node has is its token and the verify key: neither signs a token any daemon accepts."""
    c = trusted
    evil = node_token("evil")
    public = verify_key(SECRET).text()
    prefix, role, name, expiry, signature = evil.split(":")
    forgeries = {
        "role swapped": f"{prefix}:admin:{name}:{expiry}:{signature}",
        "name swapped": f"{prefix}:node:catalog:{expiry}:{signature}",
        "signed with the verify key": tokens.role_token(public.encode(), "writer", "evil"),
        "the verify key itself": public,
        "the node token as a secret": tokens.role_token(evil.encode(), "admin", "evil"),
    }
    for token in forgeries.values():
        with fp.connect(c.uri, token=token, host="127.0.0.99") as client:
            with pytest.raises(fp.Unauthenticated):
                client.list()
        node = flight.connect(c.nodes[0].uri)
        options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(node.do_action(flight.Action("stats", b""), options=options))
    # the operator's command will not hand out the catalog's own name among nodes
    run = subprocess.run([sys.executable, "-m", "flightpart", "token", "--role", "node", "--name", "catalog"],
                         env={"FLIGHTPART_SECRET": SECRET.decode(), "PATH": "/usr/bin:/bin"}, capture_output=True,
                         text=True)
    assert run.returncode == 2 and "catalog" in run.stderr


def test_a_node_refuses_to_start_on_another_nodes_directory_or_a_forged_token(trusted, tmp_path):
    c = trusted
    taken = c.root / f"node-{c.ips[0]}"  # n1's directory
    bad = credential_file(tmp_path / "bad.token", node_token("n1")[:-4] + "AAAA")
    for token_file, data_dir in ((credential_file(tmp_path / "n9.token", node_token("n9")), taken),
                                 (bad, tmp_path / "fresh")):
        run = subprocess.run([sys.executable, "-m", "flightpart", "serve", "--host", c.ips[4], "--port", "0",
                              "--data-dir", str(data_dir), "--catalog", c.uri, "--node-token-file", str(token_file),
                              "--verify-key-file", str(c.root / "verify-key")], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode != 0 and run.returncode > 0, run.stderr
        assert "node token" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.slow
def test_repair_and_a_lost_catalog_state_still_work_with_per_node_credentials(tmp_path, new_cluster):
    """Copy-to (repair) between nodes on their own tokens, then the catalog's state is lost (kill -9, state
    deleted): it rebuilds every dataset from the manifests it signed, the repaired copy included."""
    with trusted_cluster(new_cluster, tmp_path / "c", ["a1", "a2", "a3"], dead_after=1.5,
                         catalog_port=free_port()) as c:
        admin = tokens.role_token(SECRET, "admin", "ops")
        kept, other = table_of(ROWS, 2), table_of(900, 3)
        with fp.connect(c.uri, token=admin, host="127.0.0.99") as client:
            wait_until(lambda: alive(client) == {"a1", "a2", "a3"}, 30, "three nodes")
            client.put("kept", kept, tiling=(2, 1), replicas=2)
            client.put("other", other, tiling=(3, 1), replicas=2)
            first = client.open("kept").__partitioned__["partitions"][(0, 0)]["location"][0][0]
            down = next(n for n in c.nodes if f"//{first}:" in n.uri)
            down.kill()
            wait_until(lambda: len(alive(client)) == 2, 30, "the killed node to be seen dead")
            repaired = client.repair()
            assert repaired["copied"] and not repaired["lost"]
            assert client.open("kept").to_arrow().equals(kept)
        c.catalog.kill()
        shutil.rmtree(c.root / "catalog")
        restart_catalog(c)
        with fp.connect(c.uri, token=admin, host="127.0.0.99") as client:
            wait_until(lambda: client.versions("kept") == [1] and client.versions("other") == [1], 30, "the rebuild")

            def two_live_replicas() -> bool:
                partitions = client.open("kept").__partitioned__["partitions"].values()
                live = {n.ip for n in client.nodes() if n.alive}
                return all(len({loc[0] for loc in p["location"]} & live) >= 2 for p in partitions)

            wait_until(two_live_replicas, 30, "every partition of kept on two live nodes, the repaired copy included")
            assert client.open("kept").to_arrow().equals(kept)
            assert client.open("other").to_arrow().equals(other)
        assert "did not sign" not in c.catalog.log() and "never placed there" not in c.catalog.log()


def test_flight_sql_needs_a_token_and_a_reader_token_queries(trusted):
    """The catalog's Flight SQL answers as its other calls do: a reader's token queries (the gateway reads the nodes
    with capabilities of its own), no token is refused, and the refusal is a clear one-line error."""
    dbapi = pytest.importorskip("adbc_driver_flightsql.dbapi", reason="adbc-driver-flightsql is in the test extra")
    adbc = pytest.importorskip("adbc_driver_manager")
    header = {"adbc.flight.sql.authorization_header": f"Bearer {tokens.role_token(SECRET, 'reader', 'r')}"}
    with dbapi.connect(trusted.uri, db_kwargs=header) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) AS n, sum(id) AS s FROM victim")
        assert cur.fetchall() == [(ROWS, sum(range(ROWS)))]
        cur.execute("SELECT id FROM victim WHERE id < 5")  # a plain scan: read from the nodes, with the same token
        assert sorted(r[0] for r in cur.fetchall()) == [0, 1, 2, 3, 4]
        with pytest.raises(dbapi.Error, match="reader r may not write") as refused:  # a reader cannot store a dataset
            cur.adbc_ingest("by-reader", table_of(10), mode="create")
        assert refused.value.status_code == adbc.AdbcStatusCode.UNAUTHORIZED  # PERMISSION_DENIED, as SQL clients expect
    writer = {"adbc.flight.sql.authorization_header": f"Bearer {tokens.role_token(SECRET, 'writer', 'w')}"}
    with dbapi.connect(trusted.uri, db_kwargs=writer) as conn, conn.cursor() as cur:
        assert cur.adbc_ingest("by-writer", table_of(10), mode="create") == 10
    with dbapi.connect(trusted.uri) as conn, conn.cursor() as cur:
        with pytest.raises(dbapi.Error) as info:
            cur.execute("SELECT count(*) FROM victim")
        assert "unauthenticated" in str(info.value).lower() and "Traceback" not in str(info.value)


def test_a_node_token_cannot_drop_datasets_or_use_up_version_numbers_by_registering(tmp_path, new_cluster):
    """A node registers under its own id but says, in its tombstones, that datasets it never held were dropped (one
    version, and every version of another it names), and names a version number near the wire's limit. The catalog
    had dropped both datasets everywhere, files and all, and the number left the name unwritable for good. Now a
    node's tombstone drops only versions the catalog learned from nodes' files (a catalog rebuilding lost state), and
    a registration naming a version past 2**40 has those entries left out (a writer cannot plant one on a node); one
    naming the address of another live node is refused."""
    with trusted_cluster(new_cluster, tmp_path / "c", ["n1"]) as c:
        truth, other = table_of(ROWS, 6), table_of(1000, 7)
        with fp.connect(c.uri, token=tokens.role_token(SECRET, "writer", "w"), host="127.0.0.99") as writer:
            wait_until(lambda: alive(writer) == {"n1"}, 30, "the node to register")
            writer.put("victim", truth, tiling=(2, 1))
            writer.put("buried", other, tiling=(2, 1))
            with fp.connect(c.uri, token=node_token("mole"), host="127.0.0.99") as mole:
                mole.call(wire.RegisterNode("mole", f"grpc://{c.ips[2]}:1", c.ips[2], 4242,
                                            versions=(wire.VersionRef("buried", 1),),
                                            tombstones=(wire.Tombstones("victim", 0, (1,), ()),
                                                        wire.Tombstones("buried", 5))))
                # accepted, but without the number: refusing the registration had shut a node out for one file
                mole.call(wire.RegisterNode("mole", f"grpc://{c.ips[2]}:1", c.ips[2], 4242,
                                            versions=(wire.VersionRef("other", (1 << 62) - 1),)))
                with pytest.raises(fp.NodeConflict, match="is served by node n1"):  # nor take a live node's address
                    n1 = c.nodes[0]
                    mole.call(wire.RegisterNode("mole", n1.uri, c.ips[0], n1.pid))
            with reader(c) as client:
                assert client.open("victim").to_arrow().equals(truth)
                assert client.open("buried").to_arrow().equals(other)
            # a writer cannot plant such a number on a node either (it would reach the catalog when the node registers):
            # it began no such version, so it has no grant; nor can an admin, who needs none, past the last number
            with pytest.raises(flight.FlightError) as planted:
                put_raw(flight.connect(c.nodes[0].uri, **writer.pool.access.client_kwargs()),
                        ["other", str(10 ** 15), "0", "0"], other, options=writer.pool.options(30))
            assert code_of(planted.value) == "FORBIDDEN" and "carries no grant" in str(planted.value)
            with fp.connect(c.uri, token=tokens.role_token(SECRET, "admin", "ops"), host="127.0.0.99") as admin:
                with pytest.raises(flight.FlightError) as planted:
                    put_raw(flight.connect(c.nodes[0].uri, **admin.pool.access.client_kwargs()),
                            ["other", str(10 ** 15), "0", "0"], other, options=admin.pool.options(30))
            assert code_of(planted.value) == "INVALID_REQUEST" and "past the" in str(planted.value)
            log = c.catalog.log()
            assert "this catalog wrote it and never did: kept" in log and "never dropped it: kept" in log
            assert "left out what it said of versions past" in log
            assert len(list(c.root.glob("node-*/datasets/victim/v1/*.arrow"))) == 2  # no file went
            # the name is still writable from 1 (on the real node: the mole's address serves nothing)
            assert writer.put("other", other, nodes=[c.ips[0]]).version == 1


def test_a_writer_cannot_commit_abort_or_publish_another_writers_version(tmp_path, new_cluster):
    """Writers share a cluster, and a version belongs to the writer that began it. Another writer's token had committed
    forged rows as someone's reserved version, aborted it under its writer's feet, and swapped an SPMD rank's part
    for its own; an admin may still abort anything."""
    with trusted_cluster(new_cluster, tmp_path / "c", ["n1"]) as c:
        def writer(name: str) -> fp.Client:
            return fp.connect(c.uri, token=tokens.role_token(SECRET, "writer", name), host="127.0.0.99")

        with writer("alice") as alice, writer("mallory") as mallory:
            wait_until(lambda: alive(alice) == {"n1"}, 30, "the node to register")
            node = flight.connect(c.nodes[0].uri)
            truth, forged = table_of(1000, 11), table_of(1000, 12)
            begun = alice.call(wire.Begin("owned"))
            version = begun.version
            # a writer puts only to a version it began, with the catalog's grant made out to it
            for options in (mallory.pool.options(30), mallory.pool.options(30, begun.grant), alice.pool.options(30)):
                with pytest.raises(flight.FlightError) as refused:
                    put_raw(node, ["owned", str(version), "0", "0"], forged, options=options)
                assert code_of(refused.value) == "FORBIDDEN" and "grant" in str(refused.value)
            put_raw(node, ["owned", str(version), "0", "0"], truth, options=alice.pool.options(30, begun.grant))
            # nor link another writer's unpublished rows into a version of its own (and publish them as its own)
            own = mallory.call(wire.Begin("owned"))
            steal = wire.Relink("owned", version, own.version, (wire.LinkPart((0, 0), (0, 0)),))
            with pytest.raises(fp.Forbidden, match="relink order's source"), translated():
                mallory.pool.action(c.nodes[0].uri, steal, grant=own.grant)
            mallory.call(wire.Abort("owned", own.version))
            # unpublished rows are no reader's: a reader's (or another writer's) token had read them from the node
            ticket = flight.Ticket(wire.Ticket("owned", version, (0, 0)).encode())
            with reader(c) as client:
                for options in (client.pool.options(30), mallory.pool.options(30)):
                    with pytest.raises(flight.FlightError, match="not published on this node") as unpublished:
                        node.do_get(ticket, options=options).read_all()
                    assert code_of(unpublished.value) == "BUSY"
            commit = wire.Commit("owned", version, truth.schema, (truth.num_rows, truth.num_columns), (1, 1),
                                 (wire.CommitPart((0, 0), (0, 0), (truth.num_rows, truth.num_columns), ("n1",)),))
            with pytest.raises(fp.Forbidden, match="begun by another writer"):
                mallory.call(commit)
            with pytest.raises(fp.Forbidden, match="begun by another writer"):
                mallory.call(wire.Abort("owned", version))
            alice.call(commit)
            assert alice.open("owned").to_arrow().equals(truth)
            with reader(c) as client:
                assert node.do_get(ticket, options=client.pool.options(30)).read_all().equals(truth)  # published now
            # nor can a writer order a node to build or link partitions of a version it did not begin
            for order in (wire.Assemble("owned", version, version + 1, 1, (wire.AssemblePart((0, 0), (0, 1000)),),
                                        deadline_ms=10_000),
                          wire.Relink("owned", version, version + 1, (wire.LinkPart((0, 0), (0, 0)),))):
                with pytest.raises(fp.Forbidden, match="carries no grant"), translated():
                    mallory.pool.action(c.nodes[0].uri, order)

            # an SPMD publish: its ranks are its first rank's writer's
            joined = alice.call(wire.PublishBegin("ranks", 2, 0))
            spmd = joined.version
            put_raw(node, ["ranks", str(spmd), "0", "0"], truth, options=alice.pool.options(30, joined.grant))
            part = wire.PublishPart("ranks", spmd, 0, truth.num_rows, truth.num_columns, "n1", truth.schema)
            assert not alice.publish_part(part).complete
            alice.publish_part(part)  # the same part again (a retry): nothing changes
            with pytest.raises(fp.Forbidden, match="begun by another writer"):
                mallory.call(wire.PublishPart("ranks", spmd, 0, 777, truth.num_columns, "n1", forged.schema))
            # another writer's ranks open a publish of their own: neither joins nor holds up the other's
            assert mallory.call(wire.PublishBegin("ranks", 2, 1)).version != spmd
            assert alice.call(wire.PublishBegin("ranks", 2, 1)).version == spmd
            with pytest.raises(fp.VersionConflict, match="a rank publishes once"):
                alice.publish_part(dataclasses.replace(part, rows=5))
            with fp.connect(c.uri, token=tokens.role_token(SECRET, "admin", "ops"), host="127.0.0.99") as admin:
                admin.call(wire.Abort("ranks", spmd))
            assert "ranks" not in [d.name for d in alice.list()]


@pytest.mark.slow
def test_a_repair_does_not_take_rows_a_writer_planted_on_its_target_as_a_replica(tmp_path, new_cluster):
    """A writer puts rows of its own (the partition's row count and schema) for a committed partition to the one node
    that holds none of it; a holder dies and a repair copies to that node, which says it stores the partition
    already. The repair had taken the planted rows as a replica (a reader then got them once the honest holder was
    gone). The holder now compares what the target serves with its own rows, and the repair does not take it."""
    with trusted_cluster(new_cluster, tmp_path / "c", ["b1", "b2", "b3"], dead_after=1.5) as c:
        admin = tokens.role_token(SECRET, "admin", "ops")
        truth = table_of(3000, 21)
        mallory = tokens.role_token(SECRET, "writer", "mallory")
        with fp.connect(c.uri, token=admin, host="127.0.0.99") as client, \
                fp.connect(c.uri, token=mallory, host="127.0.0.99") as writer:
            wait_until(lambda: alive(client) == {"b1", "b2", "b3"}, 30, "three nodes")
            grants: list = []  # a writer can put only to a version it began: here the version's own writer
            writer.put("sales", truth, tiling=(3, 1), replicas=2,
                       progress=lambda done, total: grants.append(writer.grant_for("sales", 1)))
            first = client.open("sales").__partitioned__["partitions"][(0, 0)]
            held = {loc[0] for loc in first["location"]}
            spare = next(n for n in c.nodes if not any(f"//{ip}:" in n.uri for ip in held))
            planted = truth.slice(0, first["shape"][0]).set_column(0, "id", pa.array([-1] * first["shape"][0]))
            put_raw(flight.connect(spare.uri), ["sales", "1", "0", "0"], planted,
                    options=writer.pool.options(30, grants[-1]))
            down = next(n for n in c.nodes if f"//{sorted(held)[0]}:" in n.uri)
            down.kill()
            wait_until(lambda: len(alive(client)) == 2, 30, "the killed node to be seen dead")
            repaired = client.repair()
            spare_ip = spare.uri.removeprefix("grpc://").rsplit(":", 1)[0]
            now = {loc[0] for loc in client.open("sales").__partitioned__["partitions"][(0, 0)]["location"]}
            assert spare_ip not in now, repaired
            assert client.open("sales").to_arrow().equals(truth)
        assert "stores other rows" in c.catalog.log()


def test_a_writers_dask_puts_appends_repartitions_and_spmd_ranks_carry_the_grant_of_the_version_they_write(
        tmp_path, dask_client, new_cluster):
    """Nodes take a writer's put or order only with the catalog's grant for the version it began: every way a writer
    writes must carry it (Dask tasks from their workers, a stream append's staging and relink, a repartition's
    orders, SPMD ranks)."""
    dd = pytest.importorskip("dask.dataframe")
    token = tokens.role_token(SECRET, "writer", "w")
    truth = table_of(4000, 31)
    with trusted_cluster(new_cluster, tmp_path / "c", ["g1", "g2"]) as c:
        with fp.connect(c.uri, token=token, host="127.0.0.99") as writer:
            wait_until(lambda: alive(writer) == {"g1", "g2"}, 30, "both nodes to register")
            frame = dd.from_pandas(truth.to_pandas(), npartitions=2)
            assert writer.put("tasks", frame).to_arrow().column("id").to_pylist() == truth.column("id").to_pylist()
            writer.append("tasks", truth.to_reader(max_chunksize=1000))  # staged, then linked into the next version
            assert writer.open("tasks").to_arrow().num_rows == 2 * truth.num_rows
            assert writer.repartition("tasks", (4, 1)).to_arrow().num_rows == 2 * truth.num_rows  # assemble orders
            assert writer.grant_for("tasks", 3) is None  # kept only while the version is being written
        for rank in range(2):  # two ranks, one after the other, each with the writer's token
            fp.publish("ranks", truth.slice(rank * 2000, 2000), rank=rank, nranks=2, catalog=c.uri, token=token,
                       host=c.ips[0])  # on g1's host
        with reader(c) as client:
            assert client.open("ranks").to_arrow().equals(truth)
