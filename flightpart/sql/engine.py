"""The one DuckDB database the catalog's queries run in: memory and spill space bounded for all of them together.

Each query has a connection of its own in one database, so ``memory_limit`` and
``max_temp_directory_size`` bound them together (decision 0033). Spill files go
to a private directory (mode 0700) removed at stop; external access is off and
the configuration locked.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Any

SPILL_PREFIX = "flightpart-sql-spill-"


class Engine:
    """The shared DuckDB database (made at the first query), its memory and spill limits (see the module doc)."""

    def __init__(self, memory: int, spill: int, spill_dir: str | None = None):
        self.memory = memory
        self.spill = spill
        self.spill_dir = spill_dir
        self.directory: str | None = None
        self._database: Any = None
        self._lock = threading.Lock()

    def connect(self) -> Any:
        """A new connection to the shared database (closed by its query)."""
        with self._lock:
            if self._database is None:
                import duckdb

                self.directory = tempfile.mkdtemp(prefix=SPILL_PREFIX, dir=self.spill_dir)  # mode 0700
                self._database = duckdb.connect(config={
                    "enable_external_access": False, "memory_limit": f"{self.memory}B",
                    "temp_directory": self.directory, "max_temp_directory_size": f"{self.spill}B",
                    "lock_configuration": True})
            return self._database.cursor()

    def spilled_bytes(self) -> int:
        """Bytes in the spill directory now."""
        directory = self.directory
        if directory is None:
            return 0
        total = 0
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            return 0
        return total

    def close(self) -> None:
        """Close the database and remove its spill directory."""
        with self._lock:
            if self._database is not None:
                try:
                    self._database.close()
                except Exception:
                    pass
                self._database = None
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)
                self.directory = None
