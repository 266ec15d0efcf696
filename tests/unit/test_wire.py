"""Every wire format decodes what it encodes, and refuses what it should, with no cluster."""

from __future__ import annotations

import base64
import dataclasses
import json

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart import tokens, wire
from flightpart.io import layout

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string())], metadata={b"k": b"v"})
HELD = wire.HeldPartition("sales", 3, (1, 0), rows=10, nbytes=880, schema=SCHEMA,
                          stats={"a": {"nulls": 0, "min": -3, "max": 9}, "b": {"nulls": 2}})

COMMIT = wire.Commit("sales", 4, SCHEMA, (20, 2), (2, 1), (wire.CommitPart((0, 0), (0, 0), (10, 2), ("n1",)),
                                                          wire.CommitPart((1, 0), (10, 0), (10, 2), ("n1", "n2"))), 2)

MESSAGES = [
    HELD,
    wire.PutTrailer(12),
    wire.PartHeader((3, 1)),
    wire.PartRun(((3, 1), (4, 1)), (10, 0)),
    wire.EndpointRows(200),
    wire.TopRows((wire.SortKey("fare", True), wire.SortKey("id", nulls_first=True)), 7),
    wire.CheckParts("sales", 3, ((1, 0), (2, 0))),
    wire.CheckedParts(((2, 0),)),
    wire.PutReceipts((HELD, wire.HeldPartition("sales", 3, (2, 0)))),
    wire.Held("sales", 3),
    wire.HeldReply((HELD, wire.HeldPartition("sales", 3, (2, 0)))),
    wire.HeldReply((wire.HeldPartition("sales", 3, (2, 0)),), (SCHEMA,), (0,), True),
    wire.Held("sales", 3, (4, 1)),
    wire.Drop("sales", 3),
    wire.Drop("sales"),
    wire.DropFiles("sales", 3),
    wire.DropFiles("sales", through=9, cluster="c1"),
    wire.CopyTo("sales", 3, (1, 0), "grpc://127.0.0.3:1234"),
    wire.PartPlace("sales", 3, (1, 0)),
    wire.ScrubReport(4, 1 << 20, (wire.PartPlace("sales", 3, (1, 0)),), (wire.PartPlace("old", 1, (0, 2)),)),
    wire.ScrubReport(),
    wire.ReportDamage("n1", (wire.PartPlace("sales", 3, (1, 0)), wire.PartPlace("old", 1, (0, 2)))),
    wire.GetNodeInfo(),
    wire.Lead("c1", 3, "grpc://b:8815"),
    wire.Following("n1"),
    wire.GetLeadership(),
    wire.Leadership("leader", "grpc://b:8815", "grpc://b:8815", 3, 1795530474.5, ("grpc://a:8815",)),
    wire.Seal("c1", COMMIT, epoch=2),
    wire.DropFiles("sales", 3, cluster="c1", epoch=7),
    wire.CopyTo("sales", 3, (1, 0), "grpc://127.0.0.3:1234", "c1", 7),
    wire.NodeInfo("n1", "grpc://127.0.0.2:1", "127.0.0.2", 77, "/data", "0.1.0"),
    wire.GetStats(),
    wire.GetQueries(),
    wire.QueriesReply({"running": [],
                       "recent": [{"id": 1, "caller": "reader:a", "text": "SELECT 1", "outcome": "ok"}]}),
    wire.StatsReply({"bytes_served": 10, "free_bytes": 1 << 40, "problems": ["disk low"], "clock": None, "skew": 0.5}),
    wire.ListNodes(),
    wire.NodeList((wire.NodeRow("n1", "grpc://127.0.0.2:1", "127.0.0.2", 77, "/data", 1.79e9, True, 1 << 30, False,
                                -0.25),
                   wire.NodeRow("n2", "grpc://127.0.0.3:1", "127.0.0.3", 78))),
    wire.Scrub(),
    wire.ScrubCluster(),
    wire.ClusterScrubReport((wire.NodeScrubReport(4, 10, (wire.PartPlace("sales", 3, (1, 0)),), uri="grpc://a:1",
                                                  node_id="n1"),), ("grpc://b:1",), 1, 0),
    wire.Repair(),
    wire.RepairReport((wire.ReplicaCopy("sales", 3, (1, 0), "grpc://b:1"),), (wire.PartPlace("old", 1, (0, 2)),)),
    wire.RepairReport((), (), (wire.CopyFailed("sales", 3, (1, 0), "UNAVAILABLE node b did not answer"),)),
    wire.Removed(3),
    wire.Copied(1 << 20),
    wire.Checked(),
    wire.Sealed(False),
    wire.Committed("sales", 4),
    wire.Aborted(4),
    wire.Dropped("sales", None, 3),
    wire.VersionList((1, 2, 4)),
    wire.AssembleReply((HELD,), 1),
    wire.RegisterNode("n1", "grpc://127.0.0.2:1", "127.0.0.2", 77, "/data", "0.1.0", (HELD,), cluster="c1",
                      sealed=(COMMIT,), versions=(wire.VersionRef("sales", 4), wire.VersionRef("old", 9))),
    wire.RegisterReply("n1", "c1", (wire.VersionRef("old", 1),), (COMMIT,)),
    wire.VersionRef("sales", 3),
    wire.Abort("sales", 3),
    wire.Heartbeat("n1", free_bytes=1 << 30, low_space=True),
    wire.Heartbeat("n1", free_bytes=1 << 30, clock_ms=1_790_000_000_123),
    wire.Seal("c1", COMMIT),
    wire.DropFiles("sales", 3, cluster="c1", pending_only=True),
    wire.HeartbeatReply(True),
    wire.Begin("sales"),
    wire.ListVersions("sales"),
    wire.VersionReply(4),
    COMMIT,
    wire.PublishBegin("sales", 3, 1),
    wire.PublishPart("sales", 4, 1, 10, 2, "n1", SCHEMA),
    wire.PublishReply(4, False, 2),
    wire.Ticket("sales", 3, (0, 0), more=((1, 0), (2, 0))),
    wire.Ticket("sales", 3, (0, 1), ("b",), more=((5, 1),)),
    wire.Aggregate((("a", "sum"), ("", "count_all")), ("b",)),
    dataclasses.replace(COMMIT, base=3),
    wire.Assemble("sales", 3, 4, 1, (wire.AssemblePart((0, 0), (0, 10)),)),
    wire.Assemble("sales", 3, 4, 2, (wire.AssemblePart((1, 1), (10, 20)),), deadline_ms=35_000),
    wire.Relink("sales", 5, 7, (wire.LinkPart((0, 0), (3, 0)), wire.LinkPart((1, 1), (4, 1)))),
    wire.AccessChanged(True, "user alice added as reader"),
    wire.AddUser("alice", "a-long-password", "writer"),
    wire.ChangeUser("alice", password="another-password"),
    wire.ChangeUser("alice", role="admin"),
    wire.RemoveUser("alice"),
    wire.UserList((wire.UserRow("alice", "reader", ("sales", "ops"), 1.5e9),)),
    wire.ListUsers(),
    wire.SetMember("sales", "alice", False),
    wire.GrantList((wire.GrantRow("read", "sales_*", "sales"),)),
    wire.SetGrant("write", "hr?", "bob"),
    wire.ListGrants(),
    wire.RevokeSessions(user="alice"),
    wire.RevokeSessions(token="fp3:reader:x:0:sig"),
    wire.Revocations((wire.RevocationEntry("alice", "*", 1.7e9, 1.8e9),), epoch=3),
    wire.RevocationsTaken(1),
    wire.RegisterReply("n1", "c", revocations=(wire.RevocationEntry("#abc", "sales", 1.0, 2.0),)),
]


def same(a: wire.Message, b: wire.Message) -> bool:
    """Equal field by field (schemas compared with their metadata)."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, pa.Schema):
            if not (isinstance(y, pa.Schema) and x.equals(y, check_metadata=True)):
                return False
        elif isinstance(x, tuple) and x and isinstance(x[0], wire.Message):
            if len(x) != len(y) or not all(same(p, q) for p, q in zip(x, y)):
                return False
        elif isinstance(x, wire.Message):
            if not same(x, y):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message):
    assert same(type(message).decode(message.encode()), message)


@pytest.mark.parametrize("message",
                         [m for m in MESSAGES if dataclasses.fields(m)
                          and not isinstance(m, (wire.StatsReply, wire.QueriesReply))],
                         ids=lambda m: type(m).__name__)
def test_every_message_refuses_unknown_and_missing_keys(message):
    body = message.to_json()
    with pytest.raises(fp.RequestRejected, match="unexpected key 'evil'") as info:
        type(message).from_json({**body, "evil": 1})
    assert info.value.code == "INVALID_REQUEST"
    required = [f.name for f in dataclasses.fields(message) if f.default is dataclasses.MISSING]
    if required:
        missing = {k: v for k, v in body.items() if k != required[0]}
        with pytest.raises(fp.RequestRejected, match=f"missing '{required[0]}'") as info:
            type(message).from_json(missing)
        assert info.value.field.endswith(required[0])


def every_message_class() -> list[type[wire.Message]]:
    def below(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in (sub, *below(sub))]

    return [c for c in below(wire.Message) if c.__module__ == wire.__name__]


@pytest.mark.parametrize("body", [{"name": "../etc", "password": "long-enough-1"}, {"name": "a", "password": 7},
                                  {"name": "a", "password": "x" * 2000},
                                  {"name": "a", "password": "p", "role": "node"}],
                         ids=["name", "password-type", "password-length", "role"])
def test_a_user_is_added_only_with_a_valid_name_password_and_role(body):
    with pytest.raises(fp.RequestRejected):
        wire.AddUser.from_json(body)


@pytest.mark.parametrize("pattern", ["", "a/b", "x" * 129, "sales;drop", " sales"])
def test_a_grant_takes_only_a_dataset_pattern(pattern):
    with pytest.raises(fp.RequestRejected, match="dataset pattern"):
        wire.SetGrant.from_json({"access": "read", "pattern": pattern, "grantee": "alice"})


def test_every_message_class_round_trips_here():
    """A new message (a request, a reply, a nested part) is added to MESSAGES above, so it is round-tripped too."""
    tested = {type(m) for m in MESSAGES} | {wire.Ticket, wire.Tombstones, wire.CommitPart, wire.AssemblePart,
                                            wire.LinkPart, wire.HeldPartition, wire.ReplicaCopy, wire.CopyFailed,
                                            wire.NodeRow, wire.NodeScrubReport, wire.SortKey, wire.RevocationEntry,
                                            wire.UserRow, wire.GrantRow}
    assert [c.__name__ for c in every_message_class() if c not in tested] == []


def test_every_request_names_its_reply_and_every_reply_is_a_message():
    requests = [c for c in every_message_class() if c.ACTION]
    for cls in requests:
        assert cls.REPLY is not None and issubclass(cls.REPLY, wire.Message), cls
        assert not cls.REPLY.ACTION, f"{cls.__name__} answers with a request"
    assert [c.__name__ for c in every_message_class() if c.REPLY is not None and not c.ACTION] == []


def test_a_stats_reply_is_kept_as_received_for_its_readers_to_judge():
    assert wire.StatsReply.decode(b'{"a": 1, "b": 2.5, "c": ["x"], "d": null}')["b"] == 2.5
    assert wire.StatsReply.decode(b'[1, 2]').values == [1, 2]  # the status page says "the reply is a list of 2"
    with pytest.raises(fp.RequestRejected, match="lists of running and recent"):
        wire.QueriesReply.decode(b'{"running": 1}')
    queries = wire.QueriesReply.decode(b'{"running": [{"id": 2}], "recent": [{"id": 1, "outcome": "ok"}]}')
    assert (queries.running, queries.recent) == ([{"id": 2}], [{"id": 1, "outcome": "ok"}])


@pytest.mark.parametrize("body, field", [
    ({"dataset": "a/b", "version": 1}, "held.dataset"),
    ({"dataset": "x", "version": -1}, "held.version"),
    ({"dataset": "x", "version": True}, "held.version"),
    ({"dataset": "x", "version": "1"}, "held.version"),
    ({"dataset": 3, "version": 1}, "held.dataset"),
])
def test_fields_are_checked_by_type_and_named(body, field):
    with pytest.raises(fp.RequestRejected) as info:
        wire.Held.from_json(body)
    assert info.value.field == field


def test_commit_nested_parts_name_their_index():
    body = COMMIT.to_json()
    body["partitions"] = [p.to_json() for p in COMMIT.partitions]  # the row form is read too
    assert wire.Commit.from_json(body) == COMMIT
    body["partitions"][1]["shape"] = [10]
    with pytest.raises(fp.RequestRejected) as info:
        wire.Commit.from_json(body)
    assert info.value.field == "commit.partitions[1].shape"


@pytest.mark.parametrize("column, value, field", [
    ("rows", [10, -1], "commit.partitions.rows"),
    ("rows", [10, True], "commit.partitions.rows"),
    ("rows", [10], "commit.partitions.rows"),
    ("i", "01", "commit.partitions.i"),
    ("holders", [[0], [7]], "commit.partitions.holders"),
    ("holders", [[0], []], "commit.partitions.holders"),
    ("holders", [[0], [0.0]], "commit.partitions.holders"),
    ("nodes", [3], "commit.partitions.nodes[0]"),
    ("extra", [1, 2], "commit.partitions"),
])
def test_commit_parts_travel_as_columns_and_each_column_is_checked(column, value, field):
    body = COMMIT.to_json()
    assert isinstance(body["partitions"], dict) and len(body["partitions"]["rows"]) == len(COMMIT.partitions) == 2
    assert wire.Commit.from_json(body) == COMMIT
    body["partitions"][column] = value
    with pytest.raises(fp.RequestRejected) as info:
        wire.Commit.from_json(body)
    assert info.value.field == field


def test_schema_text_is_arrow_ipc_and_refuses_junk():
    assert wire.schema_from_text(wire.schema_to_text(SCHEMA), "s").equals(SCHEMA, check_metadata=True)
    for junk in ["", "not base64!", "aGVsbG8=", 12]:
        with pytest.raises(fp.RequestRejected, match="base64 Arrow IPC schema") as info:
            wire.schema_from_text(junk, "commit.schema")
        assert info.value.field == "commit.schema"


def test_ticket_round_trip_and_strictness():
    ticket = wire.Ticket("sales", 3, (1, 2), ("a", "b"), (5, 9))
    assert wire.Ticket.decode(ticket.encode()) == ticket
    assert wire.Ticket.decode(wire.Ticket("s", 0, (0, 0)).encode()) == wire.Ticket("s", 0, (0, 0))
    bad = [
        (b'{"dataset":"s","version":1,"part":[0,0],"columns":["a","a"]}', "ticket.columns"),
        (b'{"dataset":"s","version":1,"part":[0,0],"rows":[5,2]}', "ticket.rows"),
        (b'{"dataset":"s","version":1}', "ticket.part"),
        (b'{"dataset":"s","version":1,"part":[0,0],"x":1}', "ticket"),
        (b"\x80", "ticket"),
        (b"x" * (2 << 20), "ticket"),
    ]
    for raw, field in bad:
        with pytest.raises(fp.RequestRejected) as info:
            wire.Ticket.decode(raw)
        assert info.value.field == field, raw[:60]


def test_a_filtered_or_aggregated_ticket_round_trips_and_a_plain_one_is_unchanged():
    agg = wire.Aggregate((("a", "mean"),), ("b",))
    ticket = wire.Ticket("sales", 3, (1, 0), ("a",), (0, 9), b"\x00substrait\xff", (2, 5), agg)
    assert wire.Ticket.decode(ticket.encode()) == ticket
    assert set(json.loads(wire.Ticket("s", 1, (0, 0)).encode())) == {"dataset", "version", "part", "columns", "rows"}
    bad = [
        (b'{"dataset":"s","version":1,"part":[0,0],"filter":"not base64!"}', "ticket.filter"),
        (b'{"dataset":"s","version":1,"part":[0,0],"filter":"AA==","matched":[5,2]}', "ticket.matched"),
        (b'{"dataset":"s","version":1,"part":[0,0],"matched":[0,2]}', "ticket.matched"),
        (b'{"dataset":"s","version":1,"part":[0,0],"aggregate":{"functions":[["a","median"]]}}',
         "ticket.aggregate.functions[0]"),
        (b'{"dataset":"s","version":1,"part":[0,0],"aggregate":{"functions":[["a"]]}}',
         "ticket.aggregate.functions[0]"),
    ]
    for raw, field in bad:
        with pytest.raises(fp.RequestRejected) as info:
            wire.Ticket.decode(raw)
        assert info.value.field == field, raw[:80]


def test_statistics_are_checked_as_they_arrive():
    ok = {"a": {"nulls": 0, "min": 1, "max": 2}, "s": {"nulls": 1}}
    assert wire.p_stats(ok, "stats") == ok
    for bad in [[1], {"a": {"nulls": -1}}, {"a": {"min": 1}}, {"a": {"nulls": 0, "min": [1], "max": 2}},
                {"a": {"nulls": 0, "other": 1}}, {"a": {"nulls": 0, "min": "x" * 5000, "max": "y"}}]:
        with pytest.raises(fp.RequestRejected):
            wire.p_stats(bad, "stats")


def test_descriptor_paths_round_trip_and_take_ascii_digits_only():
    path = wire.partition_path("sales", 3, (1, 2))
    assert wire.parse_partition_path(flight.FlightDescriptor.for_path(*path)) == ("sales", 3, (1, 2))
    assert wire.parse_dataset_path(flight.FlightDescriptor.for_path(*wire.dataset_path("sales", 7))) == ("sales", 7)
    assert wire.parse_dataset_path(flight.FlightDescriptor.for_path(*wire.dataset_path("sales"))) == ("sales", None)
    for version in ["١", "𝟏", "-1", "+1", " 1", "1" * 30]:
        with pytest.raises(fp.RequestRejected) as info:
            wire.parse_partition_path(flight.FlightDescriptor.for_path("sales", version, "0", "0"))
        assert info.value.field == "descriptor.version"
    with pytest.raises(fp.InvalidName):
        wire.parse_dataset_path(flight.FlightDescriptor.for_path("../etc"))
    with pytest.raises(fp.RequestRejected):
        wire.parse_dataset_path(flight.FlightDescriptor.for_command(b"sales"))


def test_flight_info_round_trips_through_compact_metadata_and_endpoints():
    replicas = (("grpc://127.0.0.2:1", "127.0.0.2", 11), ("grpc://127.0.0.3:1", "127.0.0.3", 12))
    parts = tuple(wire.PartInfo((i, j), (5 * i, 1 * j), (5, 1), replicas[i % 2:] + replicas[: i % 2], 100 + i + j)
                  for i in range(3) for j in range(2))
    version = wire.VersionInfo("sales", 4, SCHEMA, (15, 2), (3, 2), parts)
    info = wire.encode_flight_info(version)
    assert wire.decode_flight_info(info) == version
    # a FlightInfo without the compact metadata (another producer) decodes from its endpoints
    plain = flight.FlightInfo(info.schema, info.descriptor, info.endpoints, info.total_records, info.total_bytes,
                              app_metadata=wire.dumps({"shape": [15, 2], "partition_tiling": [3, 2], "version": 4}))
    assert wire.decode_flight_info(plain) == version
    assert info.total_bytes == version.nbytes == sum(p.nbytes for p in parts)
    listed = wire.list_entry(wire.encode_flight_info(version, with_endpoints=False))
    assert listed == wire.DatasetEntry("sales", 4, (15, 2), (3, 2), version.nbytes)
    assert listed.to_json() == {"name": "sales", "version": 4, "shape": [15, 2], "partition_tiling": [3, 2],
                                "nbytes": version.nbytes}


@pytest.mark.parametrize("cls", sorted(fp.errors.BY_CODE.values(), key=lambda c: c.code), ids=lambda c: c.code)
def test_every_error_code_round_trips_to_its_class(cls):
    sent = cls("what went wrong", field="ticket.rows")
    code, field = wire.decode_error(wire.encode_error(sent))
    received = fp.errors.error_for(code, "what went wrong", field)
    assert type(received) is cls and received.field == "ticket.rows" and str(received) == "what went wrong"
    assert cls.__name__ in fp.__all__ or cls is fp.FlightpartError


def test_codes_are_unique_and_unknown_codes_are_server_errors():
    classes = [fp.FlightpartError, *fp.errors.BY_CODE.values()]
    assert len({c.code for c in classes}) == len(set(classes))
    assert type(fp.errors.error_for("SOMETHING_NEW", "m")) is fp.ServerError
    assert (wire.decode_error(b"not json") is None and wire.decode_error(b'{"code": 3}') is None
            and wire.decode_error(None) is None)


def test_data_directory_layout_round_trips():
    rel = layout.partition_relpath("sales", 12, (3, 4))
    assert rel == "datasets/sales/v12/3_4.arrow"
    assert layout.part_of_filename(rel.rsplit("/", 1)[1]) == (3, 4)
    assert layout.version_of_dirname(layout.version_relpath("sales", 12).rsplit("/", 1)[1]) == 12
    for name in [".tmp-abc.arrow", "3_x.arrow", "3.arrow", "3_4.parquet", "٣_4.arrow"]:
        assert layout.part_of_filename(name) is None
    assert layout.version_of_dirname("v١") is None
    with pytest.raises(fp.InvalidName):
        layout.partition_relpath("../x", 1, (0, 0))


def test_node_marker_round_trips(tmp_path):
    assert layout.read_node_id(tmp_path) is None
    node_id = layout.write_node_marker(tmp_path)
    assert layout.read_node_id(tmp_path) == node_id and len(node_id) == 32
    (tmp_path / layout.NODE_MARKER).write_text("{broken")
    assert layout.read_node_id(tmp_path) is None
    final = tmp_path / layout.partition_relpath("s", 1, (0, 0))
    assert layout.temporary_path(final).name.startswith(layout.TMP_PREFIX)


def test_pages_stay_under_their_limit_and_say_when_more_follow():
    seen = []

    def weight(x: int) -> int:
        seen.append(x)
        return x

    first, more = next(wire.pages(iter([3, 3, 3, 9, 1]), weight, 7))
    assert (first, more) == ([3, 3], True) and seen == [3, 3, 3]  # only the item that did not fit was weighed beyond
    assert list(wire.pages([3, 3, 3, 9, 1], lambda x: x, 7)) == [([3, 3], True), ([3], True), ([9], True), ([1], False)]
    assert list(wire.pages([], lambda x: x, 7)) == [([], False)]  # always one page, possibly empty


def test_a_commit_names_its_base_and_an_order_its_deadline_and_bodies_without_them_still_decode():
    """Manifests sealed before ``base`` existed, and orders from clients that name no deadline, keep decoding."""
    based = dataclasses.replace(COMMIT, base=3)
    assert wire.Commit.decode(based.encode()).base == 3
    body = COMMIT.to_json()
    assert body["base"] is None
    del body["base"]
    assert wire.Commit.from_json(body).base is None
    order = wire.Assemble("sales", 3, 4, 1, (wire.AssemblePart((0, 0), (0, 10)),), deadline_ms=5000)
    assert wire.Assemble.decode(order.encode()).deadline_ms == 5000
    legacy = order.to_json()
    del legacy["deadline_ms"]
    assert wire.Assemble.from_json(legacy).deadline_ms is None
    for bad, cls, field in ((-1, wire.Commit, "commit.base"), ("3", wire.Commit, "commit.base"),
                            (True, wire.Assemble, "assemble.deadline_ms"),
                            (1.5, wire.Assemble, "assemble.deadline_ms")):
        key = "base" if cls is wire.Commit else "deadline_ms"
        with pytest.raises(fp.RequestRejected) as info:
            cls.from_json({**(based if cls is wire.Commit else order).to_json(), key: bad})
        assert info.value.field == field


def test_the_heartbeat_short_path_reads_the_clock_and_refuses_a_bad_one():
    beat = wire.Heartbeat("n1", 5, False, 1_790_000_000_123)
    assert wire.Heartbeat.decode_plain(json.dumps(beat.to_json()).encode()) == beat
    assert wire.Heartbeat.decode_plain(b'{"node_id": "n1"}') == wire.Heartbeat("n1")
    for clock in (-1, 1.5, "now", True):
        assert wire.Heartbeat.decode_plain(json.dumps({"node_id": "n1", "clock_ms": clock}).encode()) is None


def test_a_heartbeat_asks_for_the_catalogs_clock_and_its_reply_carries_it_only_then():
    beat = wire.Heartbeat("n1", 5, False, 1_790_000_000_123, asks_clock=True)
    assert wire.Heartbeat.decode_plain(json.dumps(beat.to_json()).encode()) == beat
    assert "asks_clock" not in wire.Heartbeat("n1", 5, False, 1).to_json()  # what catalogs of earlier releases read
    for asks in (1, "yes", [True]):
        assert wire.Heartbeat.decode_plain(json.dumps({"node_id": "n1", "asks_clock": asks}).encode()) is None
    told = wire.HeartbeatReply(True, 1_790_000_000_456)
    assert wire.HeartbeatReply.decode(told.encode()) == told
    assert wire.HeartbeatReply(True).encode() == b'{"known":true}'  # what nodes of earlier releases read
    assert dataclasses.replace(told, clock_ms=None) == wire.HeartbeatReply(True)


def test_a_token_is_accepted_within_the_margin_after_its_expiry_and_not_beyond():
    secret = b"s" * 32
    token = tokens.capability(secret, "sales", 3, 1000)
    assert tokens.verify_token(secret, token, 999.0) is not None
    assert tokens.verify_token(secret, token, 1001.0) is None
    assert tokens.verify_token(secret, token, 1029.0, margin=30.0) is not None
    assert tokens.verify_token(secret, token, 1031.0, margin=30.0) is None
    assert tokens.verify_token(secret, tokens.role_token(secret, "reader", "ann"), 1e12, margin=30.0) is not None


# --------------------------------------------------------------------------- credentials and signed manifests


def test_a_sealed_manifest_carries_the_catalogs_signature_through_its_file_and_a_changed_one_fails():
    from flightpart.tokens import manifest_signature, manifest_signed, verify_key

    secret = b"cluster-secret"
    signed = dataclasses.replace(COMMIT, signature=manifest_signature(secret, COMMIT.to_json()))
    again = wire.Commit.decode(signed.encode(), "manifest")
    assert again == signed and manifest_signed(verify_key(secret), again.to_json(), again.signature)
    assert wire.Commit.decode(COMMIT.encode(), "manifest").signature is None  # a writer's commit has none
    moved = dataclasses.replace(again, partitions=(*again.partitions[:1],
                                                   dataclasses.replace(again.partitions[1], nodes=("evil",))))
    assert not manifest_signed(secret, moved.to_json(), moved.signature)
    assert not manifest_signed(secret, again.to_json(), manifest_signature(b"another secret", COMMIT.to_json()))
    assert not manifest_signed(secret, again.to_json(), None) and not manifest_signed(secret, again.to_json(), "!junk")


def test_tokens_verify_with_the_public_key_alone_and_it_mints_none():
    import time

    from flightpart.tokens import VerifyKey, verify_key

    secret, now = b"cluster-secret", time.time()
    public = VerifyKey.parse(verify_key(secret).text())
    token = tokens.role_token(secret, "node", "n1")
    credential = tokens.verify_token(public, token, now)
    assert len(token) < 200 and credential is not None and (credential.role, credential.name) == ("node", "n1")
    cap = tokens.capability(secret, "sales", 4, int(now) + 60)
    assert tokens.verify_token(public, cap, now).scope == ("sales", 4)
    assert tokens.verify_token(public, cap, now + 120) is None                   # expired
    # the secret is the owner only where held
    assert tokens.verify_token(public, secret.decode(), now) is None
    assert tokens.verify_token(secret, secret.decode(), now).role == "owner"
    assert tokens.verify_token(public, token.replace(":node:", ":admin:"), now) is None
    with pytest.raises(PermissionError):
        tokens.role_token(public, "admin", "x")
    with pytest.raises(ValueError):
        VerifyKey.parse("fpk1:short")


def test_a_ticket_is_a_message_whose_unused_fields_keep_plain_tickets_unchanged():
    assert issubclass(wire.Ticket, wire.Message)  # one field is one line in wire.py, parsed and written like any other
    plain = wire.Ticket("sales", 3, (1, 2))
    assert plain.encode() == b'{"dataset":"sales","version":3,"part":[1,2],"columns":null,"rows":null}'
    asked = dataclasses.replace(plain, compression="zstd")
    assert json.loads(asked.encode())["compression"] == "zstd" and wire.Ticket.decode(asked.encode()) == asked
    assert wire.Ticket.from_json(plain.to_json()) == plain


@pytest.mark.parametrize("dataset, version, part",
                         [("sales", 3, (0, 0)), ("a.b-c_9", 1 << 40, (12345, 7)), ("x", 0, (9, 0))])
def test_plain_tickets_are_the_tickets_byte_for_byte(dataset, version, part):
    assert wire.plain_tickets(dataset, version)(*part) == wire.Ticket(dataset, version, part).encode()


def test_endpoint_metadata_written_by_hand_is_the_json_it_says():
    parts = (wire.PartInfo((0, 0), (0, 0), (5, 2), (("grpc://h:1", "127.0.0.2", 7), ("grpc://g:2", "127.0.0.3", 8)), 80,
                           {"a": {"nulls": 1, "min": -1.5, "max": "z'q"}}),
             wire.PartInfo((1, 0), (5, 0), (6, 2), (("grpc://h:1", "127.0.0.2", 7),), 96))
    info = wire.encode_flight_info(wire.VersionInfo("d", 2, SCHEMA, (11, 2), (2, 1), parts))
    metas = [json.loads(e.app_metadata) for e in info.endpoints]
    assert metas[0] == {"position": [0, 0], "start": [0, 0], "shape": [5, 2],
                        "location": [["127.0.0.2", 7], ["127.0.0.3", 8]], "nbytes": 80,
                        "stats": {"a": {"nulls": 1, "min": -1.5, "max": "z'q"}}}
    assert metas[1] == {"position": [1, 0], "start": [5, 0], "shape": [6, 2], "location": [["127.0.0.2", 7]],
                        "nbytes": 96}
    assert [e.locations[0].uri.decode() for e in info.endpoints] == ["grpc://h:1", "grpc://h:1"]
    assert wire.decode_flight_info(info).parts == parts


@pytest.mark.parametrize("ticket, field", [
    (dict(rows=[0, 5]), "ticket.more"),
    (dict(filter=base64.b64encode(b"x").decode(), matched=[0, 5]), "ticket.more"),
    (dict(row_numbers=True), "ticket.more"),
    (dict(more=[[0, 0]]), "ticket.more"),  # the first partition named again
])
def test_a_ticket_for_several_partitions_takes_no_row_range_and_each_partition_once(ticket, field):
    body = {"dataset": "d", "version": 1, "part": [0, 0], "columns": None, "rows": None, "more": [[1, 0]], **ticket}
    with pytest.raises(fp.RequestRejected) as info:
        wire.Ticket.decode(json.dumps(body).encode())
    assert info.value.field == field


def test_a_ticket_names_at_most_so_many_partitions():
    body = {"dataset": "d", "version": 1, "part": [0, 0], "columns": None, "rows": None,
            "more": [[k, 0] for k in range(1, wire.MAX_PARTS_PER_STREAM + 2)]}
    with pytest.raises(fp.LimitExceeded):
        wire.Ticket.decode(json.dumps(body).encode())


def test_a_code_at_the_end_of_a_message_comes_back_as_sent():
    """SQL statuses carry no extra_info: the code and field ride at the end of the message and nowhere else."""
    exc = fp.DatasetNotFound("Table with name [x] does not exist! [flightpart here]", field="query")
    assert wire.code_in_message(wire.error_with_code(exc)) == ("DATASET_NOT_FOUND", "query", exc.message)
    spaced = fp.RequestRejected("bad", field="a field")  # a field that would not parse back is left out
    assert wire.code_in_message(wire.error_with_code(spaced)) == ("INVALID_REQUEST", None, "bad")
    assert wire.code_in_message("a message a user wrote [flightpart nope]") is None
    assert wire.code_in_message("Parser Error: syntax error") is None


@pytest.mark.parametrize("nested", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000])
def test_json_nested_thousands_deep_is_refused_not_a_recursion_error(nested):
    """Python's JSON parser raises RecursionError past its depth limit: a ticket or action body from the network
    nested that deep must be the sender's mistake, like any other JSON that is not a message."""
    from flightpart.errors import RequestRejected
    from flightpart.wire import Ticket, loads

    with pytest.raises(RequestRejected, match="nested too deeply"):
        loads(nested, "ticket")
    with pytest.raises(RequestRejected):
        Ticket.decode(nested, "ticket")
