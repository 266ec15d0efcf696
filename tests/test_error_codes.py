"""Each malformed request to each server comes back with a stable code; the client raises the class of that code.

No message a client receives carries a traceback or a path on the server.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart import wire
from flightpart.io.errors import translate

from helpers import code_of, put_raw, raw_action

SCHEMA_TEXT = wire.schema_to_text(pa.schema([("a", pa.int64())]))


@pytest.fixture(scope="module")
def one_node(make_cluster):
    with make_cluster(1, process=True, node_args=["--max-partition-bytes", "100000"]) as c:
        with fp.connect(c.uri) as client:
            client.put("good", pa.table({"a": np.arange(100)}), tiling=(1, 1))
        yield c


def ticket(**fields) -> flight.Ticket:
    return flight.Ticket(json.dumps({"dataset": "good", "version": 1, "part": [0, 0], **fields}).encode())


def action(name: str, body) -> flight.Action:
    return flight.Action(name, body if isinstance(body, bytes) else json.dumps(body).encode())


def commit_body(**changes):
    body = {"dataset": "good", "version": 1, "schema": SCHEMA_TEXT, "shape": [100, 1], "tiling": [1, 1],
            "partitions": [{"part": [0, 0], "start": [0, 0], "shape": [100, 1], "nodes": ["nobody"]}]}
    return {**body, **changes}


NODE_CASES = [
    ("ticket not JSON", lambda n, c: n.do_get(flight.Ticket(b"\x80")).read_all(), fp.RequestRejected),
    ("ticket unknown key", lambda n, c: n.do_get(ticket(evil=1)).read_all(), fp.RequestRejected),
    ("ticket bad name", lambda n, c: n.do_get(ticket(dataset="../x")).read_all(), fp.InvalidName),
    ("ticket too large", lambda n, c: n.do_get(flight.Ticket(b" " * (2 << 20))).read_all(), fp.LimitExceeded),
    ("ticket duplicate columns", lambda n, c: n.do_get(ticket(columns=["a", "a"])).read_all(), fp.RequestRejected),
    ("ticket unknown column", lambda n, c: n.do_get(ticket(columns=["zz"])).read_all(), fp.RequestRejected),
    ("partition missing", lambda n, c: n.do_get(ticket(part=[5, 0])).read_all(), fp.PartitionMissing),
    ("put bad name", lambda n, c: put_raw(n, ["a b", "1", "0", "0"], pa.table({"a": [1]})), fp.InvalidName),
    ("put unicode version", lambda n, c: put_raw(n, ["x", "١", "0", "0"], pa.table({"a": [1]})), fp.RequestRejected),
    ("put short path", lambda n, c: put_raw(n, ["x", "1"], pa.table({"a": [1]})), fp.RequestRejected),
    ("put over the limit", lambda n, c: put_raw(n, ["big", "1", "0", "0"], pa.table({"a": np.arange(100_000)})),
     fp.LimitExceeded),
    ("put other schema", lambda n, c: put_raw(n, ["good", "1", "1", "0"], pa.table({"a": ["text"]})),
     fp.SchemaMismatch),
    ("unknown action", lambda n, c: list(n.do_action(action("nope", {}))), fp.RequestRejected),
    ("held wrong type", lambda n, c: list(n.do_action(action("held", {"dataset": "good", "version": "1"}))),
     fp.RequestRejected),
    ("drop not JSON", lambda n, c: list(n.do_action(action("drop", b"{"))), fp.RequestRejected),
    ("copy-to a stranger",
     lambda n, c: list(n.do_action(action("copy-to", {"dataset": "good", "version": 1, "part": [0, 0],
                                                      "target": "grpc://127.0.0.1:1"}))),
     fp.RequestRejected),
    ("stats with a body", lambda n, c: list(n.do_action(action("stats", {"x": 1}))), fp.RequestRejected),
    ("body over 16 MiB", lambda n, c: list(n.do_action(action("held", b" " * (17 << 20)))), fp.LimitExceeded),
]

CATALOG_CASES = [
    ("unknown dataset", lambda n, c: c.get_flight_info(flight.FlightDescriptor.for_path("nope")), fp.DatasetNotFound),
    ("unknown version", lambda n, c: c.get_flight_info(flight.FlightDescriptor.for_path("good", "99")),
     fp.DatasetNotFound),
    ("bad name", lambda n, c: c.get_flight_info(flight.FlightDescriptor.for_path("../../etc")), fp.InvalidName),
    ("command descriptor", lambda n, c: c.get_flight_info(flight.FlightDescriptor.for_command(b"good")),
     fp.RequestRejected),
    ("unicode version", lambda n, c: c.get_flight_info(flight.FlightDescriptor.for_path("good", "𝟏")),
     fp.RequestRejected),
    ("commit schema not base64", lambda n, c: list(c.do_action(action("commit", commit_body(schema="%%%")))),
     fp.RequestRejected),
    ("commit unknown node", lambda n, c: list(c.do_action(action("commit", commit_body(version=2)))),
     fp.RequestRejected),
    ("commit twice", lambda n, c: commit_again(c), fp.VersionConflict),
    ("commit wrong rows", lambda n, c: commit_wrong_rows(c), fp.SchemaMismatch),
    ("commit bad tiling", lambda n, c: list(c.do_action(action("commit", commit_body(tiling=[2, 1])))),
     fp.RequestRejected),
    ("register wrong types", lambda n, c: list(c.do_action(action("register-node", {"node_id": 1}))),
     fp.RequestRejected),
    ("drop unknown", lambda n, c: list(c.do_action(action("drop", {"dataset": "nope"}))), fp.DatasetNotFound),
    ("begin bad name", lambda n, c: list(c.do_action(action("begin", {"dataset": ""}))), fp.InvalidName),
    ("publish rank out of range", lambda n, c: list(c.do_action(action("publish-begin",
                                                                       {"dataset": "p", "nranks": 2, "rank": 2}))),
     fp.RequestRejected),
    ("unknown action", lambda n, c: list(c.do_action(action("nodez", {}))), fp.RequestRejected),
]


def node_id(c) -> str:
    return json.loads(list(c.do_action(action("nodes", b"")))[0].body.to_pybytes())["nodes"][0]["node_id"]


def commit_again(c) -> None:
    """The same commit sent again is answered committed (a writer's retry after a lost answer); another manifest
    for the committed version is a VERSION_CONFLICT."""
    node = node_id(c)
    same = commit_body(partitions=[{"part": [0, 0], "start": [0, 0], "shape": [100, 1], "nodes": [node]}])
    assert (json.loads(list(c.do_action(action("commit", same)))[0].body.to_pybytes())
            == {"dataset": "good", "version": 1})
    other = commit_body(partitions=[{"part": [0, 0], "start": [0, 0], "shape": [100, 1], "nodes": [node, node]}])
    list(c.do_action(action("commit", other)))


def commit_wrong_rows(c) -> None:
    version = json.loads(list(c.do_action(action("begin", {"dataset": "good"})))[0].body.to_pybytes())["version"]
    body = commit_body(version=version, shape=[50, 1],
                       partitions=[{"part": [0, 0], "start": [0, 0], "shape": [50, 1], "nodes": [node_id(c)]}])
    list(c.do_action(action("commit", body)))


def leaks(message: str, cluster) -> list[str]:
    """Server-side paths or tracebacks in a message a client received."""
    return [word for word in ("Traceback", "site-packages", ".py\"", str(cluster.root)) if word in message]


@pytest.mark.parametrize("case", NODE_CASES + CATALOG_CASES, ids=[c[0] for c in NODE_CASES + CATALOG_CASES])
def test_a_malformed_request_gets_its_code(one_node, case):
    name, call, expected = case
    node, catalog = flight.connect(one_node.nodes[0].uri), flight.connect(one_node.uri)
    with pytest.raises(flight.FlightError) as info:
        call(node, catalog)
    assert code_of(info.value) == expected.code, name
    assert type(translate(info.value)) is expected
    assert leaks(str(info.value), one_node) == []


def test_an_unexpected_failure_is_internal_and_shows_no_path(one_node):
    """A node whose disk breaks under it: the client learns INTERNAL, the log has the details."""
    datasets = one_node.root / f"node-{one_node.ips[0]}" / "datasets"
    blocker = datasets / "broken"
    blocker.write_text("a file where a directory must be")  # the next put into 'broken' cannot make its folder
    node = flight.connect(one_node.nodes[0].uri)
    with pytest.raises(flight.FlightError) as info:
        put_raw(node, ["broken", "1", "0", "0"], pa.table({"a": [1, 2]}))
    assert code_of(info.value) == "INTERNAL"
    assert isinstance(translate(info.value), fp.ServerError)
    assert leaks(str(info.value), one_node) == [] and "a file where" not in str(info.value)
    assert str(blocker) in one_node.nodes[0].log()  # the operator sees what happened
    blocker.unlink()
    with fp.connect(one_node.uri) as client:
        assert client.open("good").to_arrow().num_rows == 100  # and the node keeps serving


def test_the_client_raises_the_class_of_the_code(one_node):
    with fp.connect(one_node.uri) as client:
        with pytest.raises(fp.DatasetNotFound):
            client.open("nope")
        with pytest.raises(fp.InvalidName):
            client.open("a b")
        with pytest.raises(fp.RequestRejected, match="base64") as info:
            raw_action(client, "commit", commit_body(schema="%%%"))
        assert not isinstance(info.value, fp.SchemaMismatch) and info.value.field == "commit.schema"
        with pytest.raises(fp.VersionConflict):
            commit_via(client)
        assert client.open("good").to_arrow().num_rows == 100


def commit_via(client) -> None:
    """A different manifest for the committed version (the same one again is a retry, answered committed)."""
    node = client.nodes()[0].node_id
    raw_action(client, "commit", commit_body(partitions=[{"part": [0, 0], "start": [0, 0], "shape": [100, 1],
                                                          "nodes": [node, node]}]))


def test_every_exception_is_exported_and_in_one_hierarchy():
    for cls in fp.errors.BY_CODE.values():
        assert issubclass(cls, fp.FlightpartError)
        assert getattr(fp, cls.__name__) is cls and cls.__name__ in fp.__all__
    assert issubclass(fp.RequestRejected, ValueError) and issubclass(fp.NodeUnavailable, ConnectionError)
    assert issubclass(fp.ServerBusy, fp.NodeUnavailable) and fp.ServerBusy.retryable
