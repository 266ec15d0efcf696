"""The catalog's durable state in SQLite (WAL) or PostgreSQL: nodes, datasets, versions, partitions.

Kept apart from the Flight server so the rules are plain functions over a
database that a test can drive directly:

- a version is published only when complete, and versions are never reused
  (the counter also moves past every version number a node reports);
- a dropped or aborted version keeps a tombstone, so a node that was away is
  told to delete it; a version the catalog does not know is never a reason
  to delete anything: a sealed one is rebuilt from its manifest, an unsealed
  one is recorded as pending and expires by the pending TTL;
- the cluster's identity is kept here, so nodes obey only their own catalog.

Modules: :mod:`.records` (what the state hands out), :mod:`.database` (SQLite or PostgreSQL), :mod:`.tables` (the
schema and the statements node and version state share), :mod:`.core` (opening, identity, transactions, the
memory of reads), :mod:`.nodes`, :mod:`.versions`, and :mod:`.composed` (:class:`CatalogState`, the whole).
"""

from .composed import CatalogState

__all__ = ["CatalogState"]
