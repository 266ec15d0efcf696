"""A node's data directory on disk: where each partition file lives, and the node marker.

The node writes this layout and a client on the same host reads it (to
memory-map a partition instead of streaming it), so both halves are here:

    <data dir>/flightpart-node.json                  {"node_id": "..."}
    <data dir>/datasets/<name>/v<version>/<i>_<j>.arrow
    <data dir>/datasets/<name>/v<version>/.tmp-*      a put in progress

Per-user default directories come from platformdirs.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import platformdirs

from flightpart.wire import check_name

NODE_MARKER = "flightpart-node.json"
TMP_PREFIX = ".tmp-"
DATASETS = "datasets"
SUFFIX = ".arrow"


def default_data_dir() -> Path:
    """Where a node keeps its partitions unless ``--data-dir`` says otherwise."""
    return Path(platformdirs.user_data_dir("flightpart")) / "node"


def default_state_dir() -> Path:
    """Where a catalog keeps its SQLite state unless ``--state-dir`` says otherwise."""
    return Path(platformdirs.user_data_dir("flightpart")) / "catalog"


def dataset_relpath(name: str) -> str:
    return f"{DATASETS}/{check_name(name)}"


def version_relpath(name: str, version: int) -> str:
    return f"{dataset_relpath(name)}/v{int(version)}"


def partition_relpath(name: str, version: int, part: tuple[int, int]) -> str:
    """Where a node keeps a partition, relative to its data directory."""
    return f"{version_relpath(name, version)}/{int(part[0])}_{int(part[1])}{SUFFIX}"


def temporary_path(final: Path) -> Path:
    """A fresh temporary name beside ``final``, for a write that is renamed into place when complete."""
    return final.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}{SUFFIX}"


def part_of_filename(filename: str) -> tuple[int, int] | None:
    """(i, j) of a partition file name ``<i>_<j>.arrow``, or None for anything else."""
    if not filename.endswith(SUFFIX) or filename.startswith("."):
        return None
    stem = filename[: -len(SUFFIX)]
    i, sep, j = stem.partition("_")
    if not sep or not (i.isascii() and i.isdigit() and j.isascii() and j.isdigit()):
        return None
    return int(i), int(j)


def version_of_dirname(dirname: str) -> int | None:
    """The version of a directory name ``v<version>``, or None."""
    digits = dirname[1:]
    return int(digits) if dirname.startswith("v") and digits.isascii() and digits.isdigit() else None


def partitions_in(version_dir: Path) -> Iterator[tuple[tuple[int, int], Path]]:
    """The partition files of one version directory, sorted by position."""
    if not version_dir.is_dir():
        return
    found = [(part, path) for path in version_dir.iterdir() if (part := part_of_filename(path.name)) is not None]
    yield from sorted(found)


def temporaries(root: Path) -> Iterator[Path]:
    """Leftover temporary files of interrupted puts."""
    datasets = root / DATASETS
    if datasets.exists():
        yield from datasets.glob(f"*/v*/{TMP_PREFIX}*")


def read_node_id(data_dir: str | Path) -> str | None:
    """The node id recorded in a data directory's marker, if any."""
    try:
        return json.loads((Path(data_dir) / NODE_MARKER).read_text())["node_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_node_marker(data_dir: Path) -> str:
    """Give a data directory a fresh node id, durably; returns it."""
    node_id = uuid.uuid4().hex
    tmp = data_dir / f"{TMP_PREFIX}{NODE_MARKER}"
    tmp.write_text(json.dumps({"node_id": node_id}))
    fsync_path(tmp)
    os.replace(tmp, data_dir / NODE_MARKER)
    fsync_path(data_dir)
    return node_id


def fsync_path(path: Path) -> None:
    """Flush a file's (or a directory's) contents to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
