"""The datasets as SQL clients list them: ``GetCatalogs``, ``GetDbSchemas``, ``GetTableTypes``, ``GetTables``.

Every dataset is a ``TABLE`` in one schema of no name and no catalog, in the
layouts of arrow's ``format/FlightSql.proto``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from flightpart import sqlwire as proto
from flightpart.errors import RequestRejected

TABLE_TYPE = "TABLE"
MAX_PATTERN = 256
"""Characters a table name pattern may have."""


def catalogs() -> pa.Table:
    """``GetCatalogs``: none."""
    return pa.schema([pa.field("catalog_name", pa.utf8(), nullable=False)]).empty_table()


def db_schemas() -> pa.Table:
    """``GetDbSchemas``: one schema of no name, holding every dataset."""
    return pa.Table.from_arrays([pa.array([None], pa.utf8()), pa.array([""])], schema=pa.schema(
        [pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8(), nullable=False)]))


def table_types() -> pa.Table:
    """``GetTableTypes``: ``TABLE`` alone."""
    return pa.Table.from_arrays([pa.array([TABLE_TYPE])],
                                schema=pa.schema([pa.field("table_type", pa.utf8(), nullable=False)]))


def tables(gateway: Any, body: bytes, schema_only: bool) -> pa.Table:
    """``GetTables`` (``body``: the command's fields) over the datasets ``gateway`` lists (none when
    ``schema_only``)."""
    include_schema = any(n == 5 and v for n, v in proto.fields(body))
    pattern = proto.text_field(body, 3, "table_name_filter_pattern")
    if pattern is not None and len(pattern) > MAX_PATTERN:
        raise RequestRejected(f"table_name_filter_pattern: {len(pattern):,} characters, more than the {MAX_PATTERN} "
                              "a pattern may have", field="table_name_filter_pattern")
    types = _table_types(body)
    wanted = None if pattern is None else (lambda name: like(name, pattern))  # schemas asked of those only
    rows = [] if schema_only or (types and TABLE_TYPE not in types) else \
        gateway.tables(wanted=wanted, schemas=include_schema)
    if not rows and pattern is not None and not schema_only and "%" not in pattern:
        version = gateway.version_table(pattern)  # adbc_get_table_schema("sales@3"): a version asked by name
        rows = [version] if version is not None and (not types or TABLE_TYPE in types) else []
    columns: dict[str, pa.Array] = {
        "catalog_name": pa.array([None] * len(rows), pa.utf8()),
        "db_schema_name": pa.array([None] * len(rows), pa.utf8()),
        "table_name": pa.array([name for name, _ in rows], pa.utf8()),
        "table_type": pa.array([TABLE_TYPE] * len(rows), pa.utf8()),
    }
    if include_schema:
        columns["table_schema"] = pa.array([schema.serialize().to_pybytes() for _, schema in rows], pa.binary())
    fields = [pa.field(k, v.type, nullable=k in ("catalog_name", "db_schema_name")) for k, v in columns.items()]
    return pa.Table.from_arrays(list(columns.values()), schema=pa.schema(fields))


def _table_types(body: bytes) -> list[str]:
    """``CommandGetTables``' ``table_types`` (field 4, repeated), each UTF-8 text, else refused with a code."""
    types = []
    for n, value in proto.fields(body):
        if n != 4:
            continue
        if not isinstance(value, bytes):
            raise RequestRejected("Flight SQL: table_types holds a value that is not text", field="table_types")
        try:
            types.append(value.decode())
        except UnicodeDecodeError:
            raise RequestRejected(f"Flight SQL: table_types entry {value[:40]!r} is not UTF-8 text (e.g. 'TABLE')",
                                  field="table_types") from None
    return types


def like(name: str, pattern: str) -> bool:
    """SQL's LIKE as Flight SQL's patterns use it (``%`` any run, ``_`` one character), matched greedily with one point
    to return to (the last ``%``): at most len(name) x len(pattern) steps (decision 0034)."""
    n = p = 0
    star = -1  # where in the pattern the last % was, and the name's position it matched up to
    matched = 0
    while n < len(name):
        if p < len(pattern) and pattern[p] == "%":
            star, matched = p, n
            p += 1
        elif p < len(pattern) and (pattern[p] == "_" or pattern[p] == name[n]):
            n += 1
            p += 1
        elif star >= 0:
            matched += 1
            n, p = matched, star + 1
        else:
            return False
    return all(c == "%" for c in pattern[p:])
