"""The wire format, as pure functions both sides share.

Names, tickets, descriptors, metadata JSON and action bodies are encoded
and strictly decoded here, so the node, the catalog and the client can never
disagree, and nothing received is ever unpickled: every byte from the network
goes through ``json.loads`` and a shape check.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .errors import InvalidName

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
MAX_JSON_BYTES = 16 << 20
TICKET_KEYS = {"dataset", "version", "part", "columns", "rows"}


class WireError(ValueError):
    """A request that does not follow the wire format; its message says how."""


def check_name(name: Any) -> str:
    """``name`` if it is a valid dataset name, else :class:`InvalidName`."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or name in (".", ".."):
        shown = repr(name) if not isinstance(name, str) or len(name) <= 60 else repr(name[:60]) + "..."
        raise InvalidName(
            f"invalid dataset name {shown}: use 1 to 128 characters of letters, digits, '_', '.' and '-', "
            "starting with a letter or digit"
        )
    return name


def _uint(value: Any, field: str, limit: int = 1 << 62) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < limit:
        raise WireError(f"{field}: expected a non-negative integer, got {value!r:.60}")
    return value


def loads(raw: bytes, what: str) -> Any:
    """JSON from the network, size-capped, with a clear error."""
    if len(raw) > MAX_JSON_BYTES:
        raise WireError(f"{what}: {len(raw)} bytes is more than the {MAX_JSON_BYTES} allowed")
    try:
        return json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"{what}: not UTF-8 JSON ({exc})") from None


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Ticket:
    """What a ``do_get`` asks for: one partition, optionally projected and sliced."""

    dataset: str
    version: int
    part: tuple[int, int]
    columns: tuple[str, ...] | None = None
    rows: tuple[int, int] | None = None

    def encode(self) -> bytes:
        return dumps(
            {
                "dataset": self.dataset,
                "version": self.version,
                "part": list(self.part),
                "columns": list(self.columns) if self.columns is not None else None,
                "rows": list(self.rows) if self.rows is not None else None,
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> "Ticket":
        body = loads(raw, "ticket")
        if not isinstance(body, dict):
            raise WireError("ticket: expected a JSON object")
        missing = {"dataset", "version", "part"} - body.keys()
        if missing:
            raise WireError(f"ticket: missing {sorted(missing)}")
        extra = body.keys() - TICKET_KEYS
        if extra:
            raise WireError(f"ticket: unexpected keys {sorted(extra)}")
        part = body["part"]
        if not isinstance(part, list) or len(part) != 2:
            raise WireError(f"ticket.part: expected [i, j], got {part!r:.60}")
        columns = body.get("columns")
        if columns is not None:
            if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
                raise WireError("ticket.columns: expected null or a list of column names")
            columns = tuple(columns)
        rows = body.get("rows")
        if rows is not None:
            if not isinstance(rows, list) or len(rows) != 2:
                raise WireError(f"ticket.rows: expected null or [start, stop], got {rows!r:.60}")
            rows = (_uint(rows[0], "ticket.rows[0]"), _uint(rows[1], "ticket.rows[1]"))
            if rows[1] < rows[0]:
                raise WireError(f"ticket.rows: stop {rows[1]} is before start {rows[0]}")
        try:
            name = check_name(body["dataset"])
        except InvalidName as exc:
            raise WireError(f"ticket.dataset: {exc}") from None
        return cls(
            name,
            _uint(body["version"], "ticket.version"),
            (_uint(part[0], "ticket.part[0]", 1 << 31), _uint(part[1], "ticket.part[1]", 1 << 31)),
            columns,
            rows,
        )


def partition_path(name: str, version: int, part: tuple[int, int]) -> list[str]:
    """Descriptor path of one partition for a node's ``do_put``."""
    return [name, str(version), str(part[0]), str(part[1])]


def parse_partition_path(path: list[bytes | str]) -> tuple[str, int, tuple[int, int]]:
    """Inverse of :func:`partition_path`, strict."""
    if len(path) != 4:
        raise WireError(f"descriptor: expected path [name, version, i, j], got {len(path)} elements")
    parts = [p.decode("utf-8", "replace") if isinstance(p, bytes) else str(p) for p in path]
    try:
        name = check_name(parts[0])
    except InvalidName as exc:
        raise WireError(f"descriptor: {exc}") from None
    numbers = []
    for field, text in zip(("version", "i", "j"), parts[1:]):
        if not text.isdigit() or len(text) > 12:
            raise WireError(f"descriptor.{field}: expected a non-negative integer, got {text[:40]!r}")
        numbers.append(int(text))
    return name, numbers[0], (numbers[1], numbers[2])


def partition_relpath(name: str, version: int, part: tuple[int, int]) -> str:
    """Where a node keeps a partition, relative to its data directory.

    Shared by the store (which writes it) and the client (which memory-maps
    it when the node is on its own host).
    """
    check_name(name)
    return f"datasets/{name}/v{int(version)}/{int(part[0])}_{int(part[1])}.arrow"


NODE_MARKER = "flightpart-node.json"


def action_body(raw: bytes, what: str, required: dict[str, type | tuple[type, ...]], optional: dict[str, type | tuple[type, ...]] | None = None) -> dict:
    """A JSON action body checked for exactly the keys and types expected."""
    body = loads(raw, what) if raw else {}
    if not isinstance(body, dict):
        raise WireError(f"{what}: expected a JSON object")
    optional = optional or {}
    for key, kind in required.items():
        if key not in body:
            raise WireError(f"{what}: missing {key!r}")
    for key, value in body.items():
        kind = required.get(key, optional.get(key))
        if kind is None:
            raise WireError(f"{what}: unexpected key {key!r:.60}")
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))):
            raise WireError(f"{what}.{key}: wrong type {type(value).__name__}")
    return body


def schema_to_text(schema: pa.Schema) -> str:
    """An Arrow schema for a JSON body: base64 of its IPC serialization."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_text(text: str, what: str) -> pa.Schema:
    """Inverse of :func:`schema_to_text`; Arrow IPC, never pickle."""
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))
    except Exception:
        raise WireError(f"{what}: not a base64 Arrow IPC schema") from None
