"""The wire format: every message both sides speak, each with its two halves side by side.

Names, tickets, descriptor paths, errors, FlightInfo, endpoint metadata and every action body are encoded and
strictly decoded here, so node, catalog and client cannot disagree, and nothing received is unpickled: every
byte from the network goes through ``json.loads`` (or Arrow IPC for schemas) and a shape check.

A new action starts here: a request :class:`Message` with its fields' parsers, its ``ACTION`` and its ``REPLY``,
a round-trip test in ``tests/unit/test_wire.py``, then a handler in the daemon's ``action_table``
(docs/architecture.md).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from .errors import FlightpartError, InvalidName, LimitExceeded, RequestRejected
from .query.functions import AGGREGATES

MAX_NAME_CHARACTERS = 128
NAME_PATTERN = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_NAME_CHARACTERS - 1}}}")
MAX_JSON_BYTES = 16 << 20
MAX_UINT = 1 << 62
Replica = tuple[str, str, int]  # (node URI, node IP, node PID)
T = TypeVar("T")

# --------------------------------------------------------------------------- scalars


def check_name(name: Any, field_name: str | None = None) -> str:
    """``name`` if it is a valid dataset name, else :class:`InvalidName`."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or not name.isascii() or name in (".", ".."):
        shown = repr(name) if not isinstance(name, str) or len(name) <= 60 else repr(name[:60]) + "..."
        prefix = f"{field_name}: " if field_name else ""
        raise InvalidName(
            f"{prefix}invalid dataset name {shown}: use 1 to 128 characters of letters, digits, '_', '.' and '-', "
            "starting with a letter or digit",
            field=field_name,
        )
    return name


def pages(items: Iterable[T], weight: Callable[[T], int], limit: int) -> Iterator[tuple[list[T], bool]]:
    """``items`` cut lazily into pages of about ``limit`` by ``weight`` (at least one item each), as ``(page, more)``.
    Every reply or body a cluster can grow is sent so, so none reaches :data:`MAX_JSON_BYTES`."""
    page: list[T] = []
    total = 0
    for item in items:
        w = weight(item)
        if page and total + w > limit:
            yield page, True
            page, total = [], 0
        page.append(item)
        total += w
    yield page, False


def loads(raw: bytes, what: str) -> Any:
    """JSON from the network, size-capped, with a clear error."""
    if len(raw) > MAX_JSON_BYTES:
        raise LimitExceeded(f"{what}: {len(raw)} bytes is more than the {MAX_JSON_BYTES} allowed", field=what)
    try:
        return json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RequestRejected(f"{what}: not UTF-8 JSON ({exc})", field=what) from None
    except RecursionError:  # arrays or objects nested thousands deep: no message of ours is
        raise RequestRejected(f"{what}: JSON nested too deeply", field=what) from None


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


VERSION_LIMIT = 1 << 40
"""The largest version number a dataset can reach. A catalog hands out none past it, a node stores none past it, and
a node's registration naming one past it has those entries left out. Well short of what the wire can carry (18
digits): a planted number near the wire's end would otherwise leave a name's counter nowhere to go."""


def digits(text: str, what: str, max_len: int = 18) -> int:
    """A non-negative integer written in ASCII digits only (no sign, no Unicode digits)."""
    if not (text.isascii() and text.isdigit()) or len(text) > max_len:
        raise RequestRejected(f"{what}: expected a non-negative integer, got {text[:40]!r}", field=what)
    return int(text)


def schema_to_text(schema: pa.Schema) -> str:
    """An Arrow schema for a JSON body: base64 of its IPC serialization."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_text(text: Any, what: str) -> pa.Schema:
    """Inverse of :func:`schema_to_text`; Arrow IPC, never pickle."""
    if not isinstance(text, str):
        raise RequestRejected(f"{what}: expected a base64 Arrow IPC schema, got {type(text).__name__}", field=what)
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))
    except Exception:
        raise RequestRejected(f"{what}: not a base64 Arrow IPC schema", field=what) from None


# --------------------------------------------------------------------------- parsers
# A parser takes a decoded JSON value and the field's path, and returns the
# value in its Python form or raises RequestRejected naming the field.

Parser = Callable[[Any, str], Any]


def p_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RequestRejected(f"{where}: expected a string, got {type(value).__name__}", field=where)
    if len(value) > 4096:
        raise LimitExceeded(f"{where}: {len(value)} characters is more than the 4096 allowed", field=where)
    return value


def p_name(value: Any, where: str) -> str:
    return check_name(value, where)


def p_uint(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_UINT:
        raise RequestRejected(f"{where}: expected a non-negative integer, got {value!r:.60}", field=where)
    return value


def p_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise RequestRejected(f"{where}: expected true or false, got {value!r:.60}", field=where)
    return value


def p_number(value: Any, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or abs(value) == float("inf"):
        raise RequestRejected(f"{where}: expected a finite number, got {value!r:.60}", field=where)
    return value


def p_pair(value: Any, where: str) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise RequestRejected(f"{where}: expected [a, b] of non-negative integers, got {value!r:.60}", field=where)
    return (p_uint(value[0], f"{where}[0]"), p_uint(value[1], f"{where}[1]"))


def p_schema(value: Any, where: str) -> pa.Schema:
    return schema_from_text(value, where)


def p_stats(value: Any, where: str) -> dict[str, dict[str, Any]]:
    """Column statistics: ``{column: {"nulls": n, "min": v, "max": v}}`` with JSON scalars, short text."""
    if not isinstance(value, dict) or len(value) > 100_000:
        raise RequestRejected(f"{where}: expected an object of column statistics", field=where)
    out = {}
    for column, entry in value.items():
        if not isinstance(entry, dict) or set(entry) - {"nulls", "min", "max"} or ("min" in entry) != ("max" in entry):
            raise RequestRejected(f"{where}.{column:.60}: expected {{nulls, min, max}}", field=where)
        clean: dict[str, Any] = {"nulls": p_uint(entry.get("nulls", 0), f"{where}.{column:.60}.nulls")}
        for key in ("min", "max"):
            if key in entry:
                v = entry[key]
                if not isinstance(v, (int, float, str, bool)) or (isinstance(v, str) and len(v) > 4096):
                    raise RequestRejected(f"{where}.{column:.60}.{key}: expected a number, a boolean or short text",
                                          field=where)
                clean[key] = v
        out[p_str(column, where)] = clean
    return out


def p_optional(parse: Parser) -> Parser:
    def parse_optional(value: Any, where: str) -> Any:
        return None if value is None else parse(value, where)

    return parse_optional


def p_list(parse: Parser, max_items: int = 10_000_000) -> Parser:
    def parse_list(value: Any, where: str) -> tuple:
        if not isinstance(value, list):
            raise RequestRejected(f"{where}: expected a list, got {type(value).__name__}", field=where)
        if len(value) > max_items:
            raise LimitExceeded(f"{where}: {len(value)} items is more than the {max_items} allowed", field=where)
        return tuple(parse(item, f"{where}[{k}]") for k, item in enumerate(value))

    return parse_list


def p_message(cls: type["Message"]) -> Parser:
    def parse_message(value: Any, where: str) -> "Message":
        return cls.from_json(value, where)

    return parse_message


def _field(parse: Parser, default: Any = MISSING, encode: Callable[[Any], Any] | None = None, *,
           omitted_when_none: bool = False) -> Any:
    """A message field: how to parse it from JSON and, when not the generic way, how to write it.
    ``omitted_when_none``: the key is left out while None, so messages not using a new field keep their bytes."""
    return field(default=default, metadata={"parse": parse, "encode": encode or _to_json, "omitted": omitted_when_none})


def _to_json(value: Any) -> Any:
    if isinstance(value, Message):
        return value.to_json()
    if isinstance(value, pa.Schema):
        return schema_to_text(value)
    if isinstance(value, (tuple, list)):
        return [_to_json(v) for v in value]
    return value


M = TypeVar("M", bound="Message")


@dataclass(frozen=True)
class Message:
    """A JSON object with exactly the fields of the subclass, each checked by its parser.

    A request names its Flight action (``ACTION``, the one place it is spelled) and its reply message (``REPLY``):
    the server's action table and the client's
    :meth:`~flightpart.io.connections.ConnectionPool.action` are built from them, so no call site names an action.
    """

    ACTION: ClassVar[str] = ""
    REPLY: ClassVar[type[Message] | None] = None

    @classmethod
    def _fields(cls) -> dict[str, Any]:
        """The dataclass fields by name, looked up once per class."""
        known = cls.__dict__.get("_known_fields")
        if known is None:
            known = {f.name: f for f in fields(cls)}
            cls._known_fields = known  # type: ignore[attr-defined]
        return known

    def to_json(self) -> dict:
        out = {}
        for name, f in self._fields().items():
            value = getattr(self, name)
            if value is not None or not f.metadata["omitted"]:
                out[name] = f.metadata["encode"](value)
        return out

    def encode(self) -> bytes:
        return dumps(self.to_json())

    @classmethod
    def what(cls) -> str:
        return cls.ACTION or re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()

    @classmethod
    def from_json(cls: type[M], body: Any, where: str | None = None) -> M:
        where = where or cls.what()
        if not isinstance(body, dict):
            raise RequestRejected(f"{where}: expected a JSON object", field=where)
        known = cls._fields()
        for key in body:
            if key not in known:
                raise RequestRejected(f"{where}: unexpected key {key!r:.60}", field=where)
        values = {}
        for name, f in known.items():
            if name not in body:
                if f.default is MISSING:
                    raise RequestRejected(f"{where}: missing {name!r}", field=f"{where}.{name}")
                continue
            values[name] = f.metadata["parse"](body[name], f"{where}.{name}")
        return cls(**values)

    @classmethod
    def decode(cls: type[M], raw: bytes, what: str | None = None) -> M:
        """The message from an action body (``what`` names it in errors; default: the class's action)."""
        where = what or cls.what()
        return cls.from_json(loads(raw, where) if raw else {}, where)


# --------------------------------------------------------------------------- errors


def encode_error(exc: FlightpartError) -> bytes:
    """The machine-readable half of an error a server sends (Flight's ``extra_info``)."""
    return dumps({"code": exc.code, "field": exc.field})


def decode_error(extra_info: bytes | None) -> tuple[str, str | None] | None:
    """(code, field) of a flightpart error, or None when the server sent none."""
    if not extra_info:
        return None
    try:
        body = json.loads(bytes(extra_info).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        return None
    fld = body.get("field")
    return body["code"], fld if isinstance(fld, str) else None


CODE_IN_MESSAGE = re.compile(r" \[flightpart ([A-Z_]+)(?: at ([^\]\s]+))?\]$")
"""How an error sent with a SQL status carries its code and field: at the end of its one-line message."""


def error_with_code(exc: FlightpartError) -> str:
    """``exc``'s message with its code (and field) appended, for a status without ``extra_info`` (SQL clients'
    INVALID_ARGUMENT and NOT_FOUND)."""
    at = f" at {exc.field}" if exc.field and not any(c.isspace() or c == "]" for c in exc.field) else ""
    return f"{exc.message} [flightpart {exc.code}{at}]"


def code_in_message(message: str) -> tuple[str, str | None, str] | None:
    """(code, field, message without them) of a message made by :func:`error_with_code`; None for any other."""
    found = CODE_IN_MESSAGE.search(message)
    if found is None:
        return None
    return found.group(1), found.group(2), message[:found.start()]


def error_message(exc: BaseException) -> str:
    """A Flight error's message without gRPC's ``Detail:`` suffix."""
    return str(exc).split(". Detail:")[0].split("\nDetail:")[0].strip()


# --------------------------------------------------------------------------- ticket


def _p_function(value: Any, where: str) -> tuple[str, str]:
    """A ``[column, function]`` pair, the function one of the aggregates the nodes compute
    (:data:`flightpart.query.functions.AGGREGATES`)."""
    if not isinstance(value, list) or len(value) != 2:
        raise RequestRejected(f"{where}: expected [column, function], got {value!r:.60}", field=where)
    column, function = p_str(value[0], f"{where}[0]"), p_str(value[1], f"{where}[1]")
    if function not in AGGREGATES:
        raise RequestRejected(f"{where}[1]: unknown aggregate {function!r:.40}; known: {', '.join(AGGREGATES)}",
                              field=where)
    return (column, function)


def _p_computed(value: Any, where: str) -> tuple[str, str]:
    if not isinstance(value, list) or len(value) != 2:
        raise RequestRejected(f"{where}: expected [name, SQL expression], got {value!r:.60}", field=where)
    return (p_str(value[0], f"{where}[0]"), p_str(value[1], f"{where}[1]"))


@dataclass(frozen=True)
class Aggregate(Message):
    """What a ticket asks a node to aggregate instead of sending rows: ``[column, function]`` pairs, grouped by ``by``.
    ``computed``: ``[name, SQL expression]`` pairs the node evaluates first
    (:func:`flightpart.query.predicates.parse_sql_value`); text parsed as the reader parsed it, never code."""

    functions: tuple[tuple[str, str], ...] = _field(p_list(_p_function, 1000))
    by: tuple[str, ...] = _field(p_list(p_str, 100), ())
    computed: tuple[tuple[str, str], ...] | None = _field(p_optional(p_list(_p_computed, 32)), None,
                                                          omitted_when_none=True)


@dataclass(frozen=True)
class SortKey(Message):
    """One key of a :class:`TopRows`: a column, its direction, and where its nulls go."""

    column: str = _field(p_str)
    descending: bool = _field(p_bool, False)
    nulls_first: bool = _field(p_bool, False)


@dataclass(frozen=True)
class TopRows(Message):
    """What a ticket asks a node to send instead of every row: its first ``limit`` rows by ``keys`` (and rows whose
    float key is NaN), for ``ORDER BY ... LIMIT`` (:mod:`flightpart.query.top`)."""

    keys: tuple[SortKey, ...] = _field(p_list(p_message(SortKey), 32))
    limit: int = _field(p_uint)


WIRE_CODECS = ("zstd", "lz4")
"""Codecs a reader may accept on the wire: Arrow IPC body compression, which any Arrow reader decompresses."""


def p_codec(value: Any, where: str) -> str:
    if value not in WIRE_CODECS:
        raise RequestRejected(f"{where}: expected one of {', '.join(WIRE_CODECS)}, got {value!r:.40}", field=where)
    return value


def p_base64(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise RequestRejected(f"{where}: expected base64 text, got {type(value).__name__}", field=where)
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise RequestRejected(f"{where}: not base64", field=where) from None


def _base64_text(value: bytes) -> str:
    return base64.b64encode(value).decode()


MAX_PARTS_PER_STREAM = 4096
"""Partitions one read stream may carry (a ticket's ``more``), as a put stream may."""
ROW_NUMBER = "__flightpart_row__"
"""The column a ticket with ``row_numbers`` adds: each row's position in its partition (int64)."""


KNOWN_TICKETS = 4096
"""Tickets a process keeps decoded (:meth:`Ticket.decode`): a reader asks for the same partition again and again,
and checking a ticket's fields was a sixth of a small read's time on the node. Only tickets that passed every check
are kept; tickets are frozen, so a kept one cannot change."""
KNOWN_TICKET_BYTES = 4096
"""Longer tickets (a filter, a long projection) are decoded each time."""
_decoded_tickets: dict[bytes, "Ticket"] = {}


@dataclass(frozen=True)
class Ticket(Message):
    """What a ``do_get`` asks for: one partition, optionally projected, sliced, filtered or aggregated.

    The node applies, in order: ``rows`` (a row range), ``row_numbers`` (positions as a last column), ``filter``
    (Substrait, :mod:`flightpart.query.filters`), ``matched`` (a range of the rows kept), ``columns``, then
    ``aggregate``. Fields after ``rows`` are left out when unused, so plain tickets stay as plain Flight clients
    know them.
    """

    dataset: str = _field(p_name)
    version: int = _field(p_uint)
    part: tuple[int, int] = _field(p_pair)
    columns: tuple[str, ...] | None = _field(p_optional(p_list(p_str, 100_000)), None)
    rows: tuple[int, int] | None = _field(p_optional(p_pair), None)
    filter: bytes | None = _field(p_optional(p_base64), None, _base64_text, omitted_when_none=True)
    matched: tuple[int, int] | None = _field(p_optional(p_pair), None, omitted_when_none=True)
    aggregate: Aggregate | None = _field(p_optional(p_message(Aggregate)), None, omitted_when_none=True)
    compression: str | None = _field(p_optional(p_codec), None, omitted_when_none=True)  # a codec the reader accepts
    row_numbers: bool | None = _field(p_optional(p_bool), None, omitted_when_none=True)
    """With a filter: each row sent carries its position in the partition (column ``ROW_NUMBER``), so a reader
    that indexes rows by position (Dask's global index) keeps it for the rows the filter kept."""
    top: TopRows | None = _field(p_optional(p_message(TopRows)), None, omitted_when_none=True)
    """Only the partition's first rows by sort keys (after the filter), for ``ORDER BY ... LIMIT``."""
    more: tuple[tuple[int, int], ...] | None = _field(p_optional(p_list(p_pair, MAX_PARTS_PER_STREAM)), None,
                                                     omitted_when_none=True)
    """Further partitions of the same version (and column group) sent after ``part`` in the same stream, each
    projected, filtered, aggregated or topped as the ticket asks (never a row range), in runs, each batch's metadata
    a :class:`PartRun` naming its partitions: small partitions and small answers cost bytes, not a round trip each
    (the read-side twin of a put of several partitions)."""

    MAX_BYTES: ClassVar[int] = 1 << 20

    def encode(self) -> bytes:
        """The ticket's bytes, written once per ticket (it is frozen, so they cannot go stale)."""
        encoded = self.__dict__.get("_encoded")
        if encoded is None:
            encoded = super().encode()
            object.__setattr__(self, "_encoded", encoded)
        return encoded

    @classmethod
    def decode(cls, raw: bytes, what: str | None = None) -> "Ticket":
        """A ticket from its bytes, its fields checked one by one and together."""
        known = _decoded_tickets.get(raw) if len(raw) <= KNOWN_TICKET_BYTES else None
        if known is not None:
            return known
        if len(raw) > cls.MAX_BYTES:
            raise LimitExceeded(f"ticket: {len(raw)} bytes is more than the {cls.MAX_BYTES} allowed", field="ticket")
        ticket = cls.from_json(loads(raw, "ticket"), what or "ticket")
        ticket.check()
        if len(raw) <= KNOWN_TICKET_BYTES:
            if len(_decoded_tickets) >= KNOWN_TICKETS:
                _decoded_tickets.clear()
            _decoded_tickets[bytes(raw)] = ticket
        return ticket

    def check(self) -> None:
        """What no field's parser sees alone: backward ranges, a column named twice, matched rows without a filter, a
        position outside any grid."""
        for name in ("rows", "matched"):
            span = getattr(self, name)
            if span is not None and span[1] < span[0]:
                raise RequestRejected(f"ticket.{name}: stop {span[1]} is before start {span[0]}",
                                      field=f"ticket.{name}")
        if self.columns is not None and len(set(self.columns)) != len(self.columns):
            raise RequestRejected("ticket.columns: a column is named twice", field="ticket.columns")
        if self.part[0] >= 1 << 31 or self.part[1] >= 1 << 31:
            raise RequestRejected(f"ticket.part: {list(self.part)} is outside any grid", field="ticket.part")
        if self.matched is not None and self.filter is None:
            raise RequestRejected("ticket.matched: a range of matched rows needs a filter", field="ticket.matched")
        if self.row_numbers and self.aggregate is not None:
            raise RequestRejected("ticket.row_numbers: an aggregate's rows have no positions",
                                  field="ticket.row_numbers")
        if self.top is not None and (self.aggregate is not None or not self.top.keys):
            raise RequestRejected("ticket.top: first rows by at least one key, and not of an aggregate",
                                  field="ticket.top")
        if self.more is not None:
            if any(getattr(self, name) is not None for name in ("rows", "matched", "row_numbers")):
                raise RequestRejected("ticket.more: several partitions in one stream are sent without a row range, "
                                      "matched range or row numbers", field="ticket.more")
            if len({self.part, *self.more}) != len(self.more) + 1:
                raise RequestRejected("ticket.more: a partition is named twice", field="ticket.more")


# --------------------------------------------------------------------------- descriptors


def partition_path(name: str, version: int, part: tuple[int, int]) -> list[str]:
    """Descriptor path of one partition for a node's ``do_put``."""
    return [name, str(version), str(part[0]), str(part[1])]


def _path_texts(path: list[bytes | str] | None) -> list[str]:
    return [p.decode("utf-8", "replace") if isinstance(p, bytes) else str(p) for p in (path or [])]


SEVERAL = "parts"
"""Third element of a put path whose stream carries several partitions, each between a header and a trailer."""


def partitions_path(name: str, version: int) -> list[str]:
    """Descriptor path of a ``do_put`` carrying several partitions of one version (see :class:`PartHeader`)."""
    return [name, str(version), SEVERAL]


def parse_put_path(descriptor: flight.FlightDescriptor) -> tuple[str, int, tuple[int, int] | None]:
    """Inverse of :func:`partition_path` and :func:`partitions_path`, strict; the part is None for several."""
    if descriptor.descriptor_type != flight.DescriptorType.PATH:
        raise RequestRejected("descriptor: expected a path [name, version, i, j] or [name, version, \"parts\"]",
                              field="descriptor")
    parts = _path_texts(descriptor.path)
    if len(parts) == 3 and parts[2] == SEVERAL:
        return check_name(parts[0], "descriptor.name"), digits(parts[1], "descriptor.version"), None
    if len(parts) != 4:
        raise RequestRejected(f"descriptor: expected path [name, version, i, j] or [name, version, \"parts\"], got "
                              f"{len(parts)} elements", field="descriptor")
    name = check_name(parts[0], "descriptor.name")
    version = digits(parts[1], "descriptor.version")
    i, j = digits(parts[2], "descriptor.i", 9), digits(parts[3], "descriptor.j", 9)
    return name, version, (i, j)


def parse_partition_path(descriptor: flight.FlightDescriptor) -> tuple[str, int, tuple[int, int]]:
    """Inverse of :func:`partition_path`, strict: exactly one partition."""
    name, version, part = parse_put_path(descriptor)
    if part is None:
        raise RequestRejected("descriptor: expected a path [name, version, i, j]", field="descriptor")
    return name, version, part


def dataset_path(name: str, version: int | None = None) -> list[str]:
    """Descriptor path of a dataset (its latest version) or of one version."""
    return [name] + ([str(int(version))] if version is not None else [])


def parse_dataset_path(descriptor: flight.FlightDescriptor) -> tuple[str, int | None]:
    """Inverse of :func:`dataset_path`, strict."""
    parts = _path_texts(descriptor.path)
    if descriptor.descriptor_type != flight.DescriptorType.PATH or len(parts) not in (1, 2):
        raise RequestRejected("descriptor: expected a path [name] or [name, version]", field="descriptor")
    name = check_name(parts[0], "descriptor.name")
    return name, (digits(parts[1], "descriptor.version") if len(parts) == 2 else None)


# --------------------------------------------------------------------------- FlightInfo


@dataclass(frozen=True)
class PartInfo:
    """What the catalog says of one partition: where it sits in the grid and who holds it."""

    position: tuple[int, int]
    start: tuple[int, int]
    shape: tuple[int, int]
    replicas: tuple[Replica, ...]
    nbytes: int = 0
    stats: dict | EncodedJson | None = None  # per-column statistics from the node that stored it (query.statistics)


@dataclass(frozen=True)
class VersionInfo:
    """One committed dataset version as the catalog publishes it in a ``FlightInfo``."""

    dataset: str
    version: int
    schema: pa.Schema
    shape: tuple[int, int]
    grid: tuple[int, int]
    parts: tuple[PartInfo, ...]
    capability: str | None = None  # a read capability for this version alone, when the cluster has a secret

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def _to_text(obj: Any) -> str:
    return obj.text if isinstance(obj, EncodedJson) else json.dumps(obj, separators=(",", ":"))


@dataclass(frozen=True)
class EncodedJson:
    """A value already written as JSON text (stored statistics), passed into a ``FlightInfo`` as it is."""

    text: str


def plain_tickets(dataset: str, version: int) -> Callable[[int, int], bytes]:
    """``(i, j) -> Ticket(dataset, version, (i, j)).encode()``, byte for byte, without building a message per
    partition (tests/unit/test_wire.py checks they agree)."""
    head = f'{{"dataset":{_to_text(dataset)},"version":{int(version)},"part":['.encode()
    tail = b'],"columns":null,"rows":null}'
    return lambda i, j: head + f"{int(i)},{int(j)}".encode() + tail


def encode_flight_info(v: VersionInfo, *, with_endpoints: bool = True) -> flight.FlightInfo:
    """The ``FlightInfo`` of one version, readable by any Flight client: one endpoint per partition in row-major order,
    replicas as locations, JSON endpoint metadata ``{"position", "start", "shape", "location", "nbytes"}``. The
    info's metadata repeats the geometry compactly, so large versions open without parsing every endpoint."""
    endpoints = []
    stats_texts = [_to_text(p.stats) if p.stats else "null" for p in v.parts]  # encoded once, used twice
    if with_endpoints:
        ticket = plain_tickets(v.dataset, v.version)
        locations: dict[tuple, tuple[str, list[str]]] = {}  # a few replica sets, shared by many partitions
        for p, text in zip(v.parts, stats_texts):
            where = locations.get(p.replicas)
            if where is None:
                where = locations[p.replicas] = (_to_text([[ip, pid] for _uri, ip, pid in p.replicas]),
                                                 [uri for uri, _ip, _pid in p.replicas])
            (i, j), (a, b), (r, c) = p.position, p.start, p.shape
            stats = f',"stats":{text}' if text != "null" else ""
            meta = (f'{{"position":[{i},{j}],"start":[{a},{b}],"shape":[{r},{c}],"location":{where[0]},'
                    f'"nbytes":{p.nbytes}{stats}}}').encode()
            endpoints.append(flight.FlightEndpoint(ticket(i, j), where[1], app_metadata=meta))
    nodes = sorted({r for p in v.parts for r in p.replicas})
    index = {r: k for k, r in enumerate(nodes)}
    meta = dumps({
        "shape": list(v.shape), "partition_tiling": list(v.grid), "version": v.version,
        "row_sizes": [p.shape[0] for p in v.parts if p.position[1] == 0],
        "col_sizes": [p.shape[1] for p in v.parts if p.position[0] == 0],
        "nodes": [list(r) for r in nodes],
        "replicas": [[index[r] for r in p.replicas] for p in v.parts],
        "part_bytes": [p.nbytes for p in v.parts],
        **({"capability": v.capability} if v.capability else {}),
    })
    if any(text != "null" for text in stats_texts):
        meta = meta[:-1] + b',"part_stats":[' + ",".join(stats_texts).encode() + b"]}"
    return flight.FlightInfo(v.schema, flight.FlightDescriptor.for_path(v.dataset), endpoints, total_records=v.shape[0],
                             total_bytes=v.nbytes, ordered=True, app_metadata=meta)


def decode_flight_info(info: flight.FlightInfo) -> VersionInfo:
    """Inverse of :func:`encode_flight_info` (from the compact metadata, or else the endpoints)."""
    meta = loads(info.app_metadata or b"{}", "FlightInfo.app_metadata")
    name = _path_texts(info.descriptor.path)[0]
    grid = tuple(meta["partition_tiling"])
    parts = []
    if "row_sizes" in meta:
        nodes = [tuple(n) for n in meta["nodes"]]
        row_starts = _starts(meta["row_sizes"])
        col_starts = _starts(meta["col_sizes"])
        sizes = meta.get("part_bytes") or [0] * len(meta["replicas"])
        stats = meta.get("part_stats") or [None] * len(meta["replicas"])
        shared: dict[tuple, tuple] = {}
        for k, holders in enumerate(meta["replicas"]):
            i, j = divmod(k, grid[1])
            key = tuple(holders)
            replicas = shared.get(key)
            if replicas is None:
                replicas = shared[key] = tuple(nodes[h] for h in holders)
            parts.append(PartInfo((i, j), (row_starts[i], col_starts[j]), (meta["row_sizes"][i], meta["col_sizes"][j]),
                                  replicas, sizes[k], stats[k] if isinstance(stats[k], dict) else None))
    else:
        for endpoint in info.endpoints:
            em = loads(endpoint.app_metadata, "FlightEndpoint.app_metadata")
            uris = [loc.uri.decode() if isinstance(loc.uri, bytes) else str(loc.uri) for loc in endpoint.locations]
            replicas = tuple((u, ip, pid) for u, (ip, pid) in zip(uris, em["location"]))
            parts.append(PartInfo(tuple(em["position"]), tuple(em["start"]), tuple(em["shape"]), replicas,
                                  em.get("nbytes", 0), em.get("stats") if isinstance(em.get("stats"), dict) else None))
    cap = meta.get("capability")
    return VersionInfo(name, meta["version"], info.schema, tuple(meta["shape"]), grid, tuple(parts),
                       cap if isinstance(cap, str) else None)


@dataclass(frozen=True)
class DatasetEntry:
    """One dataset as ``list_flights`` shows it: its latest version, shape (rows, columns), partition tiling (row
    blocks, column groups) and bytes. ``version`` is None and the tuples empty only for a ``FlightInfo`` without
    flightpart's metadata (another Flight server's)."""

    name: str
    version: int | None
    shape: tuple[int, ...]
    partition_tiling: tuple[int, ...]
    nbytes: int

    def to_json(self) -> dict[str, Any]:
        """The entry as a JSON object (what ``flightpart ls --json`` prints, tuples as lists)."""
        return {"name": self.name, "version": self.version, "shape": list(self.shape),
                "partition_tiling": list(self.partition_tiling), "nbytes": self.nbytes}


def list_entry(info: flight.FlightInfo) -> DatasetEntry:
    """What ``list_flights`` says of one dataset, for people and scripts."""
    meta = loads(info.app_metadata or b"{}", "FlightInfo.app_metadata")
    return DatasetEntry(_path_texts(info.descriptor.path)[0], meta.get("version"), tuple(meta.get("shape", ())),
                        tuple(meta.get("partition_tiling", ())), info.total_bytes)


def _starts(sizes: list[int]) -> list[int]:
    out, total = [], 0
    for s in sizes:
        out.append(total)
        total += s
    return out


# --------------------------------------------------------------------------- node actions and put stream


@dataclass(frozen=True)
class HeldPartition(Message):
    """One partition a node holds: in ``register-node``, ``held`` replies and put receipts."""

    dataset: str = _field(p_name)
    version: int = _field(p_uint)
    part: tuple[int, int] = _field(p_pair)
    rows: int = _field(p_uint, 0)
    nbytes: int = _field(p_uint, 0)
    schema: pa.Schema | None = _field(p_optional(p_schema), None)
    stats: dict | None = _field(p_optional(p_stats), None)


@dataclass(frozen=True)
class PutTrailer(Message):
    """The metadata message that closes a complete put stream: how many rows were sent."""

    rows: int = _field(p_uint)


@dataclass(frozen=True)
class PartHeader(Message):
    """In a put stream of several partitions, the metadata that opens the next; its batches and
    :class:`PutTrailer` follow. All share the stream's schema (one column group)."""

    part: tuple[int, int] = _field(p_pair)

    def encode(self) -> bytes:
        """What :meth:`Message.encode` writes, without its walk of the fields."""
        return b'{"part":[%d,%d]}' % self.part


@dataclass(frozen=True)
class EndpointRows(Message):
    """A plain scan endpoint's ``app_metadata``: the most rows its partition may send, the rows the catalog says it
    holds, and (when no column may grow when sent) the most bytes of values. A reader leaves a stream past either."""

    most_rows: int = _field(p_uint)
    most_bytes: int | None = _field(p_optional(p_uint), None, omitted_when_none=True)


MAX_PARTS_PER_RUN = 1024
"""Partitions one :class:`PartRun` names at most."""


@dataclass(frozen=True)
class PartRun(Message):
    """In a read stream of several partitions: the batch this comes with holds whole partitions back to back,
    ``rows[k]`` rows for ``parts[k]`` (a partition larger than a batch continues in the unmarked batches after)."""

    parts: tuple[tuple[int, int], ...] = _field(p_list(p_pair, MAX_PARTS_PER_RUN))
    rows: tuple[int, ...] = _field(p_list(p_uint, MAX_PARTS_PER_RUN))

    def check(self) -> None:
        """What no field's parser sees alone: a row count for each partition."""
        if len(self.parts) != len(self.rows) or not self.parts:
            raise RequestRejected("part run: one row count per partition, and at least one partition", field="rows")


@dataclass(frozen=True)
class PutReceipts(Message):
    """A node's answer to a put of several partitions, in pages: what it stored, once all of it is durable."""

    partitions: tuple[HeldPartition, ...] = _field(p_list(p_message(HeldPartition)))


@dataclass(frozen=True)
class Removed(Message):
    """How many files (or listed replicas) an order removed: the reply to a node's ``drop`` and to ``report-damage``."""

    removed: int = _field(p_uint)


@dataclass(frozen=True)
class Copied(Message):
    """The bytes a ``copy-to`` sent to its target node."""

    copied: int = _field(p_uint)


@dataclass(frozen=True)
class Checked(Message):
    """A ``check`` passed: the partition's file matches its checksum (a failed check is an error, not a reply)."""

    ok: bool = _field(p_bool, True)


@dataclass(frozen=True)
class CheckedParts(Message):
    """What ``check-parts`` found: the partitions that failed their check or are absent (the others passed)."""

    failed: tuple[tuple[int, int], ...] = _field(p_list(p_pair), ())


@dataclass(frozen=True)
class Sealed(Message):
    """Whether a node kept a ``seal``'s manifest (False: it holds none of the version's partitions)."""

    sealed: bool = _field(p_bool)


@dataclass(frozen=True)
class Committed(Message):
    """The version a ``commit`` published."""

    dataset: str = _field(p_name)
    version: int = _field(p_uint)


@dataclass(frozen=True)
class Aborted(Message):
    """The version an ``abort`` forgot (its files are dropped on the nodes that hold them)."""

    aborted: int = _field(p_uint)


@dataclass(frozen=True)
class Dropped(Message):
    """What a catalog's ``drop`` removed: the dataset, the version (null: every version) and how many nodes
    dropped its files."""

    dataset: str = _field(p_name)
    version: int | None = _field(p_optional(p_uint), None)
    nodes_cleaned: int = _field(p_uint, 0)


@dataclass(frozen=True)
class VersionReply(Message):
    """The version a ``begin`` reserved or a ``publish-begin`` joined; ``grant``: the
    :func:`~flightpart.tokens.version_grant` its puts and orders must carry (clusters with a secret)."""

    version: int = _field(p_uint)
    grant: str | None = _field(p_optional(p_str), None)


@dataclass(frozen=True)
class VersionList(Message):
    """The committed versions of a dataset, oldest first (the ``versions`` reply)."""

    versions: tuple[int, ...] = _field(p_list(p_uint))


@dataclass(frozen=True)
class NodeInfo(Message):
    """Who a node is (``node-info``): a reader compares ``ip`` and ``pid`` with its own to map files."""

    node_id: str = _field(p_str)
    uri: str = _field(p_str)
    ip: str = _field(p_str)
    pid: int = _field(p_uint)
    data_dir: str | None = _field(p_optional(p_str), None)
    version: str | None = _field(p_optional(p_str), None)


@dataclass(frozen=True)
class StatsReply(Message):
    """A daemon's counters (``stats``): one flat JSON object, kept as received, so a new counter needs no new message.
    ``values`` maps each counter's name to its figure (``reply.values["bytes_sent"]``). Readers check each figure
    themselves, so one odd reply is that node's problem, not a failed call."""

    values: Any = field(default_factory=dict)

    def to_json(self) -> Any:
        return self.values

    @classmethod
    def from_json(cls, body: Any, where: str | None = None) -> StatsReply:
        return cls(body)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


@dataclass(frozen=True)
class NodeRow(Message):
    """One node as its catalog knows it: who it is, when it last beat, its disk and its clock."""

    node_id: str = _field(p_str)
    uri: str = _field(p_str)
    ip: str = _field(p_str)
    pid: int = _field(p_uint)
    data_dir: str | None = _field(p_optional(p_str), None)
    last_heartbeat: float = _field(p_number, 0.0)
    alive: bool = _field(p_bool, False)
    free_bytes: int | None = _field(p_optional(p_uint), None)
    low_space: bool = _field(p_bool, False)
    clock_skew: float | None = _field(p_optional(p_number), None)
    """Seconds the node's clock runs ahead of the catalog's, from its last heartbeat."""


@dataclass(frozen=True)
class NodeList(Message):
    """Every node the catalog knows, alive or not (the ``nodes`` reply)."""

    nodes: tuple[NodeRow, ...] = _field(p_list(p_message(NodeRow), 100_000))


@dataclass(frozen=True)
class Following(Message):
    """A node's answer to ``lead``: it follows that catalog now (its id)."""

    node_id: str = _field(p_str)


@dataclass(frozen=True)
class Lead(Message):
    """Catalog to node, at a takeover: this catalog leads the cluster from ``epoch`` on; orders of lower epochs are
    refused from now, and heartbeats go to ``leader``."""

    ACTION = "lead"
    REPLY = Following
    cluster: str | None = _field(p_optional(p_str))
    epoch: int = _field(p_uint)
    leader: str = _field(p_str)


@dataclass(frozen=True)
class Leadership(Message):
    """Which catalog leads, since when (Unix seconds, the database's clock) and with which epoch; the standbys heard
    from lately; this catalog's ``role`` (leader, standby, read-only or single) and address."""

    role: str = _field(p_str)
    uri: str = _field(p_str)
    leader: str | None = _field(p_optional(p_str), None)
    epoch: int | None = _field(p_optional(p_uint), None)
    since: float | None = _field(p_optional(p_number), None)
    standbys: tuple[str, ...] = _field(p_list(p_str, 1000), ())


@dataclass(frozen=True)
class GetLeadership(Message):
    """To a catalog (any, standbys too): who leads."""

    ACTION = "leadership"
    REPLY = Leadership


@dataclass(frozen=True)
class GetNodeInfo(Message):
    """To a node: who are you (no argument)."""

    ACTION = "node-info"
    REPLY = NodeInfo


@dataclass(frozen=True)
class GetStats(Message):
    """To a node or a catalog: your counters (no argument)."""

    ACTION = "stats"
    REPLY = StatsReply


@dataclass(frozen=True)
class QueriesReply(Message):
    """The catalog's SQL queries (``queries``): ``{"running": [...], "recent": [...]}``, each query a flat JSON object
    (id, caller, text, started, seconds, rows, bytes_from_nodes, outcome), kept as received."""

    values: Any = field(default_factory=dict)

    def to_json(self) -> Any:
        return self.values

    @classmethod
    def from_json(cls, body: Any, where: str | None = None) -> QueriesReply:
        if not isinstance(body, dict) or not all(isinstance(body.get(k), list) for k in ("running", "recent")):
            raise RequestRejected(f"{where or 'queries'}: expected lists of running and recent queries",
                                  field=where or "queries")
        return cls(body)

    @property
    def running(self) -> list[dict[str, Any]]:
        """The queries running now, the most recent first."""
        return self.values["running"]

    @property
    def recent(self) -> list[dict[str, Any]]:
        """The last queries finished, the most recent first."""
        return self.values["recent"]


@dataclass(frozen=True)
class GetQueries(Message):
    """To a catalog: the SQL queries it runs now and the last it finished (no argument; an admin's)."""

    ACTION = "queries"
    REPLY = QueriesReply


@dataclass(frozen=True)
class HeldReply(Message):
    """One page of held partitions; each column group's schema once in ``schemas`` (indexed by ``schema_of[k]``);
    ``more``: ask again with ``after`` = the last position."""

    partitions: tuple[HeldPartition, ...] = _field(p_list(p_message(HeldPartition)))
    schemas: tuple[pa.Schema, ...] = _field(p_list(p_schema, 100_000), ())
    schema_of: tuple[int, ...] = _field(p_list(p_uint), ())
    more: bool = _field(p_bool, False)

    def schema(self, k: int) -> pa.Schema | None:
        """The schema of the ``k``-th partition of this page."""
        if self.partitions[k].schema is not None:
            return self.partitions[k].schema
        if k < len(self.schema_of) and self.schema_of[k] < len(self.schemas):
            return self.schemas[self.schema_of[k]]
        return None


@dataclass(frozen=True)
class Held(Message):
    """Which partitions of a version a node holds, one page at a time: those after grid position ``after``."""

    ACTION = "held"
    REPLY = HeldReply
    dataset: str = _field(p_name)
    version: int = _field(p_uint)
    after: tuple[int, int] | None = _field(p_optional(p_pair), None)


@dataclass(frozen=True)
class RevocationEntry(Message):
    """One withdrawal (:class:`flightpart.grants.Revocation`)."""

    holder: str = _field(p_str)
    pattern: str = _field(p_str)
    at: float = _field(p_number)
    until: float = _field(p_number)


@dataclass(frozen=True)
class DropFiles(Message):
    """Catalog to node: delete one version's files (``version`` null: every version's). A node obeys only its own
    ``cluster``'s catalog; with ``pending_only`` (an abort) a sealed version is never deleted."""

    ACTION = "drop"
    REPLY = Removed
    dataset: str = _field(p_name)
    version: int | None = _field(p_optional(p_uint), None)
    cluster: str | None = _field(p_optional(p_str), None)
    pending_only: bool = _field(p_bool, False)
    through: int | None = _field(p_optional(p_uint), None)
    """To a node, with ``version`` null: the highest version number the dataset had when every version was
    dropped, so the node remembers that no number up to it may be used again (see :class:`Tombstones`)."""
    epoch: int | None = _field(p_optional(p_uint), None)
    """The leading catalog's epoch (catalogs sharing a lease, see docs/operations/failures.md); a node refuses an
    order whose epoch is lower than the highest it has seen. None from a catalog without a lease."""


@dataclass(frozen=True)
class Tombstones(Message):
    """What a node remembers of a dataset's gone versions, whose numbers must never be used again: every version
    through ``dropped_through``, and single ``dropped`` and ``aborted`` ones. Reported at registration, so a catalog
    that lost its state gets them back."""

    dataset: str = _field(p_name)
    dropped_through: int = _field(p_uint, 0)
    dropped: tuple[int, ...] = _field(p_list(p_uint, 100_000), ())
    aborted: tuple[int, ...] = _field(p_list(p_uint, 100_000), ())


@dataclass(frozen=True)
class CopyTo(Message):
    ACTION = "copy-to"
    REPLY = Copied
    dataset: str = _field(p_name)
    version: int = _field(p_uint)
    part: tuple[int, int] = _field(p_pair)
    target: str = _field(p_str)
    cluster: str | None = _field(p_optional(p_str), None)
    epoch: int | None = _field(p_optional(p_uint), None)
    """The leading catalog's epoch (catalogs sharing a lease, see docs/operations/failures.md); a node refuses an
    order whose epoch is lower than the highest it has seen. None from a catalog without a lease."""
    grant: str | None = _field(p_optional(p_str), None)
    """The catalog's put grant for this one partition to this target (``flightpart.tokens.put_grant``): the holder
    puts with it, since its node token writes to no node. None in a cluster without a secret."""


@dataclass(frozen=True)
class PartPlace(Message):
    """One partition of one version: what ``check`` asks a node to vouch for, and an entry of a scrub's findings."""

    ACTION = "check"
    REPLY = Checked
    dataset: str = _field(p_name)
    version: int = _field(p_uint)
    part: tuple[int, int] = _field(p_pair)


MAX_PARTS_PER_CHECK = 16384
"""Partitions one ``check-parts`` names at most (a bounded body, and an answer in bounded time)."""


@dataclass(frozen=True)
class CheckParts(Message):
    """``check`` for many partitions of one version in one call, sent by a reader before mapping local partitions."""

    ACTION = "check-parts"
    REPLY = CheckedParts
    dataset: str = _field(p_name)
    version: int = _field(p_uint)
    parts: tuple[tuple[int, int], ...] = _field(p_list(p_pair, MAX_PARTS_PER_CHECK))


@dataclass(frozen=True)
class ScrubReport(Message):
    """What a node's scrub found: files checked and their bytes, partitions damaged (quarantined) and missing."""

    checked: int = _field(p_uint, 0)
    bytes: int = _field(p_uint, 0)
    damaged: tuple[PartPlace, ...] = _field(p_list(p_message(PartPlace)), ())
    missing: tuple[PartPlace, ...] = _field(p_list(p_message(PartPlace)), ())


@dataclass(frozen=True)
class Scrub(Message):
    """To a node: check every stored file against its checksum now (no argument)."""

    ACTION = "scrub"
    REPLY = ScrubReport


@dataclass(frozen=True)
class NodeScrubReport(ScrubReport):
    """One node's findings in a cluster scrub: its report, and which node it is."""

    uri: str = _field(p_str, "")
    node_id: str = _field(p_str, "")


@dataclass(frozen=True)
class ClusterScrubReport(Message):
    """What a cluster scrub found: each live node's report, the nodes not scrubbed, and the totals."""

    nodes: tuple[NodeScrubReport, ...] = _field(p_list(p_message(NodeScrubReport), 100_000))
    unreachable: tuple[str, ...] = _field(p_list(p_str, 100_000), ())
    damaged: int = _field(p_uint, 0)
    missing: int = _field(p_uint, 0)


SCRUB_DEADLINE = 24 * 3600.0
"""Deadline of a scrub call, to a node or a catalog: a node that beats is waited for however many files it reads (the
catalog leaves one that stops beating); this only ends a call left behind (a node frozen mid-scrub, never thawed)."""


@dataclass(frozen=True)
class ScrubCluster(Message):
    """To a catalog: have every live node scrub its files now, in parallel (no argument)."""

    ACTION = "scrub"
    REPLY = ClusterScrubReport


@dataclass(frozen=True)
class ReportDamage(Message):
    """From a node to its catalog: replicas it no longer has intact (damaged or missing); the catalog stops listing
    them."""

    ACTION = "report-damage"
    REPLY = Removed
    node_id: str = _field(p_str)
    partitions: tuple[PartPlace, ...] = _field(p_list(p_message(PartPlace), 100_000))


@dataclass(frozen=True)
class AssemblePart(Message):
    """One partition of a new grid: its position and the global rows ``[start, stop)`` it holds."""

    part: tuple[int, int] = _field(p_pair)
    rows: tuple[int, int] = _field(p_pair)


@dataclass(frozen=True)
class AssembleReply(Message):
    """What an ``assemble`` stored: a receipt per partition, and which of them are links to source files."""

    partitions: tuple[HeldPartition, ...] = _field(p_list(p_message(HeldPartition)))
    linked: int = _field(p_uint, 0)


@dataclass(frozen=True)
class Assemble(Message):
    """To a node: build partitions of ``version`` from committed ``source`` of the same dataset, into ``groups`` column
    groups. The node reads the source's geometry from its catalog (never the caller), pulls rows from their holders
    and links a partition that is exactly one it holds."""

    ACTION = "assemble"
    REPLY = AssembleReply
    dataset: str = _field(p_name)
    source: int = _field(p_uint)
    version: int = _field(p_uint)
    groups: int = _field(p_uint)
    parts: tuple[AssemblePart, ...] = _field(p_list(p_message(AssemblePart), 4096))
    deadline_ms: int | None = _field(p_optional(p_uint), None)
    """Milliseconds the caller will wait for the reply: the node's own calls (the catalog, pulls from holders)
    stop waiting when it is spent, so a frozen holder cannot keep the node busy after the caller gave up."""


@dataclass(frozen=True)
class LinkPart(Message):
    """One partition of a ``relink``: the source's position and the position it takes in the new version."""

    source: tuple[int, int] = _field(p_pair)
    part: tuple[int, int] = _field(p_pair)


@dataclass(frozen=True)
class Relink(Message):
    """To a node: make partitions of uncommitted ``version`` the very files of partitions of ``source`` it holds (no
    byte copied). A stream append stores its rows once under an unpublished staging version and relinks them at
    each try; ``source_grant``: the writer's grant for ``source``."""

    ACTION = "relink"
    REPLY = AssembleReply
    dataset: str = _field(p_name)
    source: int = _field(p_uint)
    version: int = _field(p_uint)
    parts: tuple[LinkPart, ...] = _field(p_list(p_message(LinkPart), 4096))
    source_grant: str | None = _field(p_optional(p_str), None)


# --------------------------------------------------------------------------- catalog actions


@dataclass(frozen=True)
class VersionRef(Message):
    """(dataset, version): what ``register-node`` lists and replies as orphans."""

    dataset: str = _field(p_name)
    version: int = _field(p_uint)


@dataclass(frozen=True)
class Abort(Message):
    """Forget a pending version and drop its files."""

    ACTION = "abort"
    REPLY = Aborted
    dataset: str = _field(p_name)
    version: int = _field(p_uint)


@dataclass(frozen=True)
class Begin(Message):
    """Reserve the next version of a dataset."""

    ACTION = "begin"
    REPLY = VersionReply
    dataset: str = _field(p_name)


@dataclass(frozen=True)
class ListVersions(Message):
    """The committed versions of a dataset."""

    ACTION = "versions"
    REPLY = VersionList
    dataset: str = _field(p_name)


@dataclass(frozen=True)
class ListNodes(Message):
    """Every node the catalog knows (no argument)."""

    ACTION = "nodes"
    REPLY = NodeList


ALREADY_DROPPED = "drop.dropped"
"""The ``field`` of the DATASET_NOT_FOUND that answers a drop of what is dropped already (not of a name never used)."""


@dataclass(frozen=True)
class Drop(Message):
    """Drop one version (or, with ``version`` null, every version) of a dataset and its files on every node."""

    ACTION = "drop"
    REPLY = Dropped
    dataset: str = _field(p_name)
    version: int | None = _field(p_optional(p_uint), None)


@dataclass(frozen=True)
class ReplicaCopy(Message):
    """A partition ``repair`` copied, and the node it now also lives on."""

    dataset: str = _field(p_name)
    version: int = _field(p_uint)
    part: tuple[int, int] = _field(p_pair)
    to: str = _field(p_str)


@dataclass(frozen=True)
class CopyFailed(Message):
    """A copy ``repair`` could not make this time, and why; the next ``repair`` tries again."""

    dataset: str = _field(p_name)
    version: int = _field(p_uint)
    part: tuple[int, int] = _field(p_pair)
    reason: str = _field(p_str)


@dataclass(frozen=True)
class RepairReport(Message):
    """What a ``repair`` did: copies made, partitions no live node holds (lost), copies it could not make
    (``failed``)."""

    copied: tuple[ReplicaCopy, ...] = _field(p_list(p_message(ReplicaCopy)), ())
    lost: tuple[PartPlace, ...] = _field(p_list(p_message(PartPlace)), ())
    failed: tuple[CopyFailed, ...] = _field(p_list(p_message(CopyFailed)), ())


@dataclass(frozen=True)
class Repair(Message):
    """Copy under-replicated partitions to live nodes (no argument)."""

    ACTION = "repair"
    REPLY = RepairReport


@dataclass(frozen=True)
class CommitPart(Message):
    part: tuple[int, int] = _field(p_pair)
    start: tuple[int, int] = _field(p_pair)
    shape: tuple[int, int] = _field(p_pair)
    nodes: tuple[str, ...] = _field(p_list(p_str, 64))


_PART_COLUMNS = ("i", "j", "start_i", "start_j", "rows", "cols")


def _commit_parts_to_json(parts: tuple[CommitPart, ...]) -> dict:
    """Partitions as columns (about a quarter of the bytes of objects), so large commits fit one action body."""
    nodes: dict[str, int] = {}
    holders = [[nodes.setdefault(n, len(nodes)) for n in p.nodes] for p in parts]
    values = ([p.part[0] for p in parts], [p.part[1] for p in parts], [p.start[0] for p in parts],
              [p.start[1] for p in parts], [p.shape[0] for p in parts], [p.shape[1] for p in parts])
    return {**dict(zip(_PART_COLUMNS, values)), "nodes": list(nodes), "holders": holders}


def _uints(value: Any, where: str, n: int) -> list[int]:
    """A list of ``n`` non-negative integers, checked in bulk."""
    if not isinstance(value, list) or len(value) != n:
        raise RequestRejected(f"{where}: expected a list of {n} non-negative integers", field=where)
    if not all(type(x) is int for x in value) or (value and (min(value) < 0 or max(value) >= MAX_UINT)):
        raise RequestRejected(f"{where}: expected non-negative integers", field=where)
    return value


def p_commit_parts(value: Any, where: str) -> tuple[CommitPart, ...]:
    """The partitions of a commit, as columns (:func:`_commit_parts_to_json`) or as a list of objects."""
    if isinstance(value, list):
        return p_list(p_message(CommitPart))(value, where)
    if not isinstance(value, dict) or set(value) != {*_PART_COLUMNS, "nodes", "holders"}:
        raise RequestRejected(f"{where}: expected the columns {', '.join(_PART_COLUMNS)}, nodes and holders",
                              field=where)
    holders = value["holders"]
    if not isinstance(holders, list) or len(holders) > 10_000_000:
        raise RequestRejected(f"{where}.holders: expected a list", field=f"{where}.holders")
    n = len(holders)
    i, j, si, sj, rows, cols = (_uints(value[c], f"{where}.{c}", n) for c in _PART_COLUMNS)
    nodes = p_list(p_str, 100_000)(value["nodes"], f"{where}.nodes")
    for k, h in enumerate(holders):
        if (not isinstance(h, list) or not 1 <= len(h) <= 64
                or not all(type(x) is int and 0 <= x < len(nodes) for x in h)):
            raise RequestRejected(f"{where}.holders[{k}]: expected 1 to 64 indices into nodes",
                                  field=f"{where}.holders")
    return tuple(CommitPart((i[k], j[k]), (si[k], sj[k]), (rows[k], cols[k]), tuple(nodes[x] for x in holders[k]))
                 for k in range(n))


@dataclass(frozen=True)
class Commit(Message):
    """Publish a version: its schema, shape, tiling and every partition with the nodes holding it."""

    ACTION = "commit"
    REPLY = Committed
    dataset: str = _field(p_name)
    version: int = _field(p_uint)
    schema: pa.Schema = _field(p_schema)
    shape: tuple[int, int] = _field(p_pair)
    tiling: tuple[int, int] = _field(p_pair)
    partitions: tuple[CommitPart, ...] = _field(p_commit_parts, encode=_commit_parts_to_json)
    replicas: int = _field(p_uint, 1)
    base: int | None = _field(p_optional(p_uint), None)
    """The version this write was computed from (an append, a repartition, a rebalance), or None for a replace
    (a put). The catalog publishes the version only while ``base`` is still the latest, and never behind a newer
    one, in the same transaction as the commit: two writers racing on one dataset cannot both be acknowledged
    with one of them lost (the loser gets VERSION_CONFLICT, field ``commit.base``, and re-bases)."""
    signature: str | None = _field(p_optional(p_str), None)
    """A sealed manifest's: the catalog's signature (flightpart.tokens.manifest_signature), which a catalog
    rebuilding lost state requires before it takes the manifest as a commit. A writer's commit leaves it out."""


@dataclass(frozen=True)
class PublishReply(Message):
    version: int = _field(p_uint)
    complete: bool = _field(p_bool)
    joined: int = _field(p_uint)


@dataclass(frozen=True)
class PublishBegin(Message):
    ACTION = "publish-begin"
    REPLY = VersionReply
    dataset: str = _field(p_name)
    nranks: int = _field(p_uint)
    rank: int = _field(p_uint)


@dataclass(frozen=True)
class PublishPart(Message):
    ACTION = "publish-part"
    REPLY = PublishReply
    dataset: str = _field(p_name)
    version: int = _field(p_uint)
    rank: int = _field(p_uint)
    rows: int = _field(p_uint)
    cols: int = _field(p_uint)
    node_id: str = _field(p_str)
    schema: pa.Schema = _field(p_schema)


@dataclass(frozen=True)
class Seal(Message):
    """Catalog to node: this version is committed; keep its manifest beside its partitions."""

    ACTION = "seal"
    REPLY = Sealed
    cluster: str = _field(p_str)
    manifest: Commit = _field(p_message(Commit))
    epoch: int | None = _field(p_optional(p_uint), None)
    """The leading catalog's epoch (catalogs sharing a lease, see docs/operations/failures.md); a node refuses an
    order whose epoch is lower than the highest it has seen. None from a catalog without a lease."""


@dataclass(frozen=True)
class RegisterReply(Message):
    """The catalog's answer: the cluster the node belongs to, versions it may delete, manifests to keep."""

    registered: str = _field(p_str)
    cluster: str | None = _field(p_optional(p_str), None)
    orphans: tuple[VersionRef, ...] = _field(p_list(p_message(VersionRef)), ())
    seal: tuple[Commit, ...] = _field(p_list(p_message(Commit)), ())
    epoch: int | None = _field(p_optional(p_uint), None)
    """The leading catalog's epoch (catalogs sharing a lease, see docs/operations/failures.md); a node refuses an
    order whose epoch is lower than the highest it has seen. None from a catalog without a lease."""
    revocations: tuple[RevocationEntry, ...] | None = _field(p_optional(p_list(p_message(RevocationEntry), 200_000)),
                                                             None, omitted_when_none=True)
    """Every withdrawal in force (:class:`Revocations`); None from a catalog without a secret."""


@dataclass(frozen=True)
class RegisterNode(Message):
    """A node announces itself: what it holds, which versions it has sealed, which version numbers it has seen."""

    ACTION = "register-node"
    REPLY = RegisterReply
    node_id: str = _field(p_str)
    uri: str = _field(p_str)
    ip: str = _field(p_str)
    pid: int = _field(p_uint)
    data_dir: str | None = _field(p_optional(p_str), None)
    version: str | None = _field(p_optional(p_str), None)
    partitions: tuple[HeldPartition, ...] = _field(p_list(p_message(HeldPartition)), ())
    cluster: str | None = _field(p_optional(p_str), None)
    sealed: tuple[Commit, ...] = _field(p_list(p_message(Commit)), ())
    versions: tuple[VersionRef, ...] = _field(p_list(p_message(VersionRef)), ())
    sealed_versions: tuple[VersionRef, ...] = _field(p_list(p_message(VersionRef)), ())
    more: bool = _field(p_bool, False)
    """A node holding more than one body can carry registers in pages: every page repeats who it is, every
    version it has and which it has sealed (``sealed_versions``), and carries a share of its partitions and
    manifests; all but the last say ``more``. ``tombstones`` (every page): the versions it knows are gone."""
    tombstones: tuple[Tombstones, ...] = _field(p_list(p_message(Tombstones), 100_000), ())


@dataclass(frozen=True)
class HeartbeatReply(Message):
    """``clock_ms``: the catalog's wall clock (Unix ms) when it took a beat that ``asks_clock``; the node judges expiry
    by it."""

    known: bool = _field(p_bool)
    clock_ms: int | None = _field(p_optional(p_uint), None, omitted_when_none=True)


@dataclass(frozen=True)
class Heartbeat(Message):
    """A node is alive: its free disk space, whether that is below its floor, and its wall clock (Unix ms) so the
    catalog can see clocks that disagree. ``asks_clock``: the reply carries the catalog's clock."""

    ACTION = "heartbeat"
    REPLY = HeartbeatReply
    node_id: str = _field(p_str)
    free_bytes: int | None = _field(p_optional(p_uint), None)
    low_space: bool = _field(p_bool, False)
    clock_ms: int | None = _field(p_optional(p_uint), None)
    asks_clock: bool | None = _field(p_optional(p_bool), None, omitted_when_none=True)

    @classmethod
    def decode_plain(cls, raw: bytes) -> "Heartbeat | None":
        """The usual heartbeat checked by hand (cheaper than the generic parser); None for anything else, which
        :meth:`decode` then refuses naming the field."""
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            return None
        return cls.from_plain(body)

    @classmethod
    def from_plain(cls, body: Any) -> "Heartbeat | None":
        """The usual heartbeat from its decoded JSON body (Flight's, or a datagram's), None for anything else."""
        if type(body) is not dict or not body.keys() <= {"node_id", "free_bytes", "low_space", "clock_ms",
                                                         "asks_clock"}:
            return None
        node_id, free, low = body.get("node_id"), body.get("free_bytes"), body.get("low_space", False)
        clock, asks = body.get("clock_ms"), body.get("asks_clock")
        if (type(node_id) is not str or len(node_id) > 4096 or type(low) is not bool
                or not (free is None or (type(free) is int and 0 <= free < MAX_UINT))
                or not (clock is None or (type(clock) is int and 0 <= clock < MAX_UINT))
                or not (asks is None or type(asks) is bool)):
            return None
        return cls(node_id, free, low, clock, asks)


# --------------------------------------------------------------------------- credentials


# --------------------------------------------------------------------------- users, grants and revocations


def p_principal(value: Any, where: str) -> str:
    """A user's or group's name (:data:`flightpart.grants.PRINCIPAL`)."""
    from .grants import check_principal

    try:
        return check_principal(p_str(value, where))
    except ValueError as exc:
        raise RequestRejected(f"{where}: {exc}", field=where) from None


def p_pattern(value: Any, where: str) -> str:
    """A dataset pattern (:func:`flightpart.grants.check_pattern`)."""
    from .grants import check_pattern

    try:
        return check_pattern(p_str(value, where))
    except ValueError as exc:
        raise RequestRejected(f"{where}: {exc}", field=where) from None


def _p_choice(*choices: str) -> Parser:
    def parse_choice(value: Any, where: str) -> str:
        if value not in choices:
            raise RequestRejected(f"{where}: expected one of {', '.join(choices)}, got {value!r:.60}", field=where)
        return value

    return parse_choice


def p_password(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) > 1024:
        raise RequestRejected(f"{where}: expected a password of at most 1024 characters", field=where)
    return value


@dataclass(frozen=True)
class AccessChanged(Message):
    """What a change to users, groups or grants did: whether anything changed, said in a sentence."""

    changed: bool = _field(p_bool)
    said: str = _field(p_str, "")


@dataclass(frozen=True)
class AddUser(Message):
    """To a catalog (an admin's): a user who signs in with ``password`` and has ``role``."""

    ACTION = "user-add"
    REPLY = AccessChanged
    name: str = _field(p_principal)
    password: str = _field(p_password)
    role: str = _field(_p_choice("reader", "writer", "admin"), "reader")


@dataclass(frozen=True)
class ChangeUser(Message):
    """To a catalog: a user's new password (an admin's, or the user's own with ``current``) or role (an admin's).
    Their other sessions end."""

    ACTION = "user-change"
    REPLY = AccessChanged
    name: str = _field(p_principal)
    password: str | None = _field(p_optional(p_password), None)
    role: str | None = _field(p_optional(_p_choice("reader", "writer", "admin")), None)
    current: str | None = _field(p_optional(p_password), None, omitted_when_none=True)
    """The user's current password, which a user changing their own gives (an admin needs none)."""


@dataclass(frozen=True)
class RemoveUser(Message):
    """To a catalog (an admin's): the user gone, with their grants and memberships, their sessions and handles void."""

    ACTION = "user-remove"
    REPLY = AccessChanged
    name: str = _field(p_principal)


@dataclass(frozen=True)
class UserRow(Message):
    name: str = _field(p_principal)
    role: str = _field(p_str)
    groups: tuple[str, ...] = _field(p_list(p_principal), ())
    created: float = _field(p_number, 0.0)


@dataclass(frozen=True)
class UserList(Message):
    users: tuple[UserRow, ...] = _field(p_list(p_message(UserRow)))


@dataclass(frozen=True)
class ListUsers(Message):
    """To a catalog (an admin's): every user, their role and groups."""

    ACTION = "users"
    REPLY = UserList


@dataclass(frozen=True)
class SetMember(Message):
    """To a catalog (an admin's): ``user`` joins ``group`` (or leaves it, with ``member`` false)."""

    ACTION = "group-member"
    REPLY = AccessChanged
    group: str = _field(p_principal)
    user: str = _field(p_principal)
    member: bool = _field(p_bool, True)


@dataclass(frozen=True)
class GrantRow(Message):
    access: str = _field(_p_choice("read", "write"))
    pattern: str = _field(p_pattern)
    grantee: str = _field(p_principal)


@dataclass(frozen=True)
class GrantList(Message):
    grants: tuple[GrantRow, ...] = _field(p_list(p_message(GrantRow)))


@dataclass(frozen=True)
class SetGrant(Message):
    """To a catalog (an admin's): give ``access`` on the datasets ``pattern`` matches to ``grantee`` (a user or a
    group), or withdraw it (``granted`` false)."""

    ACTION = "grant"
    REPLY = AccessChanged
    access: str = _field(_p_choice("read", "write"))
    pattern: str = _field(p_pattern)
    grantee: str = _field(p_principal)
    granted: bool = _field(p_bool, True)


@dataclass(frozen=True)
class ListGrants(Message):
    """To a catalog (an admin's): every grant."""

    ACTION = "grants"
    REPLY = GrantList


@dataclass(frozen=True)
class RevokeSessions(Message):
    """To a catalog (an admin's): void a user's sessions and handles (``user``), or one token (``token``)."""

    ACTION = "revoke-sessions"
    REPLY = AccessChanged
    user: str | None = _field(p_optional(p_principal), None)
    token: str | None = _field(p_optional(p_str), None)


@dataclass(frozen=True)
class RevocationsTaken(Message):
    count: int = _field(p_uint)


@dataclass(frozen=True)
class Revocations(Message):
    """To a node, from its catalog: every withdrawal in force (the whole list, replacing the last)."""

    ACTION = "revocations"
    REPLY = RevocationsTaken
    entries: tuple[RevocationEntry, ...] = _field(p_list(p_message(RevocationEntry), 200_000))
    epoch: int | None = _field(p_optional(p_uint), None)
