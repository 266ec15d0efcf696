"""Whether the columns a node sent are the ones the catalog says its dataset has.

A node that lies (a faulty or hostile one) can send sound arrays under other
names or of other types than its partition was stored with: an int64 column
sent as int32, a column renamed. A reader that took them handed its user a
frame of another schema than the dataset's without a word (every partition
from that node), or failed to assemble several with Arrow's own error, no
other replica asked. A reader now checks what it received against the
catalog's schema (:meth:`CatalogColumns.mislabelled`) and passes a replica
that mislabels its columns over, as it does one whose arrays are unsound.

Names and types are checked; nullability and metadata are not (they change
no value a reader computes on).
"""

from __future__ import annotations

import pyarrow as pa

from flightpart.wire import ROW_NUMBER, Ticket

KNOWN_SELECTIONS = 64
"""Distinct column selections whose expected schema is remembered (a dataset is read with a few at most)."""

_ROW_NUMBER_FIELD = pa.field(ROW_NUMBER, pa.int64())


class CatalogColumns:
    """The columns of one dataset version as its catalog describes them, and the check of what a node sent."""

    __slots__ = ("schema", "_expected")

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self._expected: dict[tuple, pa.Schema] = {}  # (names sent, row numbers asked) -> the catalog's fields of them

    def mislabelled(self, received: pa.Schema, ticket: Ticket) -> str | None:
        """Why the columns of ``received`` (a node's answer to ``ticket``) are not the catalog's, or None.

        An aggregate or first-rows answer is not checked (its columns are computed, not stored). A selection
        (``ticket.columns``) must come back as asked, in order; every column must be one of the dataset's, of
        its type (or the row numbers the ticket asked for)."""
        if ticket.aggregate is not None or ticket.top is not None:
            return None
        names = tuple(received.names)
        if ticket.columns is not None:
            asked = tuple(ticket.columns) + ((ROW_NUMBER,) if ticket.row_numbers else ())
            if names != asked:
                return f"columns {list(names[:8])} where {list(asked[:8])} were asked"
        numbered = bool(ticket.row_numbers)
        expected = self._expected.get((names, numbered))
        if expected is None:
            fields = []
            for name in names:
                k = -2 if numbered and name == ROW_NUMBER else self.schema.get_field_index(name)
                if k == -1:
                    return f"a column {name[:60]!r} the dataset does not have"
                fields.append(_ROW_NUMBER_FIELD if k == -2 else self.schema.field(k))
            expected = pa.schema(fields)
            if len(self._expected) >= KNOWN_SELECTIONS:
                self._expected.clear()
            self._expected[(names, numbered)] = expected
        if received.equals(expected):
            return None
        for got, want in zip(received, expected):
            if not got.type.equals(want.type):
                return f"column {got.name[:60]!r} as {str(got.type)[:80]} where the catalog says {str(want.type)[:80]}"
        return None  # only nullability or metadata differ
