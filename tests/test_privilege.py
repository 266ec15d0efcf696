"""Least privilege: roles, read capabilities, files on the disk, node identity, what each port shows."""

from __future__ import annotations

import json
import os
import pickle
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart import tokens, wire
from flightpart.local.cluster import Daemon

from helpers import code_of, raw_action

SECRET = tokens.new_secret()


def table_of(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(rows), "x": rng.random(rows)})


def token(role: str, name: str = "someone", expiry: int = 0) -> str:
    return tokens.role_token(SECRET.encode(), role, name, expiry)


@pytest.fixture(scope="module")
def root():
    """A directory other users can traverse, so only flightpart's own modes decide what they may open."""
    path = Path(tempfile.mkdtemp(prefix="flightpart-privilege-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


CAPABILITY_TTL = 15
"""Seconds a handle reads (up to a quarter of it less, by rounding): long enough for a holder process to start and
read on a loaded machine, short enough to wait out."""


@pytest.fixture(scope="module")
def guarded(root, make_cluster):
    secret = root / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    with make_cluster(2, process=True, root=root / "c", heartbeat=0.3,
                      extra_args=["--secret-file", str(secret), "--capability-ttl", str(CAPABILITY_TTL)],
                      env={"FLIGHTPART_CLOCK_MARGIN": "0"}) as c:  # expiry checked to the second (one clock here)
        (root / "c").chmod(0o755)
        with fp.connect(c.uri, token=SECRET) as owner:
            owner.put("shared", table_of(3000, 1), tiling=(2, 1))
            owner.put("private", table_of(500, 2), tiling=(1, 1))
        yield c


def test_each_role_does_what_it_may_and_nothing_more(guarded):
    c = guarded
    table = table_of(200, 3)
    with fp.connect(c.uri, token=token("reader"), host="127.0.0.99") as reader:
        assert reader.open("shared").to_arrow().equals(table_of(3000, 1))
        with pytest.raises(fp.Forbidden, match="may not write"):
            reader.put("by-reader", table)
        with pytest.raises(fp.Forbidden):
            reader.drop("shared")
    with fp.connect(c.uri, token=token("writer"), host="127.0.0.99") as writer:
        assert writer.put("by-writer", table).to_arrow().equals(table)
        with pytest.raises(fp.Forbidden, match="may not admin"):
            writer.drop("by-writer")
        with pytest.raises(fp.Forbidden):
            raw_action(writer, "register-node",
                       {"node_id": "x", "uri": "grpc://127.0.0.9:1", "ip": "127.0.0.9", "pid": 1})
        with pytest.raises(fp.Forbidden):
            writer.repair()
    with fp.connect(c.uri, token=token("admin")) as admin:
        admin.drop("by-writer")
        assert "by-writer" not in {d.name for d in admin.list()}
    with fp.connect(c.uri, token=token("reader", expiry=int(time.time()) - 1)) as expired:
        with pytest.raises(fp.Unauthenticated):
            expired.list()
    forged = token("admin")[:-4] + "0000"
    with fp.connect(c.uri, token=forged) as forger:
        with pytest.raises(fp.Unauthenticated):
            forger.drop("shared")
    with fp.connect(c.uri, token=SECRET, host="127.0.0.99") as owner:
        assert owner.open("shared").to_arrow().equals(table_of(3000, 1))  # nothing was changed


HOLDER = """
import json, os, pickle, sys
import pyarrow as pa, pyarrow.flight as flight
import flightpart as fp
d = pickle.loads(open(sys.argv[1], "rb").read())
out = {"env": sorted(k for k in os.environ if k.startswith("FLIGHTPART"))}
try:
    parts = d["get"]([p["data"] for p in d["partitions"].values()])
    out["rows"] = sum(t.num_rows for t in parts)
except fp.FlightpartError as exc:
    out["read"] = type(exc).__name__
cap = d["get"].access.token
out["token_is_capability"] = cap.startswith("fp3:cap:")
catalog, node = sys.argv[2], sys.argv[3]
with fp.connect(catalog, token=cap) as client:
    for name, call in (("drop", lambda: client.drop("shared")), ("list", client.list),
                       ("open-other", lambda: client.open("private"))):
        try:
            call()
            out[name] = "allowed"
        except fp.FlightpartError as exc:
            out[name] = type(exc).__name__
options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {cap}".encode())])
raw = flight.connect(node)
try:
    raw.do_get(flight.Ticket(json.dumps({"dataset": "private", "version": 1, "part": [0, 0]}).encode()),
               options=options).read_all()
    out["read-other"] = "allowed"
except flight.FlightError as exc:
    out["read-other"] = json.loads(exc.extra_info)["code"]
try:
    writer, _ = raw.do_put(flight.FlightDescriptor.for_path("shared", "9", "0", "0"), pa.schema([("a", pa.int64())]),
                           options=options)
    writer.write_table(pa.table({"a": [1]}))
    writer.write_metadata(pa.py_buffer(b'{"rows": 1}'))
    writer.close()
    out["put"] = "allowed"
except flight.FlightError as exc:
    out["put"] = json.loads(exc.extra_info)["code"]
print(json.dumps(out))
"""


def run_holder(handle: Path, c) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTPART")}
    proc = subprocess.run([sys.executable, "-c", HOLDER, str(handle), c.uri, c.nodes[0].uri], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.slow  # waits for a token to expire: in the slow tier, which CI runs
def test_a_pickled_handle_reads_its_version_and_nothing_else_until_it_expires(guarded, tmp_path):
    c = guarded
    with fp.connect(c.uri, token=token("reader"), host="127.0.0.99") as reader:
        ds = reader.open("shared")
        opened = time.time()
        handle = tmp_path / "handle.pickle"
        handle.write_bytes(pickle.dumps(ds.__partitioned__))
    assert SECRET.encode() not in handle.read_bytes() and b"fp3:reader" not in handle.read_bytes()
    graph = pickle.dumps(ds.dask_graph())  # a Dask graph carries the same capability, not the reader's token
    assert b"fp3:cap:shared@1~#" in graph and b"fp3:reader" not in graph and SECRET.encode() not in graph
    now = run_holder(handle, c)
    assert now["env"] == [] and now["token_is_capability"]
    assert now.get("rows") == 3000, now
    assert now["drop"] == "Forbidden" and now["list"] == "Forbidden" and now["open-other"] == "Forbidden"
    assert now["read-other"] == "FORBIDDEN" and now["put"] == "FORBIDDEN"
    time.sleep(max(0.0, opened + CAPABILITY_TTL + 0.5 - time.time()))  # the capability has expired
    later = run_holder(handle, c)
    assert later["read"] in ("Unauthenticated", "NodeUnavailable") and "rows" not in later
    with fp.connect(c.uri, token=token("reader"), host="127.0.0.99") as reader:
        assert reader.open("shared").to_arrow().equals(table_of(3000, 1))  # a fresh open gets a fresh capability


def test_no_secret_is_on_a_daemon_command_line(guarded):
    for daemon in [guarded.catalog, *guarded.nodes]:
        cmdline = Path(f"/proc/{daemon.pid}/cmdline").read_bytes()
        assert SECRET.encode() not in cmdline and b"--secret-file" in cmdline


def test_a_credential_file_other_users_can_read_is_refused(root):
    loose = root / "loose-secret"
    loose.write_text(SECRET)
    loose.chmod(0o644)
    with pytest.raises(RuntimeError, match=r"permissions 0644 are too open(.|\n)*chmod 600"):
        Daemon(["catalog", "--host", "127.0.0.1", "--port", "0", "--state-dir", str(root / "loose-state"),
                "--secret-file", str(loose)])


def other_user() -> tuple[int, int]:
    if os.geteuid() != 0:
        pytest.skip("creating another local user needs root")
    name = "flightpart-other"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                              capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"cannot create a local user: {made.stderr.strip()}")
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


TRY_OPEN = 'for f in "$@"; do if head -c 1 "$f" > /dev/null 2>&1; then echo "read $f"; else echo "denied $f"; fi; done'


def test_another_local_user_cannot_read_partitions_or_the_catalog(guarded, root):
    uid, gid = other_user()
    partition = next((root / "c").glob("node-*/datasets/shared/v1/0_0.arrow"))
    manifest = partition.parent / "manifest.json"
    state = root / "c" / "catalog" / "catalog.sqlite"
    control = root / "public.txt"
    control.write_text("anyone may read this")
    control.chmod(0o644)
    for path in (partition, manifest, state):
        assert path.stat().st_mode & 0o077 == 0, path
    for directory in (partition.parent, partition.parents[2].parent, state.parent):
        assert directory.stat().st_mode & 0o077 == 0, directory

    def as_other() -> None:
        os.setgid(gid)
        os.setuid(uid)

    proc = subprocess.run(["/bin/sh", "-c", TRY_OPEN, "sh", str(control), str(partition), str(manifest), str(state)],
                          capture_output=True, text=True, preexec_fn=as_other, timeout=60)
    lines = proc.stdout.splitlines()
    assert lines[0] == f"read {control}"  # the other user can read what is meant for everyone
    assert lines[1:] == [f"denied {partition}", f"denied {manifest}", f"denied {state}"], proc.stdout + proc.stderr


def test_a_node_token_registers_only_its_own_node_and_a_live_id_is_not_taken(guarded):
    c = guarded
    with fp.connect(c.uri, token=SECRET) as owner:
        victim = owner.nodes()[0]
    body = {"node_id": victim.node_id, "uri": "grpc://127.0.0.9:1234", "ip": "127.0.0.9", "pid": 1}
    with fp.connect(c.uri, token=token("node", "some-other-node")) as impostor:
        with pytest.raises(fp.Forbidden, match="cannot register node"):
            raw_action(impostor, "register-node", body)
        with pytest.raises(fp.Forbidden, match="cannot speak for node"):  # nor keep another node alive
            impostor.call(fp.wire.Heartbeat(victim.node_id, 1, True))
    with fp.connect(c.uri, token=token("reader", "r")) as reader:
        with pytest.raises(fp.Forbidden):
            reader.call(fp.wire.Heartbeat(victim.node_id))
    with fp.connect(c.uri, token=token("node", victim.node_id)) as stolen:
        with pytest.raises(fp.NodeConflict, match="already served by"):
            raw_action(stolen, "register-node", body)
    with fp.connect(c.uri, token=SECRET, host="127.0.0.99") as owner:
        assert [n.uri for n in owner.nodes() if n.node_id == victim.node_id] == [victim.uri]
        # the lie left no mark
        assert not next(n for n in owner.nodes() if n.node_id == victim.node_id).low_space
        assert owner.open("shared").to_arrow().equals(table_of(3000, 1))


def test_copy_to_only_reaches_live_nodes_of_the_cluster(guarded):
    c = guarded
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted = []

    def watch() -> None:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    watcher = threading.Thread(target=watch)
    watcher.start()
    node = flight.connect(c.nodes[0].uri)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token('node', 'catalog')}".encode())])
    messages = set()
    for target in (f"grpc://127.0.0.1:{port}", "grpc://127.0.0.1:1", "grpc://example.invalid:80"):
        body = json.dumps({"dataset": "shared", "version": 1, "part": [0, 0], "target": target}).encode()
        with pytest.raises(flight.FlightError) as info:
            list(node.do_action(flight.Action("copy-to", body), options=options))
        assert code_of(info.value) == "INVALID_REQUEST"
        messages.add(wire.error_message(info.value))
    watcher.join()
    listener.close()
    assert accepted == []  # nothing was dialled, let alone sent
    assert len(messages) == 1  # an open, a closed and an unknown port look the same: no port scanner


def test_metrics_bind_where_the_operator_says_and_name_no_dataset(root, new_cluster):
    with new_cluster(0, process=True, root=root / "m") as c:
        node = c.add_node(c.ips[0], args=["--metrics-port", "0"])
        url = node.uris["node-metrics"]
        assert url.startswith("http://127.0.0.1:")  # loopback unless --metrics-host says otherwise
        with fp.connect(c.uri) as client:
            client.put("secret-project-name", table_of(10))
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        assert "flightpart_held_partitions" in body and "secret-project-name" not in body


def test_a_named_group_may_map_partitions_and_no_one_else(root, new_cluster):
    uid, gid = other_user()
    group = "flightpart-readers"
    if subprocess.run(["getent", "group", group], capture_output=True).returncode != 0:
        made = subprocess.run(["groupadd", "--system", group], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"cannot create a group: {made.stderr.strip()}")
    readers = int(subprocess.run(["getent", "group", group], capture_output=True, text=True).stdout.split(":")[2])
    with new_cluster(0, process=True, root=root / "g") as c:
        (root / "g").chmod(0o755)
        c.add_node(c.ips[0], args=["--group", group])
        with fp.connect(c.uri) as client:
            client.put("team", table_of(100, 5), tiling=(1, 1))
        partition = next((root / "g").glob("node-*/datasets/team/v1/0_0.arrow"))
        assert partition.stat().st_mode & 0o777 == 0o640 and partition.stat().st_gid == readers
        assert partition.parent.stat().st_mode & 0o777 == 0o750

        def reader_as(groups: list[int]):
            def switch() -> None:
                os.setgroups(groups)
                os.setgid(gid)
                os.setuid(uid)
            return subprocess.run(["/bin/sh", "-c", TRY_OPEN, "sh", str(partition)], capture_output=True, text=True,
                                  preexec_fn=switch, timeout=60).stdout.strip()

        assert reader_as([readers]) == f"read {partition}"  # a member of the group maps it zero-copy
        assert reader_as([]) == f"denied {partition}"       # the same user outside the group does not
