"""A node's data directory on disk: where each partition file lives, and the node marker.

The node writes this layout and a client on the same host reads it (to memory-map a partition), so both halves
are here:

    <data dir>/flightpart-node.json                  {"node_id": "...", "cluster": "..."|null}
    <data dir>/datasets/<name>/v<version>/<i>_<j>.arrow
    <data dir>/datasets/<name>/v<version>/manifest.json  the sealed version's geometry
    <data dir>/datasets/<name>/v<version>/checksums.json the sealed version's checksums (bound sum, size) of its files
                                                         here
    <data dir>/datasets/<name>/v<version>/.tmp-*      a put in progress
    <data dir>/datasets/<name>/tombstones.json        version numbers of the dataset that are gone for good
    <data dir>/datasets/<name>/v<version>/<i>_<j>.stats.json  rows, column statistics, CRC-32, bound sum and size
    <data dir>/quarantine/<name>/v<version>/<i>_<j>.arrow.<time>  a file that failed its checksum, moved aside

A version directory with a manifest is sealed: committed, immutable, and enough for a catalog that lost its
state to rebuild the version.
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
MANIFEST = "manifest.json"
SUMS = "checksums.json"
"""Kept beside a sealed version's manifest by a node: the checksum of each of its files there, so that a lost or
garbled statistics file neither turns a check off nor lets a file of another place pass."""
TMP_PREFIX = ".tmp-"
DATASETS = "datasets"
SUFFIX = ".arrow"
STATS_SUFFIX = ".stats.json"
TOMBSTONES = "tombstones.json"
QUARANTINE = "quarantine"
"""Where a node moves partition files that failed their checksum: kept for an operator, never served."""


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


def tombstones_relpath(name: str) -> str:
    """Where a node remembers which versions of a dataset were dropped or aborted (never to be used again)."""
    return f"{dataset_relpath(name)}/{TOMBSTONES}"


def partition_relpath(name: str, version: int, part: tuple[int, int]) -> str:
    """Where a node keeps a partition, relative to its data directory."""
    return f"{version_relpath(name, version)}/{partition_filename(part)}"


def partition_filename(part: tuple[int, int]) -> str:
    """A partition's file name in its version directory."""
    return f"{int(part[0])}_{int(part[1])}{SUFFIX}"


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


def read_marker(data_dir: str | Path) -> dict:
    """The node marker of a data directory: ``{"node_id", "cluster", "epoch"}`` (empty if missing or damaged)."""
    try:
        marker = json.loads((Path(data_dir) / NODE_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(marker, dict) or not isinstance(marker.get("node_id"), str):
        return {}
    epoch = marker.get("epoch")
    return {"node_id": marker["node_id"],
            "cluster": marker.get("cluster") if isinstance(marker.get("cluster"), str) else None,
            "epoch": epoch if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0 else None}


def read_node_id(data_dir: str | Path) -> str | None:
    """The node id recorded in a data directory's marker, if any."""
    return read_marker(data_dir).get("node_id")


def write_node_marker(data_dir: Path, node_id: str | None = None, cluster: str | None = None, mode: int = 0o600,
                      epoch: int | None = None) -> str:
    """Record durably a data directory's node id (fresh if None), cluster and highest obeyed catalog epoch; returns the
    id."""
    node_id = node_id or uuid.uuid4().hex
    marker = {"node_id": node_id, "cluster": cluster, **({"epoch": epoch} if epoch is not None else {})}
    write_atomically(data_dir / NODE_MARKER, json.dumps(marker).encode(), mode)
    return node_id


def write_atomically(path: Path, data: bytes, mode: int = 0o600, *, sync_directory: bool = True) -> None:
    """Write a small file so that readers see the old content or the new, never a part (``sync_directory=False``:
    the caller makes the rename durable)."""
    tmp = path.parent / f"{TMP_PREFIX}{path.name}.{uuid.uuid4().hex}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(tmp, mode)  # whatever the umask
    fsync_path(tmp)
    os.replace(tmp, path)
    if sync_directory:
        fsync_path(path.parent)


def stats_path(partition: Path) -> Path:
    """Where a partition's column statistics are kept, beside it."""
    return partition.with_name(partition.name[: -len(SUFFIX)] + STATS_SUFFIX)


def fsync_path(path: Path) -> None:
    """Flush a file's (or a directory's) contents to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Modes:
    """Who may read a data directory: only the owner (0700/0600, whatever the umask), or with a ``group`` its members
    too (0750/0640, group-owned), so they may memory-map partitions."""

    def __init__(self, group: str | None = None):
        self.gid = None
        if group is not None:
            import grp

            try:
                self.gid = grp.getgrnam(group).gr_gid
            except KeyError:
                raise ValueError(f"--group {group}: no such group on this machine") from None
        self.directory = 0o750 if self.gid is not None else 0o700
        self.file = 0o640 if self.gid is not None else 0o600

    def apply(self, path: Path, *, directory: bool) -> None:
        if self.gid is not None:
            os.chown(path, -1, self.gid)
        os.chmod(path, self.directory if directory else self.file)

    def make_dirs(self, directory: Path, root: Path) -> list[Path]:
        """Create ``directory`` (below ``root``) with these modes; returns what was created, deepest first."""
        created = []
        d = directory
        while not d.exists() and d != root:
            created.append(d)
            d = d.parent
        for d in reversed(created):
            try:
                d.mkdir()
            except FileExistsError:
                continue
            self.apply(d, directory=True)
        return created
