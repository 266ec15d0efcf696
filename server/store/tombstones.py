"""What a node remembers of versions that are gone: tombstones of dropped and aborted versions.

A tombstone is durable before any file of its version goes, so the version never takes a file again and every
replica tells readers alike why it serves none; a catalog that lost its state learns the numbers from them.
"""

from __future__ import annotations

import dataclasses

from flightpart.errors import DatasetNotFound, RequestRejected, VersionExpired
from flightpart.io import layout
from flightpart.wire import Tombstones

from .paths import StorePaths


class StoreTombstones(StorePaths):
    """Tombstones: read, written (:meth:`bury`), and the refusal of a version that is gone."""

    def tombstones(self, dataset: str) -> Tombstones:
        """What this node remembers of ``dataset``'s versions that are gone (nothing if unreadable)."""
        try:
            return Tombstones.decode((self.root / layout.tombstones_relpath(dataset)).read_bytes(), "tombstones")
        except (OSError, RequestRejected):
            return Tombstones(dataset)

    def all_tombstones(self) -> list[Tombstones]:
        """The tombstones of every dataset, for a registration."""
        datasets = self.root / layout.DATASETS
        names = (sorted(d.name for d in datasets.iterdir() if (d / layout.TOMBSTONES).exists())
                 if datasets.exists() else [])
        return [self.tombstones(name) for name in names]

    def gone(self, dataset: str, version: int) -> str | None:
        """``"dropped"`` or ``"aborted"`` when ``version`` of ``dataset`` is gone for good here, else None."""
        known = self.tombstones(dataset)
        if version <= known.dropped_through or version in known.dropped:
            return "dropped"
        return "aborted" if version in known.aborted else None

    def bury(self, dataset: str, version: int | None, kind: str, through: int | None = None) -> None:
        """Remember, durably before any file goes, that ``version`` (None: every one up to ``through``) is gone."""
        with self.lock:
            known = self.tombstones(dataset)
            if version is None:
                known = dataclasses.replace(known, dropped_through=max(known.dropped_through, through or 0))
            elif kind == "dropped" and version not in known.dropped and version > known.dropped_through:
                known = dataclasses.replace(known, dropped=(*known.dropped, version))
            elif kind == "aborted" and version not in known.aborted:
                known = dataclasses.replace(known, aborted=(*known.aborted, version))
            else:
                return
            path = self.root / layout.tombstones_relpath(dataset)
            self.make_dirs(path.parent)
            layout.write_atomically(path, known.encode(), self.modes.file)

    def refuse_gone(self, dataset: str, version: int) -> None:
        """Refuse a version that is gone: DATASET_NOT_FOUND if dropped, VERSION_EXPIRED if aborted."""
        kind = self.gone(dataset, version)
        if kind == "aborted":
            raise VersionExpired(f"{dataset} v{version} was aborted (it was pending longer than the catalog's "
                                 "--pending-ttl, or its writer gave it up); nothing of it is kept: put the data again",
                                 field="version")
        if kind == "dropped":  # the dataset (or this version) was dropped while it was being written
            raise DatasetNotFound(f"{dataset} v{version} was dropped; nothing of it is stored any more, and its number "
                                  "is never used again (`flightpart ls` lists what can be read)", field="version")

