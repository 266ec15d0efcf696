"""The Distributed Array Protocol (``__distarray__``, v0.9 and v0.10).

A second protocol spoken by SPMD array libraries. We check its dicts
(:func:`validate`, :func:`validate_all`), export one rank's local rows as a
``__distarray__`` dict (:func:`export_local`), and import the dicts of all
ranks as a conforming ``__partitioned__`` object (:func:`to_partitioned`):
block dimensions give one partition per rank, cyclic ones one per contiguous
block, unstructured ones one per contiguous run of indices, and
communication padding becomes halos.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np
import pyarrow.types as pa_types

from . import frames, protocol
from .errors import PartitionedError

SUPPORTED_VERSIONS = ("0.9", "0.10", "1.0")
"""Versions read: 0.9.x, 0.10.x, and 1.0.x (what the 0.9 reference suite calls its dicts), which follows 0.9's rules."""
EXPORT_VERSION = "0.10.0"
DIM_KEYS = {
    "n": ({"dist_type", "size"}, {"padding", "periodic"}),
    "b": ({"dist_type", "size", "proc_grid_size", "proc_grid_rank", "start", "stop"}, {"padding", "periodic"}),
    "c": ({"dist_type", "size", "proc_grid_size", "proc_grid_rank", "start"}, {"block_size", "periodic"}),
    "u": ({"dist_type", "size", "proc_grid_size", "proc_grid_rank", "indices"}, {"one_to_one", "periodic"}),
}
"""Keys each dist_type needs and may have; other keys are allowed and ignored, as the reference validators do."""


def rules_of(version: str) -> str:
    """Which version's rules a ``__version__`` follows: ``"0.9"`` (0.9.x, 1.0.x) or ``"0.10"``.

    They differ in two places. 0.9 has ``dist_type 'n'`` for an undistributed
    dimension; 0.10 has not, and writes one as ``{}`` or as a block over one
    process. In 0.9 a block's ``[start, stop)`` is what the rank owns and
    communication padding lies outside it (the buffer is longer than
    ``stop - start``); in 0.10 ``stop - start`` is the buffer's extent and the
    padding lies inside it.
    """
    return "0.10" if version.rsplit(".", 1)[0] == "0.10" else "0.9"


def _int(value: Any, field: str, minimum: int | None = 0) -> int:
    if not protocol.is_int(value):
        raise PartitionedError(f"{field}: expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise PartitionedError(f"{field}: expected an integer >= {minimum}, got {value}")
    return int(value)


def _as_array(buffer: Any) -> np.ndarray:
    """The buffer as an array of its own shape: through the buffer protocol, so ``b''`` is 1-D (0 elements) as
    the protocol sees it, not NumPy's 0-d array of one empty string."""
    return buffer if isinstance(buffer, np.ndarray) else np.asarray(memoryview(buffer))


def _buffer_shape(buffer: Any) -> tuple[int, ...]:
    try:
        return tuple(memoryview(buffer).shape)
    except TypeError:
        raise PartitionedError(
            f"buffer: a {type(buffer).__qualname__} does not support the buffer protocol (PEP 3118)"
        ) from None


def _local_extent(dim: dict, field: str) -> int:
    """How many buffer elements a dimension dict implies on its rank."""
    kind = dim["dist_type"]
    if kind == "n":
        return dim["size"]
    if kind == "b":
        pad_lo, pad_hi = _comm_padding(dim)
        return dim["stop"] - dim["start"] + pad_lo + pad_hi
    if kind == "c":
        return sum(g1 - g0 for g0, g1 in _cyclic_blocks(dim))
    return len(np.asarray(dim["indices"]).reshape(-1))


def _comm_padding(dim: dict) -> tuple[int, int]:
    """Communication padding: padding on an internal (or periodic) edge, outside [start, stop)."""
    lo, hi = dim.get("padding", (0, 0))
    periodic = dim.get("periodic", False)
    internal_lo = periodic or dim["proc_grid_rank"] > 0
    internal_hi = periodic or dim["proc_grid_rank"] < dim["proc_grid_size"] - 1
    return (lo if internal_lo else 0), (hi if internal_hi else 0)


def _cyclic_blocks(dim: dict) -> list[tuple[int, int]]:
    size, start, bs, procs = dim["size"], dim["start"], dim.get("block_size", 1), dim["proc_grid_size"]
    return [(g, min(g + bs, size)) for g in range(start, size, bs * procs)]


def _check_dim(dim: Any, field: str, rules: str = "0.9") -> None:
    if not isinstance(dim, dict):
        raise PartitionedError(f"{field}: expected a dimension dict, got {type(dim).__name__}")
    kind = dim.get("dist_type")
    kinds = ("b", "c", "u") if rules == "0.10" else ("n", "b", "c", "u")
    if kind not in kinds:
        raise PartitionedError(f"{field}.dist_type: expected one of {', '.join(map(repr, kinds))} in version {rules}, "
                               f"got {kind!r}" + (" (0.10 writes an undistributed dimension as {} or a block over one "
                                                  "process)" if kind == "n" else ""))
    required, _optional = DIM_KEYS[kind]
    for key in sorted(required - dim.keys()):
        raise PartitionedError(f"{field}: missing key {key!r} for dist_type {kind!r}")
    size = _int(dim["size"], f"{field}.size")
    if "periodic" in dim and not isinstance(dim["periodic"], bool):
        raise PartitionedError(f"{field}.periodic: expected a bool, got {dim['periodic']!r}")
    if kind != "n":
        procs = _int(dim["proc_grid_size"], f"{field}.proc_grid_size", 1)
        rank = _int(dim["proc_grid_rank"], f"{field}.proc_grid_rank")
        if rank >= procs:
            raise PartitionedError(f"{field}.proc_grid_rank: {rank} is not below proc_grid_size {procs}")
    if "padding" in dim:
        pad = dim["padding"]
        if not isinstance(pad, (tuple, list)) or len(pad) != 2:
            raise PartitionedError(f"{field}.padding: expected a pair (lower, upper), got {pad!r}")
        _int(pad[0], f"{field}.padding[0]")
        _int(pad[1], f"{field}.padding[1]")
    if kind == "b":
        start = _int(dim["start"], f"{field}.start")
        stop = _int(dim["stop"], f"{field}.stop")
        if not start <= stop <= size:
            raise PartitionedError(f"{field}: expected 0 <= start <= stop <= size, got start={start}, "
                                   f"stop={stop}, size={size}")
    elif kind == "c":
        start = _int(dim["start"], f"{field}.start")
        if start > size:
            raise PartitionedError(f"{field}.start: {start} is past size {size}")
        if "block_size" in dim:
            _int(dim["block_size"], f"{field}.block_size", 1)
    elif kind == "u":
        try:
            indices = np.asarray(memoryview(dim["indices"]))
        except Exception:
            raise PartitionedError(f"{field}.indices: expected a buffer of integers (an object with the buffer "
                                   f"protocol, such as a NumPy array), got {type(dim['indices']).__name__}") from None
        if indices.ndim != 1 or (indices.size and indices.dtype.kind not in "iu"):
            raise PartitionedError(f"{field}.indices: expected a 1-D buffer of integers, got dtype {indices.dtype}")
        if len(np.unique(indices)) != len(indices):
            raise PartitionedError(f"{field}.indices: values must be locally unique")
        if "one_to_one" in dim and not isinstance(dim["one_to_one"], bool):
            raise PartitionedError(f"{field}.one_to_one: expected a bool, got {dim['one_to_one']!r}")


def validate(dap: Any) -> dict:
    """Check one rank's ``__distarray__`` dict against every rule of its version; returns it unchanged.

    Like the reference validators, the buffer's extents are checked against
    block dimensions only (the spec states ``stop - start`` for them); an
    import (:func:`to_partitioned`) checks every dimension, since it reads
    the buffer.
    """
    if not isinstance(dap, dict) and callable(getattr(dap, "__distarray__", None)):
        dap = dap.__distarray__()
    normalized(dap, all_extents=False)
    return dap


def normalized(dap: Any, *, all_extents: bool = True) -> dict:
    """One rank's dict checked, in the terms of version 0.9 (how :func:`to_partitioned` reads every version)."""
    try:
        return _validate(dap, all_extents)
    except PartitionedError:
        raise
    except Exception as exc:
        raise PartitionedError(f"__distarray__: could not be checked: {type(exc).__name__}: {exc}") from None


def _validate(dap: Any, all_extents: bool) -> dict:
    if not isinstance(dap, dict) and callable(getattr(dap, "__distarray__", None)):
        dap = dap.__distarray__()
    if not isinstance(dap, dict):
        raise PartitionedError(f"__distarray__: expected a dict, got {type(dap).__name__}")
    for key in ("__version__", "buffer", "dim_data"):
        if key not in dap:
            raise PartitionedError(f"__distarray__: missing key {key!r}")
    for key in dap:
        if key not in ("__version__", "buffer", "dim_data"):
            raise PartitionedError(f"__distarray__: unexpected key {key!r}")
    version = dap["__version__"]
    if not isinstance(version, str) or not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise PartitionedError(f"__version__: expected 'major.minor.patch', got {version!r}")
    if version.rsplit(".", 1)[0] not in SUPPORTED_VERSIONS:
        raise PartitionedError(f"__version__: {version} is not supported (supported: 0.9.x, 0.10.x, 1.0.x)")
    rules = rules_of(version)
    dims = dap["dim_data"]
    if not isinstance(dims, (tuple, list)):
        raise PartitionedError(f"dim_data: expected a tuple of dimension dicts, got {type(dims).__name__}")
    shape = _buffer_shape(dap["buffer"])
    if len(shape) != len(dims):
        raise PartitionedError(f"buffer: has {len(shape)} dimensions, dim_data describes {len(dims)}")
    normalized = []
    for k, dim in enumerate(dims):
        if rules == "0.10" and isinstance(dim, dict) and not dim:  # 0.10's alias of an undistributed dimension
            normalized.append({"dist_type": "n", "size": shape[k]})
            continue
        _check_dim(dim, f"dim_data[{k}]", rules)
        normalized.append(_as_09(dim) if rules == "0.10" else dim)
    for k, dim in enumerate(normalized):
        if not all_extents and dim["dist_type"] != "b":
            continue
        expected = _local_extent(dim, f"dim_data[{k}]")
        if shape[k] != expected:
            rule = (" (version 0.10: stop - start)" if rules == "0.10" and dim["dist_type"] == "b"
                    else f" (version {version})")
            raise PartitionedError(f"buffer: extent {shape[k]} along dimension {k}, dim_data[{k}] implies "
                                   f"{expected}{rule}")
    return {**dap, "dim_data": tuple(normalized)}


def _as_09(dim: dict) -> dict:
    """A 0.10 dimension in 0.9's terms: a block's ``[start, stop)`` without its communication padding."""
    if dim["dist_type"] != "b" or "padding" not in dim:
        return dim
    if dim["proc_grid_size"] == 1 and dim["stop"] - dim["start"] == dim["size"]:
        # one process spanning the whole dimension (undistributed): even periodic, its padding holds rows it owns,
        # counted in ``size`` (boundary padding), never copies of a neighbour's; read as padding, it left a gap
        return {**dim, "padding": (0, 0)}
    lo, hi = _comm_padding(dim)
    return {**dim, "start": dim["start"] + lo, "stop": dim["stop"] - hi}


def validate_all(daps: Sequence[Any]) -> list[dict]:
    """Check the dicts of all ranks together: grids, adjacency and padding agree."""
    checked = [normalized(d) for d in daps]
    if not checked:
        raise PartitionedError("__distarray__: no ranks given")
    ndim = len(checked[0]["dim_data"])
    for r, d in enumerate(checked):
        if len(d["dim_data"]) != ndim:
            raise PartitionedError(f"rank {r}: dim_data has {len(d['dim_data'])} dimensions, rank 0 has {ndim}")
    for k in range(ndim):
        dims = [d["dim_data"][k] for d in checked]
        kinds = {dim["dist_type"] for dim in dims}
        if len(kinds) != 1:
            raise PartitionedError(f"dim_data[{k}].dist_type: ranks disagree: {sorted(kinds)}")
        if len({dim["size"] for dim in dims}) != 1:
            raise PartitionedError(f"dim_data[{k}].size: ranks disagree: {sorted({dim['size'] for dim in dims})}")
        if len({"padding" in dim for dim in dims}) != 1:
            raise PartitionedError(f"dim_data[{k}].padding: must be present on all ranks or on none")
        if kinds == {"b"}:
            by_rank = {}
            for dim in dims:
                by_rank.setdefault(dim["proc_grid_rank"], (dim["start"], dim["stop"]))
            ranks = sorted(by_rank)
            for a, b in zip(ranks, ranks[1:]):
                if by_rank[a][1] != by_rank[b][0]:
                    raise PartitionedError(
                        f"dim_data[{k}]: block ranges are not adjacent: grid rank {a} stops at {by_rank[a][1]}, "
                        f"grid rank {b} starts at {by_rank[b][0]}"
                    )
    procs = [dim["proc_grid_size"] for dim in checked[0]["dim_data"] if dim["dist_type"] != "n"]
    if math.prod(procs) != len(checked):
        raise PartitionedError(
            f"proc_grid_size: the product over distributed dimensions is {math.prod(procs)}, "
            f"but {len(checked)} ranks were given"
        )
    return checked


# --------------------------------------------------------------------------- export


def export_local(frame: Any, *, rank: int, nranks: int, start: int, global_rows: int,
                 padding: tuple[int, int] = (0, 0), periodic: bool = False, version: str = EXPORT_VERSION) -> dict:
    """One rank's rows of a numeric frame as a ``__distarray__`` dict of ``version`` (0.10.0 or 0.9.0).

    ``buffer`` is a 2-D NumPy array: a view of the frame's memory when its
    columns allow (one column, or a pandas frame of one dtype), else a copy.
    Rows are block-distributed (``'b'``), starting at global row ``start``;
    ``padding`` = (lower, upper) halo rows the frame carries before and after
    them (communication padding); ``periodic`` says the rows wrap around,
    so padding at a global edge holds rows of the other end. Columns are not
    distributed: a block over one process in 0.10, ``'n'`` in 0.9.
    """
    rules = rules_of(version) if isinstance(version, str) and re.fullmatch(r"\d+\.\d+\.\d+", version) else None
    if rules is None or version.rsplit(".", 1)[0] not in SUPPORTED_VERSIONS:
        raise ValueError(f"version: expected 0.10.0 or 0.9.0, got {version!r}")
    buffer = numeric_matrix(frame)
    rows, cols = buffer.shape
    lo, hi = (int(p) for p in padding)
    owned = rows - lo - hi
    if lo < 0 or hi < 0 or owned < 0:
        raise ValueError(f"padding: {padding} is more than the frame's {rows} rows")
    row_dim = {"dist_type": "b", "size": int(global_rows), "proc_grid_size": int(nranks), "proc_grid_rank": int(rank)}
    if rules == "0.10":  # [start, stop) spans the buffer, padding included
        row_dim.update(start=int(start) - lo, stop=int(start) + owned + hi)
        col_dim = {"dist_type": "b", "size": cols, "proc_grid_size": 1, "proc_grid_rank": 0, "start": 0, "stop": cols}
    else:  # [start, stop) is what the rank owns
        row_dim.update(start=int(start), stop=int(start) + owned)
        col_dim = {"dist_type": "n", "size": cols}
    if lo or hi:
        row_dim["padding"] = (lo, hi)
    if periodic:
        row_dim["periodic"] = True
    return validate({"__version__": version, "buffer": buffer, "dim_data": (row_dim, col_dim)})


def numeric_matrix(frame: Any) -> np.ndarray:
    """A 2-D NumPy array of a numeric frame, zero-copy where the layout allows."""
    if frames.frame_kind(frame) == "pandas":
        return frame.to_numpy()
    table = frames.drop_pandas_index(frames.to_arrow(frame))
    for field in table.schema:
        if not (pa_types.is_integer(field.type) or pa_types.is_floating(field.type) or pa_types.is_boolean(field.type)):
            raise PartitionedError(f"column {field.name!r}: {field.type} is not numeric; __distarray__ needs numbers")
    if table.num_columns == 1 and table.column(0).num_chunks <= 1 and table.column(0).null_count == 0:
        chunk = table.column(0).chunk(0) if table.column(0).num_chunks else table.column(0).combine_chunks()
        return chunk.to_numpy(zero_copy_only=False).reshape(-1, 1)
    return (np.column_stack([table.column(k).to_numpy() for k in range(table.num_columns)]) if table.num_columns
            else np.empty((table.num_rows, 0)))


# --------------------------------------------------------------------------- import


@dataclass(frozen=True)
class _Segment:
    g0: int  # global start
    g1: int  # global stop
    local: Any  # slice or index array into the local buffer along this dimension


def _segments(dim: dict) -> tuple[list[_Segment], tuple[int, int]]:
    """Global pieces one rank holds along one dimension, and its halo widths."""
    kind = dim["dist_type"]
    if kind == "n":
        return [_Segment(0, dim["size"], slice(0, dim["size"]))], (0, 0)
    if kind == "b":
        lo, hi = _comm_padding(dim)
        n = dim["stop"] - dim["start"]
        return [_Segment(dim["start"], dim["stop"], slice(lo, lo + n))], (lo, hi)
    if kind == "c":
        out, offset = [], 0
        for g0, g1 in _cyclic_blocks(dim):
            out.append(_Segment(g0, g1, slice(offset, offset + g1 - g0)))
            offset += g1 - g0
        return out, (0, 0)
    indices = np.asarray(dim["indices"]).reshape(-1)
    order = np.argsort(indices, kind="stable")
    ordered = indices[order]
    out = []
    if len(ordered):
        breaks = np.flatnonzero(np.diff(ordered) != 1) + 1
        for run in np.split(np.arange(len(ordered)), breaks):
            local = order[run]
            contiguous = np.all(np.diff(local) == 1)
            sel = slice(int(local[0]), int(local[-1]) + 1) if contiguous else local
            out.append(_Segment(int(ordered[run[0]]), int(ordered[run[-1]]) + 1, sel))
    return out, (0, 0)


class DistArrayPartitioned:
    """The ranks' ``__distarray__`` dicts seen as one ``__partitioned__`` object.

    ``halos`` maps each grid position to its (lower, upper) communication
    padding along every dimension, the RFC's halo widths.
    """

    def __init__(self, partitioned: dict, halos: dict):
        self._partitioned = partitioned
        self.halos = halos

    @property
    def __partitioned__(self) -> dict:
        return self._partitioned


def to_partitioned(daps: Sequence[Any], locations: Sequence[tuple] | None = None) -> DistArrayPartitioned:
    """Import the ``__distarray__`` dicts of all ranks (in rank order).

    ``locations[r]`` is rank r's ``(IP, PID)``; by default this process
    (:func:`flightpart.protocol.this_process`).
    Unstructured distributions become one partition per contiguous run of
    indices; runs that do not tile the index space are refused.
    """
    checked = validate_all(daps)
    if locations is None:
        locations = [protocol.this_process()] * len(checked)
    if len(locations) != len(checked):
        raise PartitionedError(f"locations: expected {len(checked)} entries (one per rank), got {len(locations)}")
    ndim = len(checked[0]["dim_data"])
    if ndim == 0:
        raise PartitionedError("__distarray__: a 0-d array (dim_data == ()) is valid, but __partitioned__ describes "
                               "at least one dimension; reshape it to (1,) to import it")
    pieces = []  # (global start, global stop, buffer index, rank, halo)
    for rank, dap in enumerate(checked):
        buffer = _as_array(dap["buffer"])
        per_dim = [_segments(dim) for dim in dap["dim_data"]]
        halo = tuple(h for _, h in per_dim)
        for combo in product(*(segs for segs, _ in per_dim)):
            data = buffer
            for axis, seg in enumerate(combo):
                sel = [slice(None)] * ndim
                sel[axis] = seg.local
                data = data[tuple(sel)]
            pieces.append((tuple(s.g0 for s in combo), tuple(s.g1 for s in combo), data, rank, halo))
    edges = [sorted({(p[0][k], p[1][k]) for p in pieces}) for k in range(ndim)]
    shape = tuple(checked[0]["dim_data"][k]["size"] for k in range(ndim))
    grid = tuple(len(e) for e in edges)
    partitions, halos = {}, {}
    for g0, g1, data, rank, halo in pieces:
        pos = tuple(edges[k].index((g0[k], g1[k])) for k in range(ndim))
        if pos in partitions:
            raise PartitionedError(
                f"__distarray__: ranks {partitions[pos]['_rank']} and {rank} both hold global block "
                f"{g0}..{g1}; an import needs each element owned once (one_to_one)"
            )
        partitions[pos] = {
            "start": g0,
            "shape": tuple(b - a for a, b in zip(g0, g1)),
            "data": data,
            "location": [tuple(locations[rank])],
            "_rank": rank,
        }
        halos[pos] = halo
    if len(partitions) != math.prod(grid):
        raise PartitionedError(
            f"__distarray__: the ranks' sections form {len(partitions)} blocks, not a regular "
            f"{grid} grid; unstructured indices must come in runs that line up"
        )
    for entry in partitions.values():
        del entry["_rank"]
    result = {"shape": shape, "partition_tiling": grid, "partitions": partitions, "get": protocol.IdentityGet()}
    try:
        protocol.validate(result)
    except PartitionedError as exc:
        raise PartitionedError(f"__distarray__: the ranks' sections do not tile the index space: {exc}") from None
    return DistArrayPartitioned(result, halos)
