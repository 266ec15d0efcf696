"""What ``GetSqlInfo`` answers: every id of arrow's ``format/FlightSql.proto`` ``SqlInfo``, each in its union child.

The catalog answers read-only queries through DuckDB, so each value is
what it does: no transactions, no DDL, no procedures, a forward-only and
read-only answer. What is a question of DuckDB's SQL (null ordering, the
keywords and functions, the extra characters of an unquoted name, the
casts) is asked of a DuckDB once per process, so the answer is that of the
DuckDB the catalog runs; the syntax flags were each checked against it by
a query the unit tests run. The function lists leave out the functions a
query may not call at the catalog (:mod:`.system_functions`).
"""

from __future__ import annotations

import functools
import re
import string
from typing import Any

import pyarrow as pa

from flightpart.version import __version__
from flightpart.wire import MAX_NAME_CHARACTERS

from .system_functions import SELF_PREFIXES, SETTING_READERS

STRING, BOOL, BIGINT, INT32, STRING_LIST, INT32_MAP = range(6)
"""The children of the answer's ``value`` union, in the proto's order."""

NULLS_SORTED_HIGH, NULLS_SORTED_LOW, NULLS_SORTED_AT_START, NULLS_SORTED_AT_END = range(4)
CASE_INSENSITIVE = 1
FULL_OUTER_JOINS = 2
TRANSACTION_NONE = 0
GRAMMAR_MINIMUM_AND_CORE = 0b11
ANSI92_ENTRY = 0b1
GROUP_BY_UNRELATED_AND_BEYOND_SELECT = 0b11
SUBQUERIES_ALL = 0b1111  # in comparisons, in EXISTS, in IN, in quantified comparisons
UNION_AND_UNION_ALL = 0b11
ISOLATION_NONE = 0b1  # bit SQL_TRANSACTION_NONE
RESULT_SET_FORWARD_ONLY = 0b10  # bit SQL_RESULT_SET_TYPE_FORWARD_ONLY
CONCURRENCY_READ_ONLY = 0b10  # bit SQL_RESULT_SET_CONCURRENCY_READ_ONLY

CONVERT_TYPES = ["BIGINT", "BLOB", "BOOLEAN", "VARCHAR", "DATE", "DECIMAL(18,3)", "DOUBLE", "INTEGER", "INTERVAL",
                 "INTERVAL", "BLOB", "VARCHAR", "DECIMAL(18,3)", "FLOAT", "SMALLINT", "TIME", "TIMESTAMP", "TINYINT",
                 "BLOB", "VARCHAR"]
"""SqlSupportsConvert's types, by ordinal, as DuckDB names them."""
SAMPLES = {"BLOB": "'\\x01'", "BOOLEAN": "true", "VARCHAR": "'1'", "DATE": "'2020-01-01'", "INTERVAL": "'1 day'",
           "TIME": "'01:00:00'", "TIMESTAMP": "'2020-01-01 01:00:00'"}
"""A value of each type, as text (a number for the others)."""
NUMERIC_TYPES = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
                           "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL", "BIGNUM"})
TEXT_OUT = frozenset({"VARCHAR", "BOOLEAN", "BIGINT", "INTEGER", "VARCHAR[]"})
"""What a string function gives (text, a test on text, a length or position, a split)."""
DATETIME_TYPE = re.compile(r"^(DATE|TIME|TIMESTAMP|INTERVAL)\b")
FUNCTION_NAME = re.compile(r"[a-z][a-z0-9_]*")


def values(max_statement: int, statement_timeout_ms: int) -> dict[int, tuple[int, Any]]:
    """Every id answered, as (union child, value). ``max_statement``: the characters a query may have;
    ``statement_timeout_ms``: how long a prepared statement's handle is kept unused."""
    duck = _duckdb_facts()
    none, false, true = (BIGINT, 0), (BOOL, False), (BOOL, True)
    return {
        0: (STRING, "flightpart"), 1: (STRING, __version__), 2: (STRING, pa.__version__),
        3: true, 4: true, 5: false, 6: (STRING, None), 7: (STRING, None),  # no Substrait: no version
        8: (INT32, TRANSACTION_NONE), 9: false, 10: true, 11: false,  # CancelQuery: not an action here; adbc_ingest
        100: (INT32, statement_timeout_ms), 101: (INT32, 0),
        500: false, 501: false, 502: false,
        503: (INT32, CASE_INSENSITIVE), 504: (STRING, '"'), 505: (INT32, CASE_INSENSITIVE), 506: true,
        507: (INT32, duck["null_ordering"]), 508: (STRING_LIST, duck["keywords"]),
        509: (STRING_LIST, duck["numeric"]), 510: (STRING_LIST, duck["string"]),
        511: (STRING_LIST, duck["system"]), 512: (STRING_LIST, duck["datetime"]),
        513: (STRING, ""), 514: (STRING, duck["extra_name_characters"]),  # GetTables' patterns have no escape
        515: true, 516: true, 517: (INT32_MAP, duck["convert"]), 518: true, 519: false, 520: true, 521: true,
        522: (INT32, GROUP_BY_UNRELATED_AND_BEYOND_SELECT), 523: true, 524: false,
        525: (INT32, GRAMMAR_MINIMUM_AND_CORE), 526: (INT32, ANSI92_ENTRY), 527: false,
        528: (INT32, FULL_OUTER_JOINS), 529: (STRING, "schema"), 530: (STRING, "procedure"),
        531: (STRING, ""), 532: false,  # no catalogs: GetCatalogs lists none
        533: (INT32, 0), 534: (INT32, 0), 535: (INT32, 0), 536: false, 537: false,
        538: (INT32, SUBQUERIES_ALL), 539: true, 540: (INT32, UNION_AND_UNION_ALL),
        **{i: none for i in range(541, 559)}, 556: false, 557: (BIGINT, max_statement),  # 0: no limit
        559: (BIGINT, MAX_NAME_CHARACTERS), 560: none, 561: none,
        562: (INT32, TRANSACTION_NONE), 563: false, 564: (INT32, ISOLATION_NONE), 565: false, 566: false,
        567: (INT32, RESULT_SET_FORWARD_ONLY), 568: (INT32, 0), 569: (INT32, CONCURRENCY_READ_ONLY),
        570: (INT32, 0), 571: (INT32, 0),
        572: false, 573: false, 574: false, 575: false, 576: false,
    }


@functools.cache
def _duckdb_facts() -> dict[str, Any]:
    """What DuckDB says of its SQL, asked once per process of a DuckDB of its own."""
    import duckdb

    with duckdb.connect(config={"enable_external_access": False}) as con:
        keywords = sorted({k.upper() for (k,) in con.execute("SELECT keyword_name FROM duckdb_keywords()").fetchall()})
        rows = con.execute("SELECT lower(function_name), return_type, parameter_types, varargs, categories "
                           "FROM duckdb_functions() WHERE function_type IN ('scalar', 'macro')").fetchall()
        return {"null_ordering": _null_ordering(con), "keywords": keywords, **_functions(rows),
                "extra_name_characters": "".join(c for c in string.punctuation if c != "_" and _name_character(con, c)),
                "convert": _casts(con)}


def _null_ordering(con: Any) -> int:
    """Where DuckDB sorts NULL by default, ascending and descending, as SqlNullOrdering names it."""
    sql = "SELECT x IS NULL FROM (VALUES (1), (NULL), (2)) t(x) ORDER BY x {}"
    first_asc, first_desc = (con.execute(sql.format(way)).fetchall()[0][0] for way in ("ASC", "DESC"))
    return {(True, True): NULLS_SORTED_AT_START, (False, False): NULLS_SORTED_AT_END,
            (False, True): NULLS_SORTED_HIGH, (True, False): NULLS_SORTED_LOW}[(first_asc, first_desc)]


def _name_character(con: Any, c: str) -> bool:
    """Whether ``c`` may stand inside an unquoted name in DuckDB."""
    try:
        return con.execute(f"SELECT 1 AS a{c}b").description[0][0] == f"a{c}b"
    except Exception:  # a syntax error: not a name's character
        return False


def _casts(con: Any) -> list[tuple[int, list[int]]]:
    """SqlSupportsConvert's map: for each type, the types DuckDB casts a value of it to (a value that does not
    convert is a value's question; a cast DuckDB does not have fails for any value, NULL aside)."""
    kinds = sorted(set(CONVERT_TYPES))
    casts = set()
    for source in kinds:
        for target in kinds:
            try:
                con.execute(f"SELECT CAST(x AS {target}) FROM (SELECT CAST({SAMPLES.get(source, '1')} AS {source}) x)")
            except Exception as e:
                if "Unimplemented type for cast" in str(e):
                    continue
            casts.add((source, target))
    return [(i, [j for j, target in enumerate(CONVERT_TYPES) if (source, target) in casts])
            for i, source in enumerate(CONVERT_TYPES)]


def _functions(rows: list[tuple[Any, ...]]) -> dict[str, list[str]]:
    """DuckDB's scalar functions a query may call here, by kind: datetime (a date, time or interval in or out),
    numeric (numbers in and out), string (text in first, text or a test, length or split of it out), system (no
    argument, describing the session)."""
    kinds: dict[str, set[str]] = {"numeric": set(), "string": set(), "system": set(), "datetime": set()}
    for name, returns, parameters, varargs, categories in rows:
        if not FUNCTION_NAME.fullmatch(name) or name in SETTING_READERS or name.startswith((*SELF_PREFIXES, "icu_")):
            continue
        types = [t for t in [returns, *(parameters or [])] if t]
        base = [(t or "ANY").split("(")[0] for t in parameters or []]
        if any(DATETIME_TYPE.match(t) for t in types) or {"date", "timestamp"} & set(categories or []):
            kinds["datetime"].add(name)
            continue
        returns_number = (returns or "").split("(")[0] in NUMERIC_TYPES
        if "numeric" in (categories or []) or (returns_number and (set(base) <= NUMERIC_TYPES) and
                                              (base or returns in ("DOUBLE", "FLOAT"))):
            kinds["numeric"].add(name)
        if "string" in (categories or []) or (base[:1] == ["VARCHAR"] and (returns or "").split("(")[0] in TEXT_OUT):
            kinds["string"].add(name)
        if not base and varargs is None and (returns is None or returns in ("VARCHAR", "UBIGINT")):
            kinds["system"].add(name)
    return {kind: sorted(n.upper() for n in names) for kind, names in kinds.items()}
