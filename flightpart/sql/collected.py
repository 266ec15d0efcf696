"""Answers read from DuckDB: in counted batches, under the names and types DuckDB gives the query as written.

Each batch is counted before the next is read, so an answer past its limit stops
there. An answer made otherwise than by DuckDB running the written query is
conformed to the schema DuckDB gives it (:func:`as_duckdb_types_it`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from flightpart import frames
from flightpart.client.duckdb_source import shown_to_duckdb

ANSWER_BATCH_ROWS = 16_384
"""Rows of an answer read from DuckDB at a time, counted before the next are read."""

Count = Callable[[int], None]
"""Told of the bytes of each batch of an answer as DuckDB produces it; raises to stop the answer there."""

DUCKDB_ERRORS = (("INTERRUPT Error", "InterruptException"), ("Out of Memory Error", "OutOfMemoryException"),
                 ("INTERNAL Error", "InternalException"), ("FATAL Error", "FatalException"),
                 ("IO Error", "IOException"))
"""How DuckDB's message starts for the errors the gateway tells apart, and their classes: an error while an answer
streams reaches Python as Arrow's ``OSError``."""


def collected(relation: Any, count: Count | None) -> pa.Table:
    """``relation``'s rows, each batch counted before the next is read; DuckDB's errors as DuckDB raises them."""
    import duckdb

    reader = relation.to_arrow_reader(ANSWER_BATCH_ROWS)
    batches = []
    try:
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except (OSError, pa.ArrowException) as exc:
                text = str(exc)
                kind = next((name for prefix, name in DUCKDB_ERRORS if text.startswith(prefix)), "Error")
                raise getattr(duckdb, kind)(text) from None
            if count is not None:
                count(frames.size_of(batch))
            batches.append(batch)
    finally:
        reader.close()
    return pa.Table.from_batches(batches, schema=reader.schema)


def as_duckdb_types_it(con: Any, query: str, named: list[str], open_dataset: Callable[[str], Any],
                       scan: Callable[[Any], Any]) -> pa.Schema | None:
    """DuckDB's schema for ``query`` over empty tables of the datasets' schemas; None when DuckDB refuses it there (it
    then runs as written). ``scan``: what each dataset is registered as afterwards."""
    import duckdb

    try:
        empty = {name: shown_to_duckdb(open_dataset(name).schema).empty_table() for name in named}
    except pa.ArrowNotImplementedError:  # a type Arrow makes no empty column of (a union): run as written
        return None
    for name in named:
        con.register(name, empty[name])
    try:
        relation = con.sql(query)
        types = relation.limit(0).to_arrow_table().schema.types
    except duckdb.InterruptException:
        raise
    except duckdb.Error:
        return None
    finally:
        for name in named:  # whatever runs next on this connection reads the datasets themselves
            con.register(name, scan(open_dataset(name)))
    schema = pa.schema([pa.field(name, kind) for name, kind in zip(relation.columns, types)])  # names as DuckDB's own
    return schema.with_metadata({b"duckdb_types": "\x1f".join(str(t) for t in relation.types).encode()})


def register_as_duckdb_types_it(con: Any, name: str, answer: pa.Table, expected: pa.Schema) -> None:
    """``answer`` readable as ``name``, each column of the type DuckDB gave it (a HUGEINT sum, which Arrow carries as a
    decimal128(38, 0))."""
    import duckdb

    kinds = (expected.metadata or {}).get(b"duckdb_types", b"").decode().split("\x1f")
    con.register(f"{name} (arrow)", answer)
    if len(kinds) != answer.num_columns:
        con.register(name, answer)
        return
    columns = ", ".join(f'CAST(#{k + 1} AS {kind})' + f' AS "{c.replace(chr(34), chr(34) * 2)}"'
                        for k, (c, kind) in enumerate(zip(answer.column_names, kinds)))
    quoted = name.replace('"', '""')
    try:
        con.execute(f'CREATE OR REPLACE TEMP VIEW "{quoted}" AS SELECT {columns} FROM "{quoted} (arrow)"')
    except duckdb.Error:
        con.register(name, answer)  # a type DuckDB cannot name back (an ENUM): read as Arrow gives it


def conformed(answer: pa.Table, expected: pa.Schema) -> pa.Table:
    """``answer`` under the names and types DuckDB gives the written query (a rewritten query may print a column's name
    or a literal's type otherwise)."""
    if answer.num_columns != len(expected):
        return answer
    answer = answer.rename_columns(expected.names)
    try:
        return answer.cast(expected.remove_metadata())
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return answer
