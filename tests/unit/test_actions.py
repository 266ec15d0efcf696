"""One word per action: each daemon's action table is built from the request messages, and nothing else spells
an action's name (no literal at a call site, no hand-built reply)."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from flightpart import wire
from flightpart.server.base import Action, action_table
from flightpart.server.catalog import CatalogServer
from flightpart.server.node import NodeServer
from flightpart.sql import SqlCatalogServer

ROOT = Path(__file__).resolve().parents[2]
DAEMONS = [NodeServer, CatalogServer, SqlCatalogServer]


def request_classes() -> set[type[wire.Message]]:
    def below(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in (sub, *below(sub))]

    return {c for c in below(wire.Message) if c.ACTION}


@pytest.mark.parametrize("daemon", DAEMONS, ids=lambda d: d.__name__)
def test_each_table_entry_is_named_by_its_request_and_typed_by_it(daemon):
    for name, entry in daemon.actions.items():
        assert name == entry.request.ACTION
        hints = typing.get_type_hints(entry.handler)
        body = [v for k, v in hints.items() if k != "return"]
        assert body == [entry.request], f"{daemon.__name__}.{entry.handler.__name__} takes {body}"
        assert hints["return"] is entry.request.REPLY, (f"{daemon.__name__}.{entry.handler.__name__} answers "
                                                        f"{hints['return']}")


def test_every_request_message_is_served_by_a_daemon():
    served = {entry.request for daemon in DAEMONS for entry in daemon.actions.values()}
    assert {c.__name__ for c in request_classes() - served} == set()


def test_a_table_refuses_two_handlers_for_one_word_and_a_message_that_is_no_request():
    def handler(self, body):  # pragma: no cover - never called
        return wire.Removed(0)

    with pytest.raises(TypeError, match="two handlers"):
        action_table(Action(wire.Scrub, handler, ""), Action(wire.ScrubCluster, handler, ""))
    with pytest.raises(TypeError, match="names no action"):
        action_table(Action(wire.Removed, handler, ""))


def sources() -> list[Path]:
    return sorted(p for folder in ("flightpart", "client", "server") for p in (ROOT / folder).rglob("*.py"))


def test_no_call_site_spells_an_action_name():
    """Actions are sent as messages (``pool.action(uri, Message)``, ``client.call(Message)``): a string there, or a
    hand-made ``flight.Action`` outside the connection pool, would be a second spelling of the word."""
    found = []
    for path in sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            strings = [a for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if node.func.attr in ("action", "call") and strings:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if node.func.attr == "Action" and path.name != "connections.py":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} (flight.Action)")
    assert found == []


def test_no_handler_builds_its_reply_by_hand():
    """Handlers return reply messages (the base encodes them): none returns a dict or list literal."""
    found = []
    for path in (*sorted((ROOT / "server" / "node").glob("*.py")), *sorted((ROOT / "server" / "catalog").glob("*.py"))):
        tree = ast.parse(path.read_text(), str(path))
        handlers = {entry.handler.__name__ for daemon in DAEMONS for entry in daemon.actions.values()}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in handlers:
                for ret in ast.walk(node):
                    if isinstance(ret, ast.Return) and isinstance(ret.value, (ast.Dict, ast.List, ast.ListComp)):
                        found.append(f"{path.name}:{ret.lineno}")
    assert found == []
