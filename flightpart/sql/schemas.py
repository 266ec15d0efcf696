"""The schemas of prepared queries, kept per (query text, versions of the datasets it names).

Preparing a query tells the client its answer's schema, which the gateway
works out by planning the query without rows. A committed version never
changes and a dropped one's number is never used again, so a query's
schema over the same versions is the same: it is kept, and a client that
prepares the same query again (every ADBC execute prepares) is answered
without planning. Queries that list tables depend on every dataset and are
never kept; nor are texts over :data:`MAX_TEXT` characters. At most
:data:`KEPT` schemas are kept, the least recently used forgotten first.
"""

from __future__ import annotations

import pyarrow as pa

from flightpart.kept import Kept

KEPT = 512
MAX_TEXT = 16 << 10


class SchemaCache(Kept[pa.Schema]):
    """Schemas by key, the :data:`KEPT` most recently used."""

    def __init__(self, kept: int = KEPT):
        super().__init__(kept)
