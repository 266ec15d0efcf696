"""``?`` parameters bound as literals before a query is planned, so a parameterized query is planned (and pushed to
the nodes) as its literal twin is.

Each ``?`` is found by DuckDB's own tokenizer (never one inside a string, a quoted name or a comment) and replaced,
per row of the bound values, by ``CAST('<value as DuckDB writes it>' AS <its DuckDB type>)``: DuckDB reads its own
text of a value of a scalar type back as the same value, and the CAST keeps the type a bound value has. Values of
nested or enum types, numbered parameters (``$1``, ``?1``) and a count of ``?`` that differs from DuckDB's are left
to DuckDB's own binding (the query then runs over the scans).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

NOT_SPELLED = ("[", "STRUCT", "MAP", "UNION", "ENUM")
"""DuckDB type names whose values do not read back from their text alone: bound by DuckDB instead."""


def placeholders(query: str) -> list[int] | None:
    """Offsets of ``query``'s ``?`` placeholders, or None when it numbers its parameters (``$1``, ``?1``)."""
    import duckdb

    tokens = duckdb.tokenize(query)
    found = []
    for k, (start, kind) in enumerate(tokens):
        if kind != duckdb.token_type.operator:
            continue
        end = tokens[k + 1][0] if k + 1 < len(tokens) else len(query)
        text = query[start:end].rstrip()
        if text.startswith("$"):
            return None
        if text == "?":
            if end < len(query) and query[end].isdigit():
                return None
            found.append(start)
    return found


def bound_texts(con: Any, query: str, parameters: pa.Table, wanted: int) -> list[str] | None:
    """``query`` once per row of ``parameters``, each ``?`` replaced by its value as a typed literal; None when they
    cannot all be (see the module doc), or when ``parameters`` do not match the ``wanted`` placeholders (DuckDB's
    binding then says why)."""
    if parameters.num_columns != wanted or parameters.num_rows == 0:
        return None
    offsets = placeholders(query)
    if offsets is None or len(offsets) != wanted:
        return None
    literals = _literals(con, parameters)
    if literals is None:
        return None
    texts = []
    for row in literals:
        pieces, last = [], 0
        for offset, literal in zip(offsets, row):
            pieces += [query[last:offset], literal]
            last = offset + 1
        texts.append("".join(pieces) + query[last:])
    return texts


def _literals(con: Any, parameters: pa.Table) -> list[list[str]] | None:
    """Each row of ``parameters`` as DuckDB literals of their types, or None for a type not spelled by its text."""
    names = [f"p{k}" for k in range(parameters.num_columns)]
    values = parameters.rename_columns(names)
    relation = con.from_arrow(values)
    types = [str(t) for t in relation.types]
    if any(marker in t for t in types for marker in NOT_SPELLED):
        return None
    texts = relation.select(", ".join(f"CAST({n} AS VARCHAR)" for n in names)).fetchall()
    return [[_literal(text, kind) for text, kind in zip(row, types)] for row in texts]


def _literal(text: str | None, kind: str) -> str:
    """A value DuckDB wrote as ``text`` (None: NULL), as a literal of type ``kind``."""
    if text is None:
        return f"CAST(NULL AS {kind})"
    return "CAST('" + text.replace("'", "''") + f"' AS {kind})"
