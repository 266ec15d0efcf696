"""Users, grants and withdrawal on real daemons: a catalog holding the secret, two nodes, real clients.

A team's admin adds users with passwords, groups and grants; users sign in with ADBC (``username``/``password``),
the Python client and a Dask read, and every path out of the cluster (open, the node's stream, SQL, listings,
pickled handles, ingest, drop) gives them exactly what their grants allow.
"""

from __future__ import annotations

import base64
import json
import pickle
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart import tokens

SECRET = tokens.new_secret()
PASSWORDS = {"alice": "alice-has-a-long-password", "bob": "bob-has-another-password", "carol": "carol-writes-data-1"}


def table_of(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(rows), "x": rng.random(rows)})


@pytest.fixture(scope="module")
def team(tmp_path_factory, make_cluster):
    """Datasets of two teams (sales_eu, sales_us for sales; hr_pay for hr); alice in sales reads sales_*, bob reads
    hr_pay, carol writes sales_* and is an admin of nothing."""
    root = tmp_path_factory.mktemp("users")
    (root / "secret").write_text(SECRET + "\n")
    (root / "secret").chmod(0o600)
    with make_cluster(2, process=True, root=root, extra_args=["--token-file", str(root / "secret")]) as cluster:
        with fp.connect(cluster.uri, token=SECRET, host="127.0.0.99") as admin:
            for name, seed in (("sales_eu", 1), ("sales_us", 2), ("hr_pay", 3)):
                admin.put(name, table_of(3000, seed), tiling=(4, 1))
            admin.users.add("alice", PASSWORDS["alice"])
            admin.users.add("bob", PASSWORDS["bob"])
            admin.users.add("carol", PASSWORDS["carol"], role="writer")
            admin.users.join("sales", "alice")
            admin.users.join("sales", "carol")
            admin.users.grant("read", "sales_*", "sales")
            admin.users.grant("read", "hr_pay", "bob")
            admin.users.grant("write", "sales_*", "carol")
        yield cluster


def admin_of(cluster):
    return fp.connect(cluster.uri, token=SECRET, host="127.0.0.99")


def signed_in(cluster, user: str):
    return fp.connect(cluster.uri, user=user, password=PASSWORDS[user], host="127.0.0.99")


def test_a_user_reads_what_their_grants_allow_and_nothing_else(team):
    with signed_in(team, "alice") as alice:
        assert sorted(entry.name for entry in alice.list()) == ["sales_eu", "sales_us"]
        assert alice.open("sales_eu").to_arrow().equals(table_of(3000, 1))
        with pytest.raises(fp.Forbidden) as refused:
            alice.open("hr_pay")
        assert "grant" in str(refused.value)
        with pytest.raises(fp.Forbidden):
            alice.versions("hr_pay")
    with signed_in(team, "bob") as bob:
        assert [entry.name for entry in bob.list()] == ["hr_pay"]
        assert bob.open("hr_pay").to_arrow().num_rows == 3000


def test_wrong_passwords_are_refused_and_a_name_guessed_in_a_loop_is_locked(team):
    with pytest.raises(fp.Unauthenticated):
        fp.connect(team.uri, user="alice", password="not-her-password", host="127.0.0.99")
    with pytest.raises(fp.Unauthenticated):
        fp.connect(team.uri, user="nobody", password="whatever-password", host="127.0.0.99")
    with admin_of(team) as admin:
        admin.users.add("pat", "pat-password-long")
    for _ in range(6):
        with pytest.raises(fp.Unauthenticated):
            fp.connect(team.uri, user="pat", password="guess-guess-guess", host="127.0.0.99")
    # locked now: even the right password is refused, unchecked, until the lockout passes
    with pytest.raises(fp.Unauthenticated) as locked:
        fp.connect(team.uri, user="pat", password="pat-password-long", host="127.0.0.99")
    assert "try again in" in str(locked.value)
    with admin_of(team) as admin:
        refusals = admin.stats(team.uri)
    assert refusals is not None
    log = team.catalog_log() if hasattr(team, "catalog_log") else ""
    if log:
        lines = [json.loads(line.split(" ", 4)[-1]) for line in log.splitlines() if '"audit":"sign-in"' in line]
        assert any(line["outcome"] == "refused" and line["user"] == "pat" for line in lines)


def test_a_node_refuses_a_users_session_for_data_and_a_forged_capability(team):
    with signed_in(team, "alice") as alice:
        token = alice.access.token
        node = flight.connect(team.nodes[0].uri)
        options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
        ticket = flight.Ticket(json.dumps({"dataset": "hr_pay", "version": 1, "part": [0, 0]}).encode())
        with pytest.raises(flight.FlightError) as refused:
            node.do_get(ticket, options=options).read_all()
        assert "capability" in str(refused.value)
        # her capability for sales_eu does not open hr_pay either
        cap = alice.open("sales_eu").__partitioned__["partitions"][(0, 0)]["data"].ticket
        assert cap is not None


def test_sql_shows_and_reads_only_granted_datasets(team):
    adbc = pytest.importorskip("adbc_driver_flightsql.dbapi")
    db_kwargs = {"username": "alice", "password": PASSWORDS["alice"]}
    with adbc.connect(team.uri, db_kwargs=db_kwargs) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM sales_eu")
        assert cur.fetchall() == [(3000,)]
        cur.execute("SELECT table_name FROM information_schema.tables ORDER BY 1")
        assert [row[0] for row in cur.fetchall()] == ["sales_eu", "sales_us"]
        cur.execute("SHOW TABLES")
        assert sorted(row[0] for row in cur.fetchall()) == ["sales_eu", "sales_us"]
        for query in ("SELECT * FROM hr_pay", "SELECT count(*) FROM sales_eu JOIN hr_pay USING (id)",
                      "SELECT * FROM \"HR_PAY\"", "SELECT * FROM hr_pay@1"):
            with pytest.raises(adbc.Error) as refused:
                cur.execute(query)
                cur.fetchall()
            assert "PERMISSION_DENIED" in str(refused.value) or "may not read" in str(refused.value), query
        tables = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
        names = sorted(t["table_name"] for c in tables for s in c["catalog_db_schemas"] or []
                       for t in s["db_schema_tables"] or [])
        assert names == ["sales_eu", "sales_us"]
    with pytest.raises(adbc.Error):
        with adbc.connect(team.uri, db_kwargs={"username": "alice", "password": "nope-nope-nope"}) as conn:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")


def test_a_writer_writes_only_where_granted(team):
    with signed_in(team, "carol") as carol:
        carol.put("sales_apac", table_of(500, 7), tiling=(2, 1))
        assert carol.open("sales_apac").to_arrow().num_rows == 500
        carol.append("sales_apac", table_of(100, 8))
        assert carol.open("sales_apac").to_arrow().num_rows == 600
        with pytest.raises(fp.Forbidden):
            carol.put("hr_pay", table_of(10, 9))
        with pytest.raises(fp.Forbidden):
            carol.drop("sales_apac")  # a writer's role drops nothing, whatever the grants
    with signed_in(team, "alice") as alice:
        with pytest.raises(fp.Forbidden):
            alice.put("sales_eu", table_of(10, 9))  # a reader's role writes nothing, whatever the grants
        assert alice.open("sales_apac").to_arrow().num_rows == 600  # the group's read grant covers it


def _read_pickled(handle: bytes) -> subprocess.CompletedProcess:
    code = ("import pickle, sys\nget, refs = pickle.loads(sys.stdin.buffer.read())\n"
            "try:\n    print(sum(t.num_rows for t in get(refs)))\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    return subprocess.run([sys.executable, "-c", code], input=handle, capture_output=True, timeout=120,
                          env={"FLIGHTPART_HOST": "127.0.0.99", "PATH": "/usr/bin:/bin"})


def test_a_revoked_grant_voids_pickled_handles_on_every_node(team):
    with admin_of(team) as admin:
        admin.users.add("dave", "dave-password-long", role="reader")
        admin.users.grant("read", "sales_us", "dave")
        with fp.connect(team.uri, user="dave", password="dave-password-long", host="127.0.0.99") as dave:
            meta = dave.open("sales_us").__partitioned__
            handle = pickle.dumps((meta["get"], [p["data"] for p in meta["partitions"].values()]))
            assert _read_pickled(handle).stdout.decode().strip() == "3000"
            admin.users.revoke("read", "sales_us", "dave")  # the nodes are told before it returns
            answer = _read_pickled(handle).stdout.decode().strip()
            assert "3000" != answer and ("revoked" in answer or "Unauthenticated" in answer), answer
            with pytest.raises(fp.Forbidden):
                dave.open("sales_us")
            admin.users.grant("read", "sales_us", "dave")  # granted again: a new open reads
            assert dave.open("sales_us").to_arrow().num_rows == 3000
        admin.users.remove("dave")
        with pytest.raises(fp.Unauthenticated):
            fp.connect(team.uri, user="dave", password="dave-password-long", host="127.0.0.99")


def test_a_removed_users_session_is_refused_at_once(team):
    with admin_of(team) as admin:
        admin.users.add("erin", "erin-password-long")
        admin.users.grant("read", "sales_eu", "erin")
        erin = fp.connect(team.uri, user="erin", password="erin-password-long", host="127.0.0.99")
        try:
            assert erin.open("sales_eu").shape[0] == 3000
            admin.users.remove("erin")
            with pytest.raises(fp.Unauthenticated):
                erin.open("sales_eu")
            with pytest.raises(fp.Unauthenticated):
                erin.list()
        finally:
            erin.close()


def test_users_and_grants_are_listed_for_an_admin_only(team):
    with admin_of(team) as admin:
        users = {u.name: u for u in admin.users.list()}
        assert users["alice"].groups == ("sales",) and users["carol"].role == "writer"
        assert ("read", "sales_*", "sales") in [(g.access, g.pattern, g.grantee) for g in admin.users.grants()]
        assert "hash" not in json.dumps([u.to_json() for u in users.values()])
    with signed_in(team, "alice") as alice:
        with pytest.raises(fp.Forbidden):
            alice.users.list()
        with pytest.raises(fp.Forbidden):
            alice.users.grant("read", "*", "alice")


def test_basic_credentials_on_a_plain_flight_handshake_give_a_session(team):
    client = flight.FlightClient(team.uri)
    header, value = client.authenticate_basic_token("alice", PASSWORDS["alice"])
    assert header == b"authorization" and value.startswith(b"Bearer fp3:user:alice~reader~")
    options = flight.FlightCallOptions(headers=[(header, value)])
    names = sorted(flight.FlightDescriptor.for_path(*i.descriptor.path).path[0].decode()
                   for i in client.list_flights(options=options))
    assert "sales_eu" in names and "hr_pay" not in names
    bad = base64.b64encode(b"alice").decode()
    with pytest.raises(flight.FlightUnauthenticatedError):
        list(client.do_action(flight.Action("nodes", b""), options=flight.FlightCallOptions(
            headers=[(b"authorization", f"Basic {bad}".encode())])))


def _audit_lines(cluster) -> list[dict]:
    lines = []
    for line in cluster.catalog.log().splitlines():
        if " flightpart.audit " in line:
            lines.append(json.loads(line.split(" flightpart.audit ", 1)[1].split(" ", 1)[1]))
    return lines


def test_every_decision_is_one_audit_line_and_counted(team):
    with signed_in(team, "alice") as alice:
        alice.open("sales_eu")
        with pytest.raises(fp.Forbidden):
            alice.open("hr_pay")
    with pytest.raises(fp.Unauthenticated):
        fp.connect(team.uri, user="alice", password="a-wrong-password", host="127.0.0.99")
    lines = _audit_lines(team)
    assert any(line["audit"] == "open" and line["outcome"] == "allowed" and line["dataset"] == "sales_eu"
               and line["user"] == "alice" for line in lines)
    refused = [line for line in lines if line["audit"] == "open" and line["outcome"] == "refused"]
    assert refused and refused[-1]["dataset"] == "hr_pay" and refused[-1]["client"].startswith("127.")
    assert any(line["audit"] == "sign-in" and line["outcome"] == "refused" and line["user"] == "alice"
               for line in lines)
    assert any(line["audit"] == "grant" and line["grantee"] == "sales" for line in lines)


def test_a_crafted_ticket_with_another_datasets_capability_is_refused(team):
    with signed_in(team, "alice") as alice:
        token = alice.open("sales_eu").__partitioned__["get"].access.token
        assert token.startswith("fp3:cap:sales_eu@1~alice~")
        options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
        node = flight.connect(team.nodes[0].uri)
        for dataset in ("hr_pay", "sales_us"):
            ticket = flight.Ticket(json.dumps({"dataset": dataset, "version": 1, "part": [0, 0]}).encode())
            with pytest.raises(flight.FlightError) as refused:
                node.do_get(ticket, options=options).read_all()
            assert "may not read" in str(refused.value)


def test_ingest_and_sql_writes_need_a_write_grant(team):
    adbc = pytest.importorskip("adbc_driver_flightsql.dbapi")
    data = pa.table({"id": np.arange(10)})
    with adbc.connect(team.uri, db_kwargs={"username": "carol", "password": PASSWORDS["carol"]}) as conn:
        with conn.cursor() as cur:
            cur.adbc_ingest("sales_latam", data, mode="create")
            with pytest.raises(adbc.Error) as refused:
                cur.adbc_ingest("hr_bonus", data, mode="create")
            assert "may not write" in str(refused.value)
    with admin_of(team) as admin:
        names = {entry.name for entry in admin.list()}
    assert "sales_latam" in names and "hr_bonus" not in names


def test_a_dask_read_as_a_user(team, dask_client):
    with signed_in(team, "alice") as alice:
        frame = alice.open("sales_eu").to_dask()
        assert int(frame["id"].count().compute()) == 3000
        with pytest.raises(fp.Forbidden):
            alice.open("hr_pay").to_dask()


def test_a_revoked_users_open_stream_is_cut(team):
    rows = 10_000_000  # 80 MB in one partition: streamed in pieces, each let through by the node's guard
    with admin_of(team) as admin:
        admin.put("sales_big", pa.table({"x": np.arange(rows, dtype=np.float64)}), tiling=(1, 1))
        admin.users.add("frank", "frank-password-long")
        admin.users.grant("read", "sales_big", "frank")
        with fp.connect(team.uri, user="frank", password="frank-password-long", host="127.0.0.99") as frank:
            meta = frank.open("sales_big").__partitioned__
            ref = meta["partitions"][(0, 0)]["data"]
            options = flight.FlightCallOptions(
                headers=[(b"authorization", f"Bearer {meta['get'].access.token}".encode())])
            reader = flight.connect(ref.replicas[0][0]).do_get(flight.Ticket(ref.spec.encode()), options=options)
            first = reader.read_chunk()
            assert first.data.num_rows > 0
            admin.users.revoke("read", "sales_big", "frank")
            with pytest.raises(flight.FlightError) as cut:
                while True:
                    reader.read_chunk()
            assert "revoked" in str(cut.value)
        admin.drop("sales_big")


def test_admin_commands_on_the_command_line(team, tmp_path):
    password = tmp_path / "pw"
    password.write_text("gina-password-long\n")
    env = {"FLIGHTPART_CATALOG": team.uri, "FLIGHTPART_TOKEN": SECRET, "PATH": "/usr/bin:/bin"}

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "flightpart", *args], capture_output=True, text=True, env=env,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "added" in run("user", "add", "gina", "--role", "reader", "--password-file", str(password))
    assert "gina joined analysts" in run("group", "add", "analysts", "gina")
    assert "granted" in run("grant", "read", "sales_e?", "TO", "analysts")
    assert {"access": "read", "pattern": "sales_e?", "grantee": "analysts"} in json.loads(run("grants", "--json"))
    users = {u["name"]: u for u in json.loads(run("user", "list", "--json"))}
    assert users["gina"]["groups"] == ["analysts"]
    with fp.connect(team.uri, user="gina", password="gina-password-long", host="127.0.0.99") as gina:
        assert [entry.name for entry in gina.list()] == ["sales_eu"]
    assert "revoked" in run("revoke", "read", "sales_e?", "FROM", "analysts")
    assert "removed" in run("user", "remove", "gina")
    done = subprocess.run([sys.executable, "-m", "flightpart", "user", "remove", "gina"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode != 0 and "USER_NOT_FOUND" in done.stderr and "Traceback" not in done.stderr


def test_a_user_changes_their_own_password_only_with_the_current_one(team):
    with admin_of(team) as admin:
        admin.users.add("hana", "hana-password-long")
        admin.users.add("ivan", "ivan-password-long")
    with fp.connect(team.uri, user="hana", password="hana-password-long", host="127.0.0.99") as hana:
        with pytest.raises(fp.Forbidden, match="current"):
            hana.users.change("hana", password="hana-new-password")  # a stolen session alone changes nothing
        with pytest.raises(fp.Forbidden):
            hana.users.change("ivan", password="taken-over-password", current="hana-password-long")
        with pytest.raises(fp.Forbidden):
            hana.users.change("hana", role="admin", current="hana-password-long")
        assert hana.users.change("hana", password="hana-new-password", current="hana-password-long").changed
    fp.connect(team.uri, user="hana", password="hana-new-password", host="127.0.0.99").close()
    with pytest.raises(fp.Unauthenticated):
        fp.connect(team.uri, user="hana", password="hana-password-long", host="127.0.0.99")


def test_guesses_sent_at_once_are_counted_before_they_are_checked(team):
    with admin_of(team) as admin:
        admin.users.add("judy", "judy-password-long")
    outcomes: list[str] = []

    def guess(k: int) -> None:
        try:
            fp.connect(team.uri, user="judy", password=f"guess-number-{k}", host="127.0.0.99").close()
            outcomes.append("in")
        except fp.Unauthenticated as refused:
            outcomes.append("checked" if "wrong user name or password" in str(refused) else "held")
        except fp.ServerBusy:  # waited its turn longer than a sign-in may: not checked either
            outcomes.append("held")

    threads = [threading.Thread(target=guess, args=(k,)) for k in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert "in" not in outcomes and len(outcomes) == 24
    # 5 checked at once, then one more each time the doubling lockout (1 s, 2 s, 4 s, ...) ends while the rest wait
    # their turn (at most 10 s): never the 24 a check of every guess would take
    assert outcomes.count("checked") <= 9 and outcomes.count("held") >= 15, outcomes


def test_an_ingest_stops_when_its_writers_grant_is_withdrawn_and_publishes_nothing(team):
    adbc = pytest.importorskip("adbc_driver_flightsql.dbapi")
    with admin_of(team) as admin:
        admin.users.add("kim", "kim-password-long", role="writer")
        admin.users.grant("write", "kims_*", "kim")
        schema = pa.schema([("id", pa.int64())])
        sent, revoked = threading.Event(), threading.Event()

        def slow_batches():
            for k in range(10):
                if k == 2:  # two batches in: the grant is withdrawn before the third is sent
                    sent.set()
                    revoked.wait(120)
                yield pa.record_batch([pa.array(np.arange(1000) + 1000 * k)], schema=schema)

        def revoke_soon():
            sent.wait(120)
            admin.users.revoke("write", "kims_*", "kim")
            revoked.set()

        revoker = threading.Thread(target=revoke_soon)
        revoker.start()
        with adbc.connect(team.uri, db_kwargs={"username": "kim", "password": "kim-password-long"}) as conn:
            with conn.cursor() as cur, pytest.raises(adbc.Error) as refused:
                cur.adbc_ingest("kims_log", pa.RecordBatchReader.from_batches(schema, slow_batches()), mode="create")
        revoker.join(60)
        assert "withdrawn" in str(refused.value)
        assert "kims_log" not in {entry.name for entry in admin.list()}


def test_a_node_restarted_while_its_catalog_is_away_still_refuses_revoked_handles(team):
    node = team.nodes[-1]
    with admin_of(team) as admin:
        admin.users.add("lena", "lena-password-long")
        admin.users.grant("read", "sales_us", "lena")
        with fp.connect(team.uri, user="lena", password="lena-password-long", host="127.0.0.99") as lena:
            meta = lena.open("sales_us").__partitioned__
        admin.users.remove("lena")
    held = [p["data"] for p in meta["partitions"].values() if p["data"].replicas[0][0] == node.uri]
    assert held, "the restarted node holds a partition of sales_us"
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {meta['get'].access.token}".encode())])

    def read_from_the_node() -> str:
        try:
            return str(flight.connect(node.uri).do_get(flight.Ticket(held[0].spec.encode()),
                                                        options=options).read_all().num_rows)
        except flight.FlightError as refused:
            return str(refused)

    assert "revoked" in read_from_the_node()
    host, port = node.uri.split("//")[1].rsplit(":", 1)
    data_dir = Path(node.args[node.args.index("--data-dir") + 1])
    team.catalog.proc.send_signal(signal.SIGSTOP)
    try:
        node.stop()
        team.nodes.remove(node)
        node = team.add_node(host, data_dir=data_dir, args=["--port", port])
        answer = read_from_the_node()
    finally:
        team.catalog.proc.send_signal(signal.SIGCONT)
    assert "revoked" in answer, answer


@pytest.mark.slow  # starts Ray
def test_a_ray_read_as_a_user_and_its_tasks_refused_once_revoked(team, ray_session):
    def rows_read(get, refs) -> int | str:
        try:
            return sum(t.num_rows for t in get(refs))
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    read = ray_session.remote(rows_read)
    with admin_of(team) as admin:
        admin.users.add("mia", "mia-password-long")
        admin.users.grant("read", "sales_eu", "mia")
        with fp.connect(team.uri, user="mia", password="mia-password-long", host="127.0.0.99") as mia:
            assert mia.open("sales_eu").to_ray().count() == 3000
            with pytest.raises(fp.Forbidden):
                mia.open("hr_pay").to_ray()
            meta = mia.open("sales_eu").__partitioned__
        refs = [p["data"] for p in meta["partitions"].values()]
        assert ray_session.get(read.remote(meta["get"], refs)) == 3000  # the handle pickled into a Ray task
        admin.users.remove("mia")
        answer = ray_session.get(read.remote(meta["get"], refs))
        assert isinstance(answer, str) and "revoked" in answer, answer


def test_a_current_password_guessed_through_a_change_is_locked_out_too(team):
    with admin_of(team) as admin:
        admin.users.add("nora", "nora-password-long")
    with fp.connect(team.uri, user="nora", password="nora-password-long", host="127.0.0.99") as nora:
        for k in range(5):
            with pytest.raises(fp.Forbidden):
                nora.users.change("nora", password="nora-new-password", current=f"guess-{k}-guess")
        with pytest.raises(fp.Unauthenticated, match="try again in"):
            nora.users.change("nora", password="nora-new-password", current="nora-password-long")


def test_simultaneous_sign_ins_of_one_user_all_get_in(team):
    with admin_of(team) as admin:
        admin.users.add("otto", "otto-password-long")
    got: list[str] = []

    def sign_in() -> None:
        try:
            fp.connect(team.uri, user="otto", password="otto-password-long", host="127.0.0.99").close()
            got.append("in")
        except fp.FlightpartError as refused:
            got.append(f"{refused.code}: {refused}")

    threads = [threading.Thread(target=sign_in) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert got == ["in"] * 12, got
