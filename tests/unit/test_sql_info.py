"""GetSqlInfo: every id of arrow's FlightSql.proto ``SqlInfo`` answered in the union child the proto gives it, and
the values that are questions of DuckDB's SQL checked by asking DuckDB."""

from __future__ import annotations

import duckdb
import pytest

from flightpart.sql.metadata import sql_info
from flightpart.sql.system_functions import SELF_PREFIXES, SETTING_READERS

# Each id of format/FlightSql.proto's SqlInfo, by the type its comment gives it.
PROTO_TYPES = {
    "string_value": [0, 1, 2, 6, 7, 504, 513, 514, 529, 530, 531],
    "bool_value": [3, 4, 5, 9, 10, 11, 500, 501, 502, 506, 515, 516, 518, 519, 520, 521, 523, 524, 527, 532, 536,
                   537, 539, 556, 563, 565, 566, 572, 573, 574, 575, 576],
    "bigint_value": [*range(541, 556), *range(557, 562)],
    "int32_bitmask": [8, 100, 101, 503, 505, 507, 522, 525, 526, 528, 533, 534, 535, 538, 540, 562, 564,
                      *range(567, 572)],
    "string_list": [508, 509, 510, 511, 512],
    "int32_to_int32_list_map": [517],
}
CHILD = {i: child for child, ids in PROTO_TYPES.items() for i in ids}

# Each flag answered true, with a query DuckDB runs only if it holds; each answered false for lack of syntax, with
# a query DuckDB refuses.
SYNTAX = {
    515: (True, "SELECT 1 AS a"),  # column aliasing
    516: (True, "SELECT 'a' || NULL IS NULL"),  # a concatenation with NULL is NULL
    518: (True, "SELECT t.x FROM (VALUES (1)) AS t(x)"),  # table correlation names
    519: (False, "WITH t AS (SELECT 1 AS x) SELECT t.x FROM t AS t"),  # not restricted to differ from the table's
    520: (True, "SELECT x FROM (VALUES (1), (2)) t(x) ORDER BY x * -1"),  # expressions in ORDER BY
    521: (True, "SELECT x FROM (VALUES (1, 2), (2, 1)) t(x, y) ORDER BY y"),  # ORDER BY a column not selected
    523: (True, "SELECT 'a_b' LIKE 'a!_b' ESCAPE '!'"),
    536: (False, "SELECT 1 FOR UPDATE"),
    539: (True, "SELECT (SELECT max(y) FROM (VALUES (1), (2)) u(y) WHERE y <= t.x) FROM (VALUES (1)) t(x)"),
    576: (False, "SELECT {fn abs(-1)}"),
}
BITMASKS = {
    522: [(0, "SELECT sum(x) FROM (VALUES (1, 2)) t(x, y) GROUP BY y"),  # GROUP BY unrelated to the select list
          (1, "SELECT x, sum(y) FROM (VALUES (1, 2)) t(x, y) GROUP BY x, y")],  # GROUP BY beyond it
    538: [(0, "SELECT 1 WHERE 1 = (SELECT 1)"), (1, "SELECT 1 WHERE EXISTS (SELECT 1)"),
          (2, "SELECT 1 WHERE 1 IN (SELECT 1)"), (3, "SELECT 1 WHERE 1 = ANY (SELECT 1)")],
    540: [(0, "SELECT 1 UNION SELECT 1"), (1, "SELECT 1 UNION ALL SELECT 1")],
}


@pytest.fixture(scope="module")
def answered() -> dict[int, tuple[str, object]]:
    table = sql_info([])
    values = table.column("value").combine_chunks()
    return {i: (values.type[values.type_codes[k].as_py()].name, values[k].as_py())
            for k, i in enumerate(table.column("info_name").to_pylist())}


@pytest.fixture(scope="module")
def con():
    with duckdb.connect(config={"enable_external_access": False}) as con:
        yield con


def runs(con, query: str) -> bool:
    try:
        con.execute(query).fetchall()
        return True
    except duckdb.Error:
        return False


@pytest.mark.parametrize("info_id", sorted(CHILD))
def test_every_id_is_answered_in_the_union_child_the_proto_gives_it(answered, info_id):
    assert info_id in answered, f"SqlInfo {info_id} is not answered"
    assert answered[info_id][0] == CHILD[info_id]


def test_nothing_but_the_proto_ids_is_answered_and_an_id_asked_twice_once(answered):
    assert sorted(answered) == sorted(CHILD)
    assert sql_info([504, 504, 508, 99_999]).column("info_name").to_pylist() == [504, 508]


@pytest.mark.parametrize("info_id", sorted(SYNTAX))
def test_each_syntax_flag_is_what_duckdb_runs(answered, con, info_id):
    flag, query = SYNTAX[info_id]
    assert answered[info_id][1] is flag
    assert runs(con, query) is (flag if info_id != 519 else True)  # 519: a name may equal its table's


@pytest.mark.parametrize("info_id", sorted(BITMASKS))
def test_each_bitmask_holds_the_bits_duckdb_runs(answered, con, info_id):
    mask = answered[info_id][1]
    assert [bool(mask & (1 << bit)) for bit, _ in BITMASKS[info_id]] == [runs(con, q) for _, q in BITMASKS[info_id]]


def test_names_keywords_and_null_ordering_are_duckdbs(answered, con):
    assert answered[504][1] == '"' and con.execute('SELECT "a b" FROM (SELECT 1 AS "A B")').fetchall() == [(1,)]
    assert answered[503][1] == answered[505][1] == 1  # case insensitive, quoted or not, as the query above shows
    keywords = {k.upper() for (k,) in con.execute("SELECT keyword_name FROM duckdb_keywords()").fetchall()}
    assert "SELECT" in answered[508][1] and set(answered[508][1]) == keywords
    first = [con.execute(f"SELECT x IS NULL FROM (VALUES (1), (NULL)) t(x) ORDER BY x {way}").fetchall()[0][0]
             for way in ("ASC", "DESC")]
    assert first == [False, False] and answered[507][1] == 3  # SQL_NULLS_SORTED_AT_END
    for c in answered[514][1]:
        assert con.execute(f"SELECT 1 AS a{c}b").description[0][0] == f"a{c}b"


def test_function_lists_name_duckdbs_functions_a_query_may_call(answered, con):
    functions = {n.upper() for (n,) in con.execute("SELECT function_name FROM duckdb_functions()").fetchall()}
    for info_id, must in ((509, "ABS"), (510, "UPPER"), (511, "CURRENT_USER"), (512, "DATE_TRUNC")):
        listed = answered[info_id][1]
        assert must in listed and set(listed) <= functions
        assert not any(n.lower() in SETTING_READERS or n.lower().startswith(SELF_PREFIXES) for n in listed)


def test_limits_and_what_a_read_only_catalog_does_not_do(answered):
    from flightpart.sql.server import MAX_QUERY_CHARACTERS

    assert sql_info([557], MAX_QUERY_CHARACTERS).column("value").to_pylist() == [MAX_QUERY_CHARACTERS]
    assert sql_info([100], 0, 900_000).column("value").to_pylist() == [900_000]
    assert answered[3][1] is True and answered[563][1] is False and answered[8][1] == 0  # read only, no transactions
    assert not any(answered[i][1] for i in (500, 501, 502, 536, 537, 572, 573))
    assert answered[562][1] == 0  # SQL_TRANSACTION_NONE
    casts = dict(answered[517][1])
    assert 19 in casts[0] and 7 not in casts[4]  # BIGINT -> VARCHAR, and no DATE -> INTEGER, as DuckDB casts
