"""Whether the columns a node sent are the ones the catalog says its dataset has.

A faulty node can send sound arrays under other names or types than its partition was stored with; a reader
checks what it received against the catalog's schema (:meth:`CatalogColumns.mislabelled`) and passes such a
replica over, as it does one whose arrays are unsound. Names and types are checked, and a whole column group
must come whole; nullability and metadata are not (they change no value). The check pickles into Dask and Ray
tasks as the schema's IPC bytes and the groups, restored once per process.
"""

from __future__ import annotations

import functools

import pyarrow as pa

from flightpart.wire import ROW_NUMBER, Ticket, VersionInfo

KNOWN_SELECTIONS = 64
"""Distinct column selections whose expected schema is remembered (a dataset is read with a few at most)."""

_ROW_NUMBER_FIELD = pa.field(ROW_NUMBER, pa.int64())


class CatalogColumns:
    """The columns of one dataset version as its catalog describes them, and the check of what a node sent."""

    __slots__ = ("schema", "groups", "_expected", "_pickled")

    def __init__(self, schema: pa.Schema, groups: dict[int, frozenset[str]] | None = None):
        self.schema = schema
        self.groups = groups  # column group -> the columns a whole partition of it holds (None: not known)
        self._expected: dict[tuple, pa.Schema] = {}  # (names sent, row numbers asked, group) -> the catalog's fields
        self._pickled: tuple | None = None

    def __reduce__(self):
        """What a task is sent, made once: the fields (without the schema's metadata) and the groups."""
        if self._pickled is None:
            groups = None if self.groups is None else tuple(sorted((j, tuple(sorted(c)))
                                                                   for j, c in self.groups.items()))
            self._pickled = (self.schema.remove_metadata().serialize().to_pybytes(), groups)
        return (restored_columns, self._pickled)

    @classmethod
    def of(cls, version: VersionInfo) -> CatalogColumns:
        """The columns of ``version``: its schema, and each column group's columns (with the pandas index columns every
        group stores), read from the first partition of each group."""
        names = version.schema.names
        index = names[version.shape[1]:]
        groups: dict[int, frozenset[str]] = {}
        for part in version.parts:
            j = part.position[1]
            if j not in groups:
                groups[j] = frozenset((*names[part.start[1]:part.start[1] + part.shape[1]], *index))
                if len(groups) == version.grid[1]:
                    break
        return cls(version.schema, groups)

    def mislabelled(self, received: pa.Schema, ticket: Ticket) -> str | None:
        """Why the columns of ``received`` (a node's answer to ``ticket``) are not the catalog's, or None.

        Aggregates and first rows are not checked (their columns are computed). A selection must come back as asked,
        in order; a whole partition with every column of its group; each column of the dataset's type (or the row
        numbers the ticket asked for).
        """
        if ticket.aggregate is not None or ticket.top is not None:
            return None
        names = tuple(received.names)
        if ticket.columns is not None:
            asked = tuple(ticket.columns) + ((ROW_NUMBER,) if ticket.row_numbers else ())
            if names != asked:
                return f"columns {list(names[:8])} where {list(asked[:8])} were asked"
        numbered = bool(ticket.row_numbers)
        group = ticket.part[1] if ticket.columns is None and self.groups is not None else None
        expected = self._expected.get((names, numbered, group))
        if expected is None:
            fields = []
            for name in names:
                k = -2 if numbered and name == ROW_NUMBER else self.schema.get_field_index(name)
                if k == -1:
                    return f"a column {name[:60]!r} the dataset does not have"
                fields.append(_ROW_NUMBER_FIELD if k == -2 else self.schema.field(k))
            missing = sorted((self.groups or {}).get(group, frozenset()) - set(names)) if group is not None else []
            if missing:
                return f"without column {missing[0][:60]!r} of its column group ({len(missing)} missing)"
            expected = pa.schema(fields)
            if len(self._expected) >= KNOWN_SELECTIONS:
                self._expected.clear()
            self._expected[(names, numbered, group)] = expected
        if received.equals(expected):
            return None
        for got, want in zip(received, expected):
            if not got.type.equals(want.type):
                return f"column {got.name[:60]!r} as {str(got.type)[:80]} where the catalog says {str(want.type)[:80]}"
        return None  # only nullability or metadata differ


@functools.lru_cache(maxsize=16)
def restored_columns(schema_ipc: bytes, groups: tuple[tuple[int, tuple[str, ...]], ...] | None) -> CatalogColumns:
    """A pickled :class:`CatalogColumns`, restored once per process."""
    schema = pa.ipc.read_schema(pa.py_buffer(schema_ipc))
    return CatalogColumns(schema, None if groups is None else {j: frozenset(c) for j, c in groups})
