"""SPMD views: a rank's own partitions, the halo rows its neighbours lend it, and its rows as a DAP dict.

An SPMD view (``client.open(name, rank=r, nranks=n)``) is an ordinary
:class:`~flightpart.client.view.View` with ``spmd=(rank, nranks)``: row block
``i`` belongs to rank ``i % nranks``. What only SPMD programs need lives
here: checking a halo request (:func:`halo_of`), the Dist RFC's three parts
of each local partition (:func:`parts_of`) and the Distributed Array
Protocol export (:func:`distarray`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import pyarrow as pa

from flightpart import frames
from flightpart.errors import PartitionedError
from flightpart.tiling import halo_sources

from .plan import Block, Plan
from .view import View


class Dataset(Protocol):
    """What these functions read of a :class:`~flightpart.client.dataset.Dataset`: its public face only."""

    @property
    def view(self) -> View: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def __partitioned__(self) -> dict: ...

    @property
    def schema(self) -> pa.Schema: ...

    @property
    def shape(self) -> tuple[int, int]: ...

    def read_locals(self) -> dict[tuple[int, int], pa.Table]: ...


@dataclass(frozen=True)
class Halo:
    """Rows each local partition of an SPMD view comes with: ``left`` before, ``right`` after, wrapping if periodic."""

    left: int
    right: int
    periodic: bool


class HaloParts(NamedTuple):
    """The Dist RFC's parts of one local partition: left halo, locally owned rows, right halo."""

    left: pa.Table
    local: pa.Table
    right: pa.Table


def check_rank(rank: object, nranks: object) -> tuple[int, int]:
    """``(rank, nranks)`` when both are whole numbers with ``0 <= rank < nranks``; ValueError otherwise."""
    if not (isinstance(rank, int) and isinstance(nranks, int) and 0 <= rank < nranks):
        raise ValueError(f"rank must be in [0, nranks), got rank={rank!r}, nranks={nranks!r}")
    return rank, nranks


def halo_of(ds: Dataset, halo: tuple[int, int] | None, periodic: bool) -> Halo | None:
    """The halo an SPMD view of ``ds`` asks for, checked: widths are rows of the stored grid's neighbours."""
    if halo is None:
        return None
    widths = tuple(halo)
    if len(widths) != 2 or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in widths):
        raise ValueError(f"halo must be (left, right) rows, integers >= 0, got {halo!r}")
    if ds.view.rows is not None or ds.view.filter is not None:
        raise PartitionedError("halos are rows of the stored grid's neighbours: open the dataset with halo= "
                               "before slicing or filtering it")
    total = ds.plan.version.shape[0]
    if max(widths) > total:
        raise ValueError(f"halo {widths}: wider than the dataset's {total} rows")
    return Halo(widths[0], widths[1], bool(periodic))


def parts_of(ds: Dataset) -> dict[tuple[int, int], HaloParts]:
    """Each local partition of an SPMD view as the Dist RFC's three parts (see :meth:`Dataset.parts_of`)."""
    view, plan = ds.view, ds.plan
    if view.spmd is None:
        raise PartitionedError("parts_of needs the SPMD view: client.open(name, rank=r, nranks=n, halo=(left, right))")
    if view.rows is not None or view.filter is not None:
        raise PartitionedError("parts_of works on the stored grid: slice or filter the parts it returns instead")
    d = ds.__partitioned__
    halo = view.halo or Halo(0, 0, False)
    sizes = [plan.parts[(i, 0)].shape[0] for i in range(plan.grid[0])]
    sources = halo_sources(sizes, halo.left, halo.right, periodic=halo.periodic)
    groups = plan.groups()
    refs: list[Any] = []
    layout = []
    for pos in d["locals"]:
        i, vj = pos
        j = groups[vj]
        sides: dict[str, list[int]] = {"left": [], "right": []}
        for piece in sources[i]:
            sides[piece.side].append(len(refs))
            refs.append(plan.ref(Block(piece.owner, (piece.start, piece.stop), None), j, plan.columns_of(j)))
        sides["local"] = [len(refs)]
        refs.append(d["partitions"][pos]["data"])
        layout.append((pos, sides))
    tables = d["get"](refs)
    out = {}
    for pos, sides in layout:
        schema = tables[sides["local"][0]].schema
        parts = [_joined([tables[k] for k in sides[side]], schema) for side in ("left", "local", "right")]
        out[pos] = HaloParts(*parts)
    return out


def _joined(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables(tables) if tables else frames.empty_table(schema)


def distarray(ds: Dataset, version: str) -> dict:
    """This rank's rows of an SPMD view as a Distributed Array Protocol dict (see :meth:`Dataset.__distarray__`)."""
    from flightpart.distarray import export_local

    view = ds.view
    if view.spmd is None:
        raise PartitionedError("__distarray__ needs the SPMD view: client.open(name, rank=r, nranks=n)")
    rank, nranks = view.spmd
    d = ds.__partitioned__
    blocks = sorted({pos[0] for pos in d["locals"]})
    if blocks and blocks != list(range(blocks[0], blocks[-1] + 1)):
        raise PartitionedError(f"rank {rank} holds row blocks {blocks}, which are not contiguous; "
                               "__distarray__ describes one block per rank")
    halos = parts_of(ds) if view.halo is not None else None
    local = {pos: p.local for pos, p in halos.items()} if halos is not None else ds.read_locals()
    padding, periodic = (0, 0), False
    if blocks:
        q = d["partition_tiling"][1]

        def row(i: int, side: str = "local") -> pa.Table:
            tables = {(0, j): getattr((halos or {})[(i, j)], side) if side != "local" else local[(i, j)]
                      for j in range(q)}
            return frames.assemble(tables, (1, q))

        rows = [row(i) for i in blocks]
        if halos is not None:
            left, right = row(blocks[0], "left"), row(blocks[-1], "right")
            periodic = view.halo.periodic and ((blocks[0] == 0 and left.num_rows > 0)
                                               or (blocks[-1] == ds.plan.grid[0] - 1 and right.num_rows > 0))
            if periodic and not version.startswith("0.9."):
                raise PartitionedError(f"rank {rank}'s periodic halo wraps around the first or last row, which "
                                       "DAP 0.10 cannot describe (its start and stop include the padding); ask for "
                                       "__distarray__(version='0.9.0'), or read the halos with parts_of()")
            rows = [left, *rows, right]
            padding = (left.num_rows, right.num_rows)
        table = pa.concat_tables(rows) if len(rows) > 1 else rows[0]
        start = d["partitions"][(blocks[0], 0)]["start"][0]
    else:
        table = frames.empty_table(ds.schema)
        start = ds.shape[0]
    return export_local(table, rank=rank, nranks=nranks, start=start, global_rows=ds.shape[0],
                        padding=padding, periodic=periodic, version=version)
