"""What the catalog says of itself to SQL clients: ``GetSqlInfo`` and ``GetXdbcTypeInfo``."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from .sql_info import values

SQL_INFO_TYPE = pa.dense_union([
    pa.field("string_value", pa.utf8()), pa.field("bool_value", pa.bool_()), pa.field("bigint_value", pa.int64()),
    pa.field("int32_bitmask", pa.int32()), pa.field("string_list", pa.list_(pa.utf8())),
    pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.int32()))),
])


def sql_info(asked: list[int], max_statement: int = 0, statement_timeout_ms: int = 0) -> pa.Table:
    """``GetSqlInfo``: each id asked (every id when none is) that FlightSql.proto defines, in the union child it
    gives it (:mod:`.sql_info`); an unknown id is left out."""
    known = values(max_statement, statement_timeout_ms)
    ids = [k for k in dict.fromkeys(asked or sorted(known)) if k in known]  # each once: an id asked a million times
    # would make a small request a huge answer
    children: list[list[Any]] = [[] for _ in SQL_INFO_TYPE]
    type_ids, offsets = [], []
    for k in ids:
        child, value = known[k]
        type_ids.append(child)
        offsets.append(len(children[child]))
        children[child].append(value)
    value = pa.UnionArray.from_dense(pa.array(type_ids, pa.int8()), pa.array(offsets, pa.int32()),
                                     [pa.array(c, f.type) for c, f in zip(children, SQL_INFO_TYPE, strict=True)],
                                     [f.name for f in SQL_INFO_TYPE])
    schema = pa.schema([pa.field("info_name", pa.uint32(), nullable=False),
                        pa.field("value", value.type, nullable=False)])
    return pa.Table.from_arrays([pa.array(ids, pa.uint32()), value], schema=schema)


XDBC_TYPE_INFO = pa.schema([
    pa.field("type_name", pa.utf8(), nullable=False), pa.field("data_type", pa.int32(), nullable=False),
    pa.field("column_size", pa.int32()), pa.field("literal_prefix", pa.utf8()), pa.field("literal_suffix", pa.utf8()),
    pa.field("create_params", pa.list_(pa.field("item", pa.utf8(), nullable=False))),
    pa.field("nullable", pa.int32(), nullable=False), pa.field("case_sensitive", pa.bool_(), nullable=False),
    pa.field("searchable", pa.int32(), nullable=False), pa.field("unsigned_attribute", pa.bool_()),
    pa.field("fixed_prec_scale", pa.bool_(), nullable=False), pa.field("auto_increment", pa.bool_()),
    pa.field("local_type_name", pa.utf8()), pa.field("minimum_scale", pa.int32()),
    pa.field("maximum_scale", pa.int32()),
    pa.field("sql_data_type", pa.int32(), nullable=False), pa.field("datetime_subcode", pa.int32()),
    pa.field("num_prec_radix", pa.int32()), pa.field("interval_precision", pa.int32()),
])
"""``GetXdbcTypeInfo``'s columns, as FlightSql.proto lists them."""

NULLABLE, SEARCHABLE_BASIC, SEARCHABLE_FULL = 1, 2, 3
XDBC_DATETIME, SUBCODE_DATE, SUBCODE_TIME, SUBCODE_TIMESTAMP, SUBCODE_TIMESTAMP_WITH_TIMEZONE = 9, 1, 2, 3, 5

# (name, data_type, column_size, literal prefix, suffix, create params, searchable, unsigned, fixed precision and
# scale, minimum and maximum scale, sql_data_type, datetime subcode, radix)
_TYPES = [
    ("BIGINT", -5, 19, None, None, None, SEARCHABLE_BASIC, False, True, 0, 0, -5, None, 10),
    ("BLOB", -3, None, "'", "'::BLOB", None, SEARCHABLE_BASIC, None, False, None, None, -3, None, None),
    ("BOOLEAN", -7, 1, None, None, None, SEARCHABLE_BASIC, None, False, None, None, -7, None, None),
    ("TINYINT", -6, 3, None, None, None, SEARCHABLE_BASIC, False, True, 0, 0, -6, None, 10),
    ("DECIMAL", 3, 38, None, None, ["precision", "scale"], SEARCHABLE_BASIC, False, True, 0, 38, 3, None, 10),
    ("INTEGER", 4, 10, None, None, None, SEARCHABLE_BASIC, False, True, 0, 0, 4, None, 10),
    ("SMALLINT", 5, 5, None, None, None, SEARCHABLE_BASIC, False, True, 0, 0, 5, None, 10),
    ("FLOAT", 7, 24, None, None, None, SEARCHABLE_BASIC, False, False, None, None, 7, None, 2),  # 4 bytes: REAL
    ("DOUBLE", 8, 53, None, None, None, SEARCHABLE_BASIC, False, False, None, None, 8, None, 2),
    ("VARCHAR", 12, None, "'", "'", None, SEARCHABLE_FULL, None, False, None, None, 12, None, None),
    ("DATE", 91, 10, "DATE '", "'", None, SEARCHABLE_BASIC, None, False, None, None, XDBC_DATETIME, SUBCODE_DATE, None),
    ("TIME", 92, 15, "TIME '", "'", None, SEARCHABLE_BASIC, None, False, 0, 6, XDBC_DATETIME, SUBCODE_TIME, None),
    ("TIMESTAMP", 93, 26, "TIMESTAMP '", "'", None, SEARCHABLE_BASIC, None, False, 0, 6, XDBC_DATETIME,
     SUBCODE_TIMESTAMP, None),
    ("TIMESTAMP WITH TIME ZONE", 93, 32, "TIMESTAMPTZ '", "'", None, SEARCHABLE_BASIC, None, False, 0, 6,
     XDBC_DATETIME, SUBCODE_TIMESTAMP_WITH_TIMEZONE, None),
    ("INTERVAL", 10, None, "INTERVAL '", "'", None, SEARCHABLE_BASIC, None, False, None, None, 10, None, None),
    ("UBIGINT", -5, 20, None, None, None, SEARCHABLE_BASIC, True, True, 0, 0, -5, None, 10),
    ("UTINYINT", -6, 3, None, None, None, SEARCHABLE_BASIC, True, True, 0, 0, -6, None, 10),
    ("UINTEGER", 4, 10, None, None, None, SEARCHABLE_BASIC, True, True, 0, 0, 4, None, 10),
    ("USMALLINT", 5, 5, None, None, None, SEARCHABLE_BASIC, True, True, 0, 0, 5, None, 10),
]


def xdbc_type_info(data_type: int | None) -> pa.Table:
    """``GetXdbcTypeInfo``: the SQL types answers come in (only ``data_type``'s when given), ordered by data type
    and name as the protocol asks."""
    rows = sorted((t for t in _TYPES if data_type is None or t[1] == data_type), key=lambda t: (t[1], t[0]))
    column = {name: [] for name in XDBC_TYPE_INFO.names}
    for (name, code, size, prefix, suffix, params, searchable, unsigned, fixed, low, high, sql_type, subcode,
         radix) in rows:
        for key, value in (("type_name", name), ("data_type", code), ("column_size", size), ("literal_prefix", prefix),
                           ("literal_suffix", suffix), ("create_params", params), ("nullable", NULLABLE),
                           ("case_sensitive", name == "VARCHAR"), ("searchable", searchable),
                           ("unsigned_attribute", unsigned), ("fixed_prec_scale", fixed), ("auto_increment", None),
                           ("local_type_name", name), ("minimum_scale", low), ("maximum_scale", high),
                           ("sql_data_type", sql_type), ("datetime_subcode", subcode), ("num_prec_radix", radix),
                           ("interval_precision", None)):
            column[key].append(value)
    return pa.Table.from_pydict(column, schema=XDBC_TYPE_INFO)
