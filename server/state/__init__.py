"""The catalog's durable state in SQLite (WAL) or PostgreSQL: nodes, datasets, versions, partitions.

- a version is published only when complete; numbers are never reused (the counter passes every number a node
  reports);
- a dropped or aborted version keeps a tombstone, so a node that was away deletes it; a version the catalog does
  not know is never deleted for that: a sealed one is rebuilt from its manifest, an unsealed one kept as pending;
- the cluster's identity is kept here, so nodes obey only their own catalog.
"""

from .composed import CatalogState

__all__ = ["CatalogState"]
