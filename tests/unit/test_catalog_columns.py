"""The check of a node's columns against the catalog's (flightpart.query.catalog_columns)."""

from __future__ import annotations

import pyarrow as pa

from flightpart.query.aggregates import Aggregate
from flightpart.query.catalog_columns import KNOWN_SELECTIONS, CatalogColumns
from flightpart.wire import ROW_NUMBER, PartInfo, Ticket, VersionInfo

CATALOG = pa.schema([pa.field("k", pa.int64(), nullable=False), ("s", pa.string()),
                     ("d", pa.dictionary(pa.int32(), pa.string()))], metadata={b"pandas": b"{}"})


def ticket(**kwargs) -> Ticket:
    return Ticket("ds", 1, (0, 0), **kwargs)


def test_the_catalogs_columns_pass_whatever_their_nullability_and_metadata():
    check = CatalogColumns(CATALOG)
    assert check.mislabelled(CATALOG, ticket()) is None
    assert check.mislabelled(pa.schema([("k", pa.int64()), ("s", pa.string()), ("d", CATALOG.field("d").type)]),
                             ticket()) is None
    assert check.mislabelled(pa.schema([("s", pa.string())]), ticket()) is None  # a column group of the dataset


def test_other_types_names_and_selections_are_named():
    check = CatalogColumns(CATALOG)
    assert check.mislabelled(pa.schema([("k", pa.int32()), ("s", pa.string())]), ticket()) == \
        "column 'k' as int32 where the catalog says int64"
    assert check.mislabelled(pa.schema([("d", pa.dictionary(pa.int8(), pa.string()))]), ticket()) == \
        "column 'd' as dictionary<values=string, indices=int8, ordered=0> where the catalog says " \
        "dictionary<values=string, indices=int32, ordered=0>"
    assert check.mislabelled(pa.schema([("kk", pa.int64())]), ticket()) == "a column 'kk' the dataset does not have"
    assert check.mislabelled(pa.schema([("s", pa.string()), ("k", pa.int64())]), ticket(columns=("k", "s"))) == \
        "columns ['s', 'k'] where ['k', 's'] were asked"
    # row numbers only where the ticket asked for them
    numbered = pa.schema([("k", pa.int64()), (ROW_NUMBER, pa.int64())])
    assert check.mislabelled(numbered, ticket(columns=("k",), row_numbers=True)) is None
    assert check.mislabelled(numbered, ticket()) == f"a column {ROW_NUMBER!r} the dataset does not have"
    assert check.mislabelled(pa.schema([("k", pa.int64()), (ROW_NUMBER, pa.int32())]),
                             ticket(columns=("k",), row_numbers=True)) == \
        f"column {ROW_NUMBER!r} as int32 where the catalog says int64"


def test_computed_answers_are_not_checked_and_many_selections_are_checked_alike():
    check = CatalogColumns(CATALOG)
    partial = pa.schema([("k_sum", pa.int64())])
    assert check.mislabelled(partial, ticket(aggregate=Aggregate((("k", "sum"),)))) is None
    names = [f"c{n}" for n in range(KNOWN_SELECTIONS + 8)]
    wide = CatalogColumns(pa.schema([(name, pa.int64()) for name in names]))
    for name in names:  # a selection of each column in turn
        assert wide.mislabelled(pa.schema([(name, pa.int64())]), ticket(columns=(name,))) is None
    assert wide.mislabelled(pa.schema([("c0", pa.int8())]), ticket(columns=("c0",))) == \
        "column 'c0' as int8 where the catalog says int64"


def test_a_whole_partition_brings_every_column_of_its_group_with_the_pandas_index():
    schema = pa.schema([("a", pa.int64()), ("b", pa.float64()), ("c", pa.string()), ("idx", pa.string())])
    parts = tuple(PartInfo((i, j), (3 * i, (0, 1)[j]), (3, (1, 2)[j]), ()) for i in range(2) for j in range(2))
    check = CatalogColumns.of(VersionInfo("ds", 1, schema, (6, 3), (2, 2), parts))
    assert check.groups == {0: frozenset({"a", "idx"}), 1: frozenset({"b", "c", "idx"})}
    group_1 = Ticket("ds", 1, (1, 1))
    assert check.mislabelled(pa.schema([("b", pa.float64()), ("c", pa.string()), ("idx", pa.string())]),
                             group_1) is None
    assert check.mislabelled(pa.schema([("b", pa.float64()), ("idx", pa.string())]), group_1) == \
        "without column 'c' of its column group (1 missing)"
    # a selection is checked as asked, not against its group
    assert check.mislabelled(pa.schema([("b", pa.float64())]), Ticket("ds", 1, (1, 1), columns=("b",))) is None


def test_the_check_travels_into_tasks_without_the_schemas_metadata_and_is_restored_once_per_process():
    """A ``get`` pickled into a Dask or Ray task carries the check: it finds the same lies there; a process restores
    each distinct one once (every task of a dataset shares it), and the pandas metadata is not sent."""
    import pickle

    check = CatalogColumns(CATALOG, {0: frozenset({"k", "s"}), 1: frozenset({"d"})})
    sent = pickle.dumps(check)
    there, again = pickle.loads(sent), pickle.loads(pickle.dumps(check))
    assert there is again and there.groups == check.groups and b"pandas" not in sent
    assert there.mislabelled(pa.schema([("k", pa.int32()), ("s", pa.string())]), ticket()) == \
        "column 'k' as int32 where the catalog says int64"
    assert there.mislabelled(pa.schema([("k", pa.int64())]), ticket()) == \
        "without column 's' of its column group (1 missing)"
    assert pickle.loads(pickle.dumps(CatalogColumns(CATALOG))).groups is None
