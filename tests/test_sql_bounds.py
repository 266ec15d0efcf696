"""The catalog's SQL service is bounded per caller and in total: answers counted as DuckDB produces them, parameters
as they arrive, prepared statements per caller, spill space on disk, query slots shared among callers. The catalog
runs as a real process (in a memory cgroup for the attacks of its memory), readers with tokens of their own use the
ADBC driver, or raw Flight calls where ADBC cannot make the attack."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart import sqlwire, tokens, wire

from helpers import code_of, wait_until

dbapi = pytest.importorskip("adbc_driver_flightsql.dbapi", reason="adbc-driver-flightsql is in the test extra")

SECRET = tokens.new_secret()
MEMORY_LIMIT = int(2.5 * (1 << 30))
"""The catalog's memory cgroup: what a catalog with the default SQL limits must live within, attacked."""
ROWS = 20_000


def reader_token(name: str) -> str:
    return tokens.role_token(SECRET.encode(), "reader", name)


def secret_file(root: Path) -> Path:
    path = root / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


def adbc(uri: str, name: str):
    return dbapi.connect(uri, db_kwargs={"adbc.flight.sql.authorization_header": f"Bearer {reader_token(name)}"})


class Raw:
    """Raw Flight SQL calls as reader ``name``."""

    def __init__(self, uri: str, name: str):
        self.client = flight.connect(uri)
        self.options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {reader_token(name)}".encode())],
                                                timeout=300)

    def info(self, query: str) -> flight.FlightInfo:
        return self.client.get_flight_info(command(sqlwire.STATEMENT_QUERY, (1, query)), self.options)

    def prepare(self, query: str) -> bytes:
        action = flight.Action("CreatePreparedStatement",
                               sqlwire.pack(sqlwire.CREATE_PREPARED, sqlwire.message((1, query))))
        body = next(iter(self.client.do_action(action, self.options))).body.to_pybytes()
        return sqlwire.bytes_field(sqlwire.unpack(body).value, 1, "handle")

    def bind(self, handle: bytes, values: pa.Table, rows_per_batch: int | None = None) -> int:
        """Bind ``values``, sent in batches of ``rows_per_batch``; the batches written before the call ended (also
        in :attr:`sent`, when the catalog's refusal is raised)."""
        writer, answer = self.client.do_put(command(sqlwire.PREPARED_QUERY, (1, handle)), values.schema, self.options)
        self.sent = 0
        try:
            for batch in values.to_batches(max_chunksize=rows_per_batch):
                writer.write_batch(batch)
                self.sent += 1
            writer.done_writing()
            answer.read()
        except (pa.ArrowException, OSError):
            pass  # the call ended: closing it raises the catalog's error
        writer.close()
        return self.sent

    def run_prepared(self, handle: bytes) -> pa.Table:
        info = self.client.get_flight_info(command(sqlwire.PREPARED_QUERY, (1, handle)), self.options)
        return self.client.do_get(info.endpoints[0].ticket, self.options).read_all()


def command(name: str, *fields) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(sqlwire.pack(name, sqlwire.message(*fields)))


def stats(uri: str) -> dict:
    with fp.connect(uri, token=SECRET) as owner:
        return owner.call(wire.GetStats()).values


class MemoryCgroup:
    """A cgroup v1 memory cgroup under this process's own, limited to ``limit`` bytes, holding ``pid``; removed by
    :meth:`remove` (its process moved back first). Skips the test, saying why, where it cannot be made."""

    def __init__(self, pid: int, limit: int, name: str):
        mine = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                     if line.split(":", 2)[1] == "memory"), None)
        root = Path("/sys/fs/cgroup/memory")
        if mine is None or not (root / "cgroup.procs").exists():
            pytest.skip("no cgroup v1 memory controller at /sys/fs/cgroup/memory")
        self.parent = root / mine.lstrip("/")
        self.path = self.parent / name
        try:
            self.path.mkdir()
            (self.path / "memory.limit_in_bytes").write_text(str(limit))
            (self.path / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            self.remove()
            pytest.skip(f"cannot make a memory cgroup for the catalog ({exc}): this needs root and cgroup v1")
        self.pid = pid

    def peak(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def ooms(self) -> int:
        return int((self.path / "memory.failcnt").read_text())

    def remove(self) -> None:
        if not self.path.exists():
            return
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                (self.parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        try:
            self.path.rmdir()
        except OSError:
            pass


@pytest.fixture(scope="module")
def bounded(tmp_path_factory, make_cluster):
    """A catalog with the default SQL limits in a 2.5 GiB memory cgroup, a node, a small dataset."""
    root = tmp_path_factory.mktemp("sql-bounds")
    with make_cluster(1, process=True, root=root / "c", extra_args=["--secret-file", str(secret_file(root))]) as c:
        with fp.connect(c.uri, token=SECRET) as owner:
            owner.put("trips", pa.table({"k": list(range(ROWS)), "fare": [k * 0.5 for k in range(ROWS)]}))
        group = MemoryCgroup(c.catalog.pid, MEMORY_LIMIT, f"flightpart-sql-bounds-{os.getpid()}")
        try:
            yield c, group
        finally:
            group.remove()


def others_are_answered(uri: str, stop: threading.Event, failures: list, name: str = "alice") -> threading.Thread:
    """A thread in which reader ``name`` runs ``SELECT 1`` and a dataset query again and again until ``stop``, each
    failure kept in ``failures``; it runs at least twice."""

    def run() -> None:
        with adbc(uri, name) as conn:
            done = 0
            while not stop.is_set() or done < 2:
                try:
                    with conn.cursor() as cur:
                        cur.execute("SELECT 1 AS one")
                        assert cur.fetch_arrow_table().column("one").to_pylist() == [1]
                        # no filter: a node's filter checker, starved of CPU by the attacks on this machine, may stall
                        cur.execute("SELECT count(*) AS n, sum(k) AS s FROM trips")
                        assert cur.fetch_arrow_table().to_pylist() == [{"n": ROWS, "s": ROWS * (ROWS - 1) // 2}]
                except Exception as exc:
                    failures.append(exc)
                done += 1
                time.sleep(0.2)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def attacked(cluster, group, attack) -> list:
    """Run ``attack()`` while another reader queries; the catalog must live, within its cgroup, and the other
    reader must be answered throughout. The attack's outcomes are returned."""
    stop, failures = threading.Event(), []
    other = others_are_answered(cluster.uri, stop, failures)
    try:
        outcomes = attack()
    finally:
        stop.set()
        other.join(300)
    assert cluster.catalog.proc.poll() is None, f"the catalog died (peak {group.peak():,} bytes):\n" \
                                                f"{cluster.catalog.log()[-3000:]}"
    assert not failures, failures[:3]
    return outcomes


def concurrently(count: int, work) -> list:
    """``work(k)`` in ``count`` threads at once; each one's result or exception."""
    outcomes: list = [None] * count

    def run(k: int) -> None:
        try:
            outcomes[k] = work(k)
        except Exception as exc:
            outcomes[k] = exc

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return outcomes


@pytest.mark.slow  # answers of gigabytes each, refused as they are produced
def test_huge_answers_at_once_are_stopped_as_they_are_produced_and_the_catalog_lives(bounded):
    """Three ``SELECT * FROM range(180000000)`` at once (1.44 GB each) had each been held whole before the first was
    refused, and killed a catalog in 2.5 GiB; three answers each under the per-answer limit, their streams opened
    and left unread, fill at most the caller's share."""
    cluster, group = bounded
    raw = Raw(cluster.uri, "mallory")

    def huge(_k: int):
        with adbc(cluster.uri, "mallory") as conn, conn.cursor() as cur:
            cur.execute("SELECT * FROM range(180000000)")
            return cur.fetch_arrow_table().num_rows

    refused = attacked(cluster, group, lambda: concurrently(3, huge))
    assert all(isinstance(r, dbapi.Error) for r in refused), refused
    # the per-answer limit (LIMIT_EXCEEDED), or the caller's share held by the others being produced (BUSY)
    assert all("the answer passed 536,870,912 bytes" in str(r) or "busy: this caller's answers hold" in str(r)
               for r in refused), refused
    assert any("the answer passed" in str(r) for r in refused), refused

    def held_unread(_k: int):
        info = raw.info("SELECT * FROM range(60000000)")  # 480 MB, under the 512 MiB an answer may have
        stream = raw.client.do_get(info.endpoints[0].ticket, raw.options)
        stream.read_chunk()
        return stream

    outcomes = attacked(cluster, group, lambda: concurrently(3, held_unread))
    held = [o for o in outcomes if isinstance(o, flight.FlightStreamReader)]
    busy = [o for o in outcomes if isinstance(o, flight.FlightError)]
    assert len(held) == 1 and len(busy) == 2, outcomes  # the caller's share is half of the 1 GiB
    assert all(code_of(b) == "BUSY" for b in busy)
    held[0].cancel()
    assert group.peak() < MEMORY_LIMIT and cluster.catalog.proc.poll() is None


@pytest.mark.slow  # gigabytes of parameters sent
def test_bound_parameters_never_closed_and_huge_binds_leave_the_catalog_alive(bounded):
    """Prepared statements bound with 15.9 MiB each and never executed or closed had each been kept (4,096 of them:
    64 GB); a 600 MiB bind had been read whole before it was refused, three at once killing the catalog. A caller
    keeps at most half of the 256 MiB of bound values, its oldest forgotten first; another caller's statement
    stays; binds are read two at a time, one per caller."""
    cluster, group = bounded
    mallory, alice = Raw(cluster.uri, "mallory"), Raw(cluster.uri, "alice")
    kept = alice.prepare("SELECT count(*) AS n FROM trips WHERE k < ?")
    alice.bind(kept, pa.table({"p": [10]}))
    big = pa.table({"p": [b"x" * (15_900 << 10)]})

    def flood() -> list:
        handles = []
        for _ in range(150):  # 2.4 GB bound in all
            handle = mallory.prepare("SELECT octet_length(CAST(? AS BLOB)) AS n")
            mallory.bind(handle, big)
            handles.append(handle)
        return handles

    handles = attacked(cluster, group, flood)
    figures = stats(cluster.uri)
    assert figures["sql_prepared_bytes"] <= 128 << 20, figures  # mallory's share of the 256 MiB
    with pytest.raises(pa.ArrowInvalid, match="unknown prepared statement") as forgotten:  # INVALID_ARGUMENT
        mallory.run_prepared(handles[0])
    assert "[flightpart INVALID_REQUEST at prepared_statement_handle]" in str(forgotten.value)
    assert mallory.run_prepared(handles[-1]).column("n").to_pylist() == [15_900 << 10]
    assert alice.run_prepared(kept).column("n").to_pylist() == [10]

    huge = pa.table({"p": [b"y" * (600 << 20)]})  # one message: gRPC receives it whole before the catalog sees it
    handle = mallory.prepare("SELECT octet_length(CAST(? AS BLOB)) AS n")
    outcomes = attacked(cluster, group, lambda: concurrently(3, lambda _k: mallory.bind(handle, huge)))
    assert all(isinstance(o, flight.FlightError) for o in outcomes), outcomes
    assert all(code_of(o) in ("LIMIT_EXCEEDED", "BUSY") for o in outcomes), outcomes
    assert group.peak() < MEMORY_LIMIT


FLOOD = "SELECT count(*) AS n FROM range(20000) a, range(3000) b WHERE hash(a.range + b.range) % 7 = 0"
"""A query of a second or more on this machine: the flood's."""


@pytest.mark.slow  # a flood of queries for some seconds
def test_one_readers_flood_leaves_slots_for_another_readers_select_1(bounded):
    """One reader's many queries had held all 4 query slots and all 16 queue places: another reader's
    ``SELECT 1`` was refused BUSY 19 times of 20. A caller now runs at most 2 at once and waits in at most 8
    places; the other reader's 20 ``SELECT 1`` are all answered while the flood goes on."""
    cluster, group = bounded
    stop = threading.Event()
    flooded: dict[str, int] = {"answered": 0, "busy": 0}
    unexpected: list = []

    def flood(_k: int) -> None:
        with adbc(cluster.uri, "mallory") as conn:
            while not stop.is_set():
                try:
                    with conn.cursor() as cur:
                        cur.execute(FLOOD)
                        cur.fetch_arrow_table()
                    flooded["answered"] += 1
                except dbapi.Error as exc:
                    if "retry shortly" not in str(exc):  # BUSY, sent as UNAVAILABLE
                        unexpected.append(exc)
                        return
                    flooded["busy"] += 1

    def select_1() -> list:
        wait_until(lambda: stats(cluster.uri)["sql_queries_running"] >= 2, 120, "the flood to run")
        answers = []
        with adbc(cluster.uri, "alice") as conn:
            for _ in range(20):
                with conn.cursor() as cur:
                    cur.execute("SELECT 1 AS one")
                    answers.append(cur.fetch_arrow_table().column("one").to_pylist())
        return answers

    flooders = [threading.Thread(target=flood, args=(k,)) for k in range(24)]
    for t in flooders:
        t.start()
    try:
        answers = attacked(cluster, group, select_1)
    finally:
        stop.set()
        for t in flooders:
            t.join(300)
    assert answers == [[1]] * 20
    assert not unexpected, unexpected
    assert flooded["busy"] > 0 and flooded["answered"] > 0, flooded  # the flood met its share, and ran within it
    wait_until(lambda: stats(cluster.uri)["sql_queries_running"] == 0, 120, "the flood to end")


# ---------------------------------------------------------------------------------------------- small limits


@pytest.fixture(scope="module")
def spilling(tmp_path_factory, make_cluster):
    """A catalog whose DuckDB has 64 MiB of memory and 64 MiB of spill space in a directory the test watches, and
    forgets prepared statements after 5 s unused; a node."""
    root = tmp_path_factory.mktemp("sql-spill")
    parent = root / "spill-parent"
    parent.mkdir()
    env = {"FLIGHTPART_SQL_MEMORY": "64MiB", "FLIGHTPART_SQL_SPILL_BYTES": "64MiB",
           "FLIGHTPART_SQL_SPILL_DIR": str(parent), "FLIGHTPART_SQL_PREPARED_IDLE": "5"}
    with make_cluster(1, process=True, root=root / "c", env=env,
                      extra_args=["--secret-file", str(secret_file(root))]) as c:
        with fp.connect(c.uri, token=SECRET) as owner:
            owner.put("trips", pa.table({"k": list(range(ROWS)), "fare": [k * 0.5 for k in range(ROWS)]}))
        yield c, parent


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def test_large_sorts_stop_at_the_servers_spill_limit_and_the_disk_is_not_filled(spilling):
    """Two readers' large sorts had filled the catalog's disk with spill files, and the error read as the client's
    mistake. DuckDB spills into a private directory (0700) outside the catalog's state, within the spill limit
    shared by every query: each sort is refused LIMIT_EXCEEDED naming the server's spill limit, the spill files
    never pass it, and the catalog answers on."""
    cluster, parent = spilling
    sort = "SELECT range AS r, hash(range) AS h FROM range(40000000) ORDER BY h LIMIT 5 OFFSET 30000000"
    most = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            most[0] = max(most[0], tree_bytes(parent))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()

    def sorted_by(k: int):
        if k == 1:  # a raw Flight SQL call, which shows the code
            return Raw(cluster.uri, "bob").info(sort)
        with adbc(cluster.uri, "alice") as conn, conn.cursor() as cur:
            cur.execute(sort)
            return cur.fetch_arrow_table()

    try:
        through_adbc, through_flight = concurrently(2, sorted_by)
    finally:
        stop.set()
        watcher.join()
    adbc_status = pytest.importorskip("adbc_driver_manager").AdbcStatusCode
    assert isinstance(through_adbc, dbapi.OperationalError), through_adbc  # not the ProgrammingError of a bad query
    assert through_adbc.status_code == adbc_status.UNKNOWN  # not INVALID_ARGUMENT (RESOURCE_EXHAUSTED cannot be sent)
    assert isinstance(through_flight, flight.FlightError) and code_of(through_flight) == "LIMIT_EXCEEDED"
    for text in (str(through_adbc), str(through_flight)):
        assert "spill space" in text and "server's limit" in text and f"{64 << 20:,} bytes" in text, text
    assert 0 < most[0] <= (64 << 20) + (8 << 20), most[0]  # DuckDB writes a block past the limit at most
    spill = [p for p in parent.iterdir() if p.name.startswith("flightpart-sql-spill-")]
    assert len(spill) == 1 and stat.S_IMODE(spill[0].stat().st_mode) == 0o700
    state = Path(cluster.root / "catalog").resolve()
    assert state not in spill[0].resolve().parents
    with adbc(cluster.uri, "alice") as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) AS n FROM trips")
        assert cur.fetch_arrow_table().column("n").to_pylist() == [ROWS]


def test_parameters_are_counted_as_they_arrive_and_refused_past_their_limit(spilling):
    """A bind of 600 MiB in 1 MiB batches had been read whole before it was refused: it is refused LIMIT_EXCEEDED
    at its first batch past the 16 MiB one bind may carry, and the rest is never sent."""
    cluster, _parent = spilling
    raw = Raw(cluster.uri, "mallory")
    values = pa.table({"p": pa.array([b"z" * (1 << 20)] * 600, pa.binary())})
    handle = raw.prepare("SELECT octet_length(CAST(? AS BLOB)) AS n")
    with pytest.raises(flight.FlightError) as refused:
        raw.bind(handle, values, rows_per_batch=1)
    assert code_of(refused.value) == "LIMIT_EXCEEDED" and "the rest not read" in str(refused.value)
    assert raw.sent < 200, raw.sent  # gRPC's buffers take a few batches more; the catalog read 17 of them
    assert stats(cluster.uri)["sql_prepared_bytes"] == 0
    assert raw.bind(handle, pa.table({"p": [b"fits"]})) == 1
    assert raw.run_prepared(handle).column("n").to_pylist() == [4]


def test_a_prepared_statement_unused_for_its_idle_time_is_forgotten(spilling):
    """A statement never closed is forgotten once unused for ``$FLIGHTPART_SQL_PREPARED_IDLE`` seconds (5 here):
    its handle is then refused as unknown, with a code; one used meanwhile stays."""
    cluster, _parent = spilling
    raw = Raw(cluster.uri, "carol")
    idle = raw.prepare("SELECT count(*) AS n FROM trips WHERE k < ?")
    raw.bind(idle, pa.table({"p": [5]}))
    assert raw.run_prepared(idle).column("n").to_pylist() == [5]
    wait_until(lambda: stats(cluster.uri)["sql_prepared"] == 0, 60, "the idle statement to be forgotten")
    with pytest.raises(pa.ArrowInvalid, match="unknown prepared statement") as forgotten:  # INVALID_ARGUMENT
        raw.run_prepared(idle)
    assert "[flightpart INVALID_REQUEST at prepared_statement_handle]" in str(forgotten.value)
