"""The Flight SQL messages the catalog reads and writes, by hand-written protobuf: round trips, and refusals of
what a lying client sends. The expected bytes are protobuf's own encoding (google.protobuf, no cluster)."""

from __future__ import annotations

import pytest
from google.protobuf import any_pb2

import flightpart as fp
from flightpart import sqlwire as proto


def test_a_statement_is_read_from_the_any_protobuf_itself_writes():
    body = proto.message((1, "SELECT 'é' FROM t"), (2, b"tx"))
    wrapped = any_pb2.Any(type_url=proto.PACKAGE + proto.STATEMENT_QUERY, value=body).SerializeToString()
    found = proto.unpack(wrapped)
    assert found == proto.Any_(proto.STATEMENT_QUERY, body)
    assert proto.text_field(found.value, 1, "query") == "SELECT 'é' FROM t"
    assert proto.bytes_field(found.value, 2, "transaction_id") == b"tx"


def test_what_the_catalog_writes_protobuf_reads():
    packed = proto.pack(proto.PREPARED_RESULT, proto.message((1, b"\x00" * 16), (2, b"schema")))
    parsed = any_pb2.Any()
    parsed.ParseFromString(packed)
    assert parsed.type_url.endswith("ActionCreatePreparedStatementResult") and b"schema" in parsed.value


def test_repeated_numbers_are_read_packed_or_not():
    packed = proto.message((1, bytes([0, 1, 0xF4, 0x03])))  # 0, 1, 500 packed
    loose = proto.message((1, 0), (1, 1), (1, 500))
    assert proto.uint_fields(packed, 1) == proto.uint_fields(loose, 1) == [0, 1, 500]


def test_a_plain_command_is_not_taken_for_flight_sql():
    assert proto.unpack(b'{"dataset": "x"}') is None
    assert proto.unpack(proto.message((1, "type.googleapis.com/other.Message"), (2, b""))) is None


@pytest.mark.parametrize("raw", [b"\x0a\x05ab", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", b"\x0b", b"\x0a"])
def test_malformed_messages_are_refused_naming_the_command(raw):
    with pytest.raises(fp.RequestRejected) as info:
        list(proto.fields(raw))
    assert info.value.code == "INVALID_REQUEST"


def test_a_query_that_is_not_text_is_refused():
    with pytest.raises(fp.RequestRejected, match="UTF-8"):
        proto.text_field(proto.message((1, b"\xff\xfe")), 1, "query")


def test_an_int32_field_reads_negative_values_however_they_were_written():
    """A negative int32 comes as ten bytes (protobuf's own writers) or five (one that truncates); the last one sent
    counts, as protobuf reads it."""
    assert proto.int32_field(proto.message((1, -5)), 1, "data_type") == -5
    assert len(proto.message((1, -5))) == 11
    five_bytes = bytes([0x08, 0xFB, 0xFF, 0xFF, 0xFF, 0x0F])  # -5 written as a uint32
    assert proto.int32_field(five_bytes, 1, "data_type") == -5
    assert proto.int32_field(proto.message((1, 4), (1, 93)), 1, "data_type") == 93
    assert proto.int32_field(proto.message((2, 4)), 1, "data_type") is None
    with pytest.raises(fp.RequestRejected, match="not an integer"):
        proto.int32_field(proto.message((1, "x")), 1, "data_type")
