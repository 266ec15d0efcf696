"""What the catalog's state hands out: plain records of nodes, partitions and versions, and keys of ``missed`` rows.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from flightpart.wire import EncodedJson

MUST_REGISTER = "register"
"""The ``missed`` row of a node that did not answer an order (see :meth:`CatalogState.must_register`)."""


def order_key(dataset: str, version: int | None) -> str:
    """The ``missed`` rows of one drop or abort: a node acknowledging it clears only these."""
    return f"drop {dataset} {'*' if version is None else version}"


@dataclass
class NodeRecord:
    node_id: str
    uri: str
    ip: str
    pid: int
    data_dir: str | None
    last_heartbeat: float
    alive: bool

    free_bytes: int | None = None
    low_space: bool = False
    clock_skew: float | None = None  # seconds the node's clock runs ahead of the catalog's (from its last heartbeat)

    def as_json(self) -> dict:
        return {**self.__dict__}


@dataclass
class PartRecord:
    part: tuple[int, int]
    start: tuple[int, int]
    shape: tuple[int, int]
    nbytes: int
    nodes: list[NodeRecord] = field(default_factory=list)
    stats: EncodedJson | dict | None = None  # column statistics from the node that stored it


@dataclass
class VersionRecord:
    dataset: str
    version: int
    schema: bytes
    shape: tuple[int, int]
    grid: tuple[int, int]
    parts: list[PartRecord]
    replicas: int = 1

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


LEARNED = "learned:from nodes' files"
"""The writer of a version learned from nodes' files (:meth:`CatalogState.writer_of`): none, so only an admin may
finish it."""


@dataclass(frozen=True)
class Registration:
    """One page of a node's registration, as the catalog's state takes it: who the node is, the partitions it holds
    (``held``: dicts of dataset, version, part, nbytes, stats), the manifests the catalog trusts from it, every version
    it has and has sealed, the claims a signed manifest ``granted`` it, and its ``tombstones``."""

    node_id: str
    uri: str
    ip: str
    pid: int
    data_dir: str | None
    held: Sequence[dict] = ()
    manifests: Sequence[VersionRecord] = ()
    versions: Sequence[tuple[str, int]] = ()
    sealed_versions: Sequence[tuple[str, int]] = ()
    granted: Collection[tuple[str, int, tuple[int, int]]] = ()
    tombstones: Sequence[Any] = ()


@dataclass(frozen=True)
class OnTop:
    """A commit that must land on top of ``base``: it is still the latest version (None: there is none, a
    replace) and no newer one is committed, checked in the commit's transaction."""

    base: int | None
