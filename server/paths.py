"""Default places for a daemon's files (per-user, via platformdirs)."""

from __future__ import annotations

from pathlib import Path

import platformdirs


def default_data_dir() -> Path:
    """Where a node keeps its partitions unless ``--data-dir`` says otherwise."""
    return Path(platformdirs.user_data_dir("flightpart")) / "node"


def default_state_dir() -> Path:
    """Where a catalog keeps its SQLite state unless ``--state-dir`` says otherwise."""
    return Path(platformdirs.user_data_dir("flightpart")) / "catalog"
