"""How a node lets go of files: drops of versions, and cleanup of what a failed write or drop could not remove
(a read-only disk: retried by :meth:`StoreCleanup.retry_cleanup`).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path

from flightpart.io import layout

from ..drop_watch import Dropped
from .tombstones import StoreTombstones

log = logging.getLogger("flightpart.node")


class StoreCleanup(StoreTombstones):
    """Drops and the cleanup of leftovers."""

    def remove_or_remember(self, paths: Iterable[Path]) -> None:
        """Remove files a failed write left; those the disk will not let go (read-only) are removed later."""
        for path in paths:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                with self.lock:
                    self.leftovers.add(path)

    def retry_cleanup(self) -> int:
        """Remove again what a failed put or drop could not; returns how many are left."""
        with self.lock:
            pending = list(self.leftovers)
        for path in pending:
            try:
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
                    self.remove_empty([path.parent])
            except OSError:
                continue
            with self.lock:
                self.leftovers.discard(path)
        with self.lock:
            return len(self.leftovers)

    def drop(self, dataset: str, version: int | None = None, *, pending_only: bool = False, through: int | None = None,
             remember: bool = False) -> int:
        """Remove a version (or every version) of a dataset; returns files removed.

        ``pending_only`` (an abort) keeps sealed versions. Maps of removed
        files are let go. ``remember`` (a catalog's order) buries the
        version first (:meth:`bury`), so it never takes a file again;
        ``through``: the highest version a drop of every version covers.
        """
        with self.drops.dropping(Dropped(dataset, version, pending_only)):
            return self._drop(dataset, version, pending_only=pending_only, through=through, remember=remember)

    def _drop(self, dataset: str, version: int | None, *, pending_only: bool, through: int | None,
              remember: bool) -> int:
        """:meth:`drop`, watched."""
        ddir = self.root / layout.dataset_relpath(dataset)
        if remember and not (pending_only and version is not None and self.sealed(dataset, version)):
            kind = "aborted" if pending_only else "dropped"
            if version is not None or through:
                try:
                    self.bury(dataset, version, kind, through)
                except OSError as exc:  # a read-only or full disk: delete what can; the catalog tells it again
                    log.warning("could not record that %s v%s is %s: %s", dataset, version, kind, exc)
        targets = [self.version_dir(dataset, version)] if version is not None else sorted(ddir.glob("v*"))
        removed = 0
        for target in targets:
            if not target.is_dir() or (pending_only and (target / layout.MANIFEST).exists()):
                continue
            removed += sum(1 for _ in target.glob(f"*{layout.SUFFIX}"))
            with self.lock:
                for key in [k for k in self.group_schemas if k[0] == dataset and (version is None or k[1] == version)]:
                    del self.group_schemas[key]
                for kept_by_version in (self.fresh, self.sums):
                    for key in [k for k in kept_by_version if k[0] == dataset and (version is None or k[1] == version)]:
                        del kept_by_version[key]
                self.seals.pop(target / layout.SUMS, None)
                for kept in (self.verified, self.written):
                    for path in [p for p in kept if target in p.parents]:
                        del kept[path]
            shutil.rmtree(target, ignore_errors=True)
            if target.exists():  # a disk that is read-only for now: removed by retry_cleanup
                with self.lock:
                    self.leftovers.add(target)
            self.maps.forget(target)
        with contextlib.suppress(OSError):
            if ddir.exists() and not any(ddir.iterdir()):
                ddir.rmdir()
        return removed
