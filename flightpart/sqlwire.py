"""The few Flight SQL protobuf messages the gateway speaks, encoded and decoded by hand.

Flight SQL puts protobuf messages (arrow's ``format/FlightSql.proto``,
package ``arrow.flight.protocol.sql``) inside ``google.protobuf.Any`` in a
descriptor's command, a ticket or an action's body. Only scalar, string,
bytes and repeated fields occur in the messages used here, so the protobuf
wire format (varints and length-delimited fields) is written out below
rather than generated: every byte received is checked, and anything
malformed is refused with INVALID_REQUEST naming what was wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .errors import RequestRejected

PACKAGE = "type.googleapis.com/arrow.flight.protocol.sql."
MAX_MESSAGE = 16 << 20
MAX_NAME = 64
"""Characters of a message's name (the type URL past :data:`PACKAGE`) kept: Flight SQL's longest has 40; a
longer one, cut with an ellipsis, is none of them, and an error naming it quotes that much."""

# message names (the part of the type URL after the package) and their field numbers
STATEMENT_QUERY = "CommandStatementQuery"  # 1: query (string), 2: transaction_id (bytes)
PREPARED_QUERY = "CommandPreparedStatementQuery"  # 1: prepared_statement_handle (bytes)
TICKET_STATEMENT = "TicketStatementQuery"  # 1: statement_handle (bytes)
GET_CATALOGS = "CommandGetCatalogs"
GET_DB_SCHEMAS = "CommandGetDbSchemas"  # 1: catalog, 2: db_schema_filter_pattern
GET_TABLES = "CommandGetTables"  # 1: catalog, 2: db_schema pattern, 3: table pattern, 4: table_types, 5: include_schema
GET_TABLE_TYPES = "CommandGetTableTypes"
GET_SQL_INFO = "CommandGetSqlInfo"  # 1: info (repeated uint32)
GET_XDBC_TYPE_INFO = "CommandGetXdbcTypeInfo"  # 1: data_type (optional int32)
CREATE_PREPARED = "ActionCreatePreparedStatementRequest"  # 1: query, 2: transaction_id
PREPARED_RESULT = "ActionCreatePreparedStatementResult"  # 1: handle, 2: dataset_schema, 3: parameter_schema
CLOSE_PREPARED = "ActionClosePreparedStatementRequest"  # 1: prepared_statement_handle
INGEST = "CommandStatementIngest"  # 1: TableDefinitionOptions {1: if_not_exist, 2: if_exists}, 2: table, 3: schema,
# 4: catalog, 5: temporary, 6: transaction_id; answered with a DoPutUpdateResult {1: record_count}
IF_NOT_EXIST = {1: "create", 2: "fail"}
IF_EXISTS = {1: "fail", 2: "append", 3: "replace"}


@dataclass(frozen=True)
class Any_:
    """A ``google.protobuf.Any``: which Flight SQL message (its short name), and its bytes."""

    name: str
    value: bytes


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(raw: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(raw) or shift > 63:
            raise RequestRejected("Flight SQL: a truncated or overlong varint", field="command")
        byte = raw[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def fields(raw: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field of a message: an int for varints, bytes for length-delimited ones."""
    if len(raw) > MAX_MESSAGE:
        raise RequestRejected(f"Flight SQL: a message of {len(raw)} bytes is more than allowed", field="command")
    at = 0
    while at < len(raw):
        key, at = _read_varint(raw, at)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, at = _read_varint(raw, at)
            yield number, value
        elif kind == 2:
            size, at = _read_varint(raw, at)
            if at + size > len(raw):
                raise RequestRejected("Flight SQL: a field runs past the end of its message", field="command")
            yield number, raw[at:at + size]
            at += size
        elif kind == 5:
            at += 4
        elif kind == 1:
            at += 8
        else:
            raise RequestRejected(f"Flight SQL: wire type {kind} is not one these messages use", field="command")
    if at != len(raw):
        raise RequestRejected("Flight SQL: a field runs past the end of its message", field="command")


def message(*pairs: tuple[int, int | str | bytes | bool | None]) -> bytes:
    """A message from (field number, value) pairs; None values are left out, as proto3 leaves out defaults."""
    out = bytearray()
    for number, value in pairs:
        if value is None:
            continue
        if isinstance(value, bool) or isinstance(value, int):
            out += _varint(number << 3) + _varint(int(value) & (1 << 64) - 1)  # a negative int as protobuf sends it
        else:
            data = value.encode() if isinstance(value, str) else value
            out += _varint(number << 3 | 2) + _varint(len(data)) + data
    return bytes(out)


def pack(name: str, body: bytes) -> bytes:
    """``body`` (a message named ``name``) wrapped in an Any."""
    return message((1, PACKAGE + name), (2, body))


def unpack(raw: bytes) -> Any_ | None:
    """The Flight SQL message an Any holds, or None when ``raw`` is not one (a plain flightpart command)."""
    try:
        found = dict(fields(raw))
    except RequestRejected:
        return None
    url, value = found.get(1), found.get(2, b"")
    if not isinstance(url, bytes) or not isinstance(value, bytes):
        return None
    try:
        text = url.decode()
    except UnicodeDecodeError:
        return None
    if not text.startswith(PACKAGE):
        return None
    name = text[len(PACKAGE):]
    return Any_(name if len(name) <= MAX_NAME else name[:MAX_NAME] + "…", value)


def text_field(body: bytes, number: int, what: str) -> str | None:
    """Field ``number`` of ``body`` as UTF-8 text (None when absent)."""
    for n, value in fields(body):
        if n == number:
            if not isinstance(value, bytes):
                raise RequestRejected(f"Flight SQL: {what} is not text", field=what)
            try:
                return value.decode()
            except UnicodeDecodeError:
                raise RequestRejected(f"Flight SQL: {what} is not UTF-8", field=what) from None
    return None


def bytes_field(body: bytes, number: int, what: str) -> bytes | None:
    for n, value in fields(body):
        if n == number:
            if not isinstance(value, bytes):
                raise RequestRejected(f"Flight SQL: {what} is not bytes", field=what)
            return value
    return None


def int32_field(body: bytes, number: int, what: str) -> int | None:
    """Field ``number`` of ``body`` as an int32, the last one sent as protobuf takes it (a negative value comes as
    ten bytes of two's complement, or five from a writer that truncates)."""
    found = None
    for n, value in fields(body):
        if n == number:
            if not isinstance(value, int):
                raise RequestRejected(f"Flight SQL: {what} is not an integer", field=what)
            found = value
    if found is None:
        return None
    found &= (1 << 32) - 1
    return found - (1 << 32) if found >= 1 << 31 else found


def uint_fields(body: bytes, number: int) -> list[int]:
    """A repeated uint32 field, packed or not."""
    out: list[int] = []
    for n, value in fields(body):
        if n != number:
            continue
        if isinstance(value, int):
            out.append(value)
        else:
            at = 0
            while at < len(value):
                item, at = _read_varint(value, at)
                out.append(item)
    return out
