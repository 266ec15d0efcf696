"""The ``__partitioned__`` protocol as code: check it, build it, consume it.

The draft spec (``partitioned-protocol.md``) is prose; this module is its
single executable reading. :func:`validate` is strict and names the exact
field at fault, :func:`partitioned` produces a conforming object from an
in-process frame, and :func:`from_partitioned` consumes any conforming
producer, ours or not.
"""

from __future__ import annotations

import math
import os
import pickle
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa

from . import frames, tiling
from .errors import PartitionedError

REQUIRED_KEYS = ("shape", "partition_tiling", "partitions", "get")
OPTIONAL_KEYS = ("locals",)
PARTITION_KEYS = ("start", "shape", "data", "location")
DLPACK_DEVICES = (
    "CPU", "CUDA", "CUDAHost", "OpenCL", "Vulkan", "Metal", "VPI", "ROCM", "ROCMHost",
    "ExtDev", "CUDAManaged", "OneAPI", "WebGPU", "Hexagon", "MAIA", "Trn",
)
DEVICE_PATTERN = re.compile(rf"^kDL({'|'.join(DLPACK_DEVICES)})(:\d+)?$")
HOST_DEVICE = "kDLCPU"


class StatelessGet:
    """Base of picklable ``get`` callables that carry no state.

    The spec's own examples use lambdas, which do not pickle; an instance of
    a module-level class does. One handle gives one object; a list or tuple
    of handles gives a list. Subclasses implement :meth:`fetch`.
    """

    def fetch(self, handles: list) -> list:
        raise NotImplementedError

    def __call__(self, handles: Any) -> Any:
        if isinstance(handles, (list, tuple)):
            return self.fetch(list(handles))
        return self.fetch([handles])[0]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class IdentityGet(StatelessGet):
    """``get`` for partitions whose ``data`` already is the data."""

    def fetch(self, handles: list) -> list:
        return handles


def this_process() -> tuple[str, int]:
    """The ``(IP, PID)`` of data held in this very process.

    The IP is ``$FLIGHTPART_HOST`` when set, else loopback: the core does no
    DNS lookup, so pass ``location=`` to name a routable address.
    """
    return (os.environ.get("FLIGHTPART_HOST") or "127.0.0.1", os.getpid())


def get_partitioned(obj: Any) -> Any:
    """The dict behind ``obj``: itself if a dict, else its ``__partitioned__``."""
    if isinstance(obj, dict):
        return obj
    try:
        value = obj.__partitioned__
    except AttributeError:
        raise PartitionedError(
            f"__partitioned__: a {type(obj).__qualname__} has no __partitioned__ attribute"
        ) from None
    return value() if callable(value) and not isinstance(value, dict) else value


# --------------------------------------------------------------------------- validate


def is_int(x: Any) -> bool:
    """A Python or NumPy integer (not a bool): what the spec's integer fields accept."""
    return isinstance(x, int) and not isinstance(x, bool) or (
        type(x).__module__ == "numpy" and hasattr(x, "dtype") and x.dtype.kind in "iu" and getattr(x, "ndim", 1) == 0
    )


def _fmt(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _int_tuple(value: Any, n: int | None, field: str, *, minimum: int = 0) -> tuple[int, ...]:
    what = f"{n} integers" if n is not None else "integers"
    if not isinstance(value, tuple):
        raise PartitionedError(f"{field}: expected a tuple of {what}, got {_fmt(value)} ({type(value).__name__})")
    if n is not None and len(value) != n:
        raise PartitionedError(f"{field}: expected {what}, got {_fmt(value)}")
    for k, x in enumerate(value):
        if not is_int(x):
            raise PartitionedError(f"{field}[{k}]: expected an integer, got {_fmt(x)} ({type(x).__name__})")
        if x < minimum:
            raise PartitionedError(f"{field}[{k}]: expected an integer >= {minimum}, got {x}")
    return tuple(int(x) for x in value)


def _check_keys(d: dict, required: Sequence[str], optional: Sequence[str], where: str, what: str) -> None:
    for key in required:
        if key not in d:
            raise PartitionedError(f"{where}: missing key '{key}'")
    for key in d:
        if key not in required and key not in optional:
            raise PartitionedError(f"{where}: unknown key {_fmt(key)}; {what} {', '.join((*required, *optional))}")


def _check_top_level(d: Any) -> None:
    """Spec: the dict and its keys."""
    if not isinstance(d, dict):
        raise PartitionedError(f"__partitioned__: expected a dict, got {type(d).__name__}")
    _check_keys(d, REQUIRED_KEYS, OPTIONAL_KEYS, "__partitioned__", "the spec defines")


def _check_shape_and_tiling(d: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Spec: ``shape`` and ``partition_tiling``."""
    shape = _int_tuple(d["shape"], None, "shape")
    if not shape:
        raise PartitionedError("shape: expected at least one dimension, got ()")
    grid = _int_tuple(d["partition_tiling"], None, "partition_tiling", minimum=1)
    if len(grid) != len(shape):
        raise PartitionedError(f"partition_tiling: expected {len(shape)} entries like shape {shape}, got {grid}")
    return shape, grid


def _check_positions(parts: Any, grid: tuple[int, ...]) -> None:
    """Spec: ``partitions`` is keyed by every position of the grid, once."""
    if not isinstance(parts, dict):
        raise PartitionedError(f"partitions: expected a dict keyed by grid position, got {type(parts).__name__}")
    ndim = len(grid)
    for key in parts:
        if not isinstance(key, tuple) or len(key) != ndim or not all(is_int(k) for k in key):
            raise PartitionedError(f"partitions: key {_fmt(key)} is not a grid position (a tuple of {ndim} integers)")
        if not all(0 <= k < t for k, t in zip(key, grid)):
            raise PartitionedError(f"partitions: key {key} lies outside the grid {grid}")
    expected = math.prod(grid)
    if len(parts) != expected:
        missing = next(pos for pos in (tiling.position_at(n, grid) for n in range(expected)) if pos not in parts)
        raise PartitionedError(
            f"partitions: position {missing} is missing; a {grid} grid needs {expected} entries, got {len(parts)}"
        )


def _check_location(value: Any, field: str) -> None:
    """Spec: ``location`` is a list of ``(IP, PID[, device])``."""
    if not isinstance(value, (list, tuple)) or isinstance(value, str):
        raise PartitionedError(f"{field}: expected a list of (IP, PID[, device]) tuples, got {_fmt(value)}")
    if len(value) == 0:
        raise PartitionedError(f"{field}: expected at least one (IP, PID[, device]) tuple, got an empty list")
    for k, loc in enumerate(value):
        where = f"{field}[{k}]"
        if not isinstance(loc, (tuple, list)) or len(loc) not in (2, 3):
            raise PartitionedError(f"{where}: expected a tuple (IP, PID[, device]), got {_fmt(loc)}")
        ip, pid = loc[0], loc[1]
        if not isinstance(ip, str) or not ip.strip():
            raise PartitionedError(f"{where}: IP must be a non-empty string, got {_fmt(ip)}")
        if not is_int(pid) or pid < 0:
            raise PartitionedError(f"{where}: PID must be a non-negative integer, got {_fmt(pid)}")
        if len(loc) == 3:
            device = loc[2]
            if not isinstance(device, str) or not DEVICE_PATTERN.match(device):
                raise PartitionedError(
                    f"{where}: device must be a DLPack device name such as 'kDLCPU' or 'kDLCUDA:0', got {_fmt(device)}"
                )


def _check_entries(parts: dict,
                   shape: tuple[int, ...]) -> dict[tuple[int, ...], tuple[tuple[int, ...], tuple[int, ...]]]:
    """Spec: each partition's ``start``, ``shape`` and ``location``; returns the geometry."""
    geometry: dict[tuple[int, ...], tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for pos, entry in parts.items():
        pos = tuple(int(k) for k in pos)
        where = f"partitions[{pos}]"
        if not isinstance(entry, dict):
            raise PartitionedError(f"{where}: expected a dict with {', '.join(PARTITION_KEYS)}, got "
                                   f"{type(entry).__name__}")
        _check_keys(entry, PARTITION_KEYS, (), where, "a partition has")
        start = _int_tuple(entry["start"], len(shape), f"{where}.start")
        pshape = _int_tuple(entry["shape"], len(shape), f"{where}.shape")
        for axis, (s0, n, total) in enumerate(zip(start, pshape, shape)):
            if s0 + n > total:
                raise PartitionedError(f"{where}: rows {s0}..{s0 + n} along axis {axis} reach past "
                                       f"shape[{axis}] = {total}")
        _check_location(entry["location"], f"{where}.location")
        geometry[pos] = (start, pshape)
    return geometry


def _check_locals_and_data(d: dict) -> None:
    """Spec: ``locals`` (SPMD only) and ``data`` (one type; None only for another rank's part)."""
    parts = d["partitions"]
    local_positions: set[tuple[int, ...]] = set()
    if "locals" in d:
        loc = d["locals"]
        if not isinstance(loc, (list, tuple)):
            raise PartitionedError(f"locals: expected a list of grid positions, got {type(loc).__name__}")
        for k, pos in enumerate(loc):
            if not isinstance(pos, tuple) or pos not in parts:
                raise PartitionedError(f"locals[{k}]: {_fmt(pos)} is not a position in partitions")
            if pos in local_positions:
                raise PartitionedError(f"locals[{k}]: {pos} is listed twice")
            local_positions.add(pos)
    first_type: tuple[Any, type] | None = None
    for pos, entry in parts.items():
        data = entry["data"]
        if data is None:
            if "locals" not in d:
                raise PartitionedError(
                    f"partitions[{pos}].data: is None, which only an SPMD view (one with 'locals') may use "
                    "for a part another rank owns"
                )
            if pos in local_positions:
                raise PartitionedError(f"partitions[{pos}].data: is None although {pos} is in locals")
            continue
        if first_type is None:
            first_type = (pos, type(data))
        elif type(data) is not first_type[1]:
            raise PartitionedError(
                f"partitions[{pos}].data: a {type(data).__qualname__}, but partitions[{first_type[0]}].data is a "
                f"{first_type[1].__qualname__}; all partitions must hold one type"
            )


def _check_get(d: dict, require_pickle: bool) -> None:
    """Spec: ``get`` is callable, and the whole dict pickles."""
    if not callable(d["get"]):
        raise PartitionedError(f"get: expected a callable, got {_fmt(d['get'])}")
    if require_pickle:
        try:
            pickle.dumps(d)
        except Exception:
            raise PartitionedError(f"must pickle: {_pickle_culprit(d)}") from None


def _pickle_culprit(d: dict) -> str:
    try:
        pickle.dumps(d["get"])
    except Exception as exc:
        return f"get: {type(exc).__name__}: {exc} (use a module-level callable object, not a lambda)"
    for pos, entry in d["partitions"].items():
        for key in PARTITION_KEYS:
            try:
                pickle.dumps(entry[key])
            except Exception as exc:
                return f"partitions[{pos}].{key}: {type(exc).__name__}: {exc}"
    return "__partitioned__: the dict does not pickle"


def _validate(obj: Any, require_pickle: bool) -> dict:
    d = get_partitioned(obj)
    _check_top_level(d)
    shape, grid = _check_shape_and_tiling(d)
    _check_positions(d["partitions"], grid)
    geometry = _check_entries(d["partitions"], shape)
    tiling.check_tiling(shape, grid, geometry)
    _check_locals_and_data(d)
    _check_get(d, require_pickle)
    return d


def validate(obj: Any, *, require_pickle: bool = False) -> dict:
    """Check ``obj`` (or its ``__partitioned__``) against the spec; return the dict.

    Raises :class:`PartitionedError` naming the offending field, and nothing
    else, whatever it is given.
    """
    try:
        return _validate(obj, require_pickle)
    except PartitionedError:
        raise
    except RecursionError:
        raise PartitionedError("__partitioned__: nested too deeply to check") from None
    except Exception as exc:
        raise PartitionedError(f"__partitioned__: could not be checked: {type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------------- produce


class PartitionedFrame:
    """An in-process frame exposed through ``__partitioned__``.

    Partitions are zero-copy slices of one Arrow table, located in this
    process; ``get`` is :class:`IdentityGet` so the dict pickles.
    """

    def __init__(self, table: pa.Table, grid: tuple[int, int], location: tuple[str, int] | None = None):
        self.table = table
        self.grid = grid
        self._parts = frames.split_grid(table, grid)
        self._location = [tuple(location) if location is not None else this_process()]

    @property
    def shape(self) -> tuple[int, int]:
        return frames.frame_shape(self.table)

    @property
    def __partitioned__(self) -> dict:
        starts = {c.position: c for c in tiling.grid_cells(self.shape, self.grid)}
        return {
            "shape": self.shape,
            "partition_tiling": self.grid,
            "partitions": {
                pos: {
                    "start": starts[pos].start,
                    "shape": starts[pos].shape,
                    "data": part,
                    "location": list(self._location),
                }
                for pos, part in self._parts.items()
            },
            "get": IdentityGet(),
        }

    def to_arrow(self) -> pa.Table:
        return self.table

    def __repr__(self) -> str:
        return f"PartitionedFrame(shape={self.shape}, partition_tiling={self.grid})"


def partitioned(frame: Any, tiling: Sequence[int] = (1, 1), *,
                location: tuple[str, int] | None = None) -> PartitionedFrame:
    """Wrap a pandas, polars or pyarrow frame as a conforming object (located at ``location``, default this process)."""
    grid = tuple(int(t) for t in tiling)
    if len(grid) != 2 or any(t < 1 for t in grid):
        raise PartitionedError(f"partition_tiling: expected (rows, columns) of positive integers, got {tuple(tiling)}")
    return PartitionedFrame(frames.to_arrow(frame), grid, location)


def row_blocks_dict(handles: Sequence[Any], lengths: Sequence[int], ncols: int, locations: Sequence[list],
                    get: Callable) -> dict:
    """A ``__partitioned__`` of one row block per handle (a runtime's partitions in order)."""
    starts = tiling.starts_from_sizes(lengths)
    return {
        "shape": (sum(lengths), ncols),
        "partition_tiling": (len(handles), 1),
        "partitions": {
            (k, 0): {"start": (starts[k], 0), "shape": (lengths[k], ncols), "data": h, "location": list(locations[k])}
            for k, h in enumerate(handles)
        },
        "get": get,
    }


# --------------------------------------------------------------------------- consume


def check_host_locations(d: dict) -> None:
    """Refuse parts on a device other than host memory, which flightpart cannot read."""
    for pos, entry in d["partitions"].items():
        for k, loc in enumerate(entry["location"]):
            if len(loc) == 3 and loc[2] != HOST_DEVICE:
                raise PartitionedError(
                    f"partitions[{pos}].location[{k}]: device {loc[2]!r} is not supported; "
                    f"flightpart reads host memory ({HOST_DEVICE}) only"
                )


def fetch_parts(d: dict, positions: Iterable[tuple[int, ...]]) -> dict[tuple[int, ...], Any]:
    """Raw data objects of the given positions, through the producer's ``get``."""
    positions = list(positions)
    missing = [pos for pos in positions if d["partitions"][pos]["data"] is None]
    if missing:
        raise PartitionedError(
            f"partitions[{missing[0]}].data: is None: the part is not local to this rank "
            f"(locals={list(d.get('locals', []))}); read it on its owner rank or use a non-SPMD view"
        )
    handles = [d["partitions"][pos]["data"] for pos in positions]
    results = d["get"](handles)
    if not isinstance(results, (list, tuple)) or len(results) != len(handles):
        raise PartitionedError(
            f"get: called with {len(handles)} handles, returned {_fmt(results)} instead of {len(handles)} objects"
        )
    return dict(zip(positions, results))


def host_array(raw: Any) -> Any:
    """A part that is no frame but an array in host memory (a torch tensor, say) as NumPy, via DLPack or
    ``__array__``."""
    import numpy as np

    if hasattr(raw, "__dlpack__"):
        try:
            return np.from_dlpack(raw)
        except (TypeError, RuntimeError, BufferError):
            pass
    if hasattr(raw, "__array__"):
        return np.asarray(raw)
    return raw


def part_table(pos: tuple[int, ...], entry: dict, raw: Any) -> pa.Table:
    """One fetched part as a table, checked against its declared shape."""
    if frames.frame_kind(raw) is None:
        raw = host_array(raw)
    if frames.frame_kind(raw) is None:
        raise PartitionedError(
            f"partitions[{pos}].data: get returned a {type(raw).__module__}.{type(raw).__qualname__}, which "
            "flightpart cannot read (expected a pandas, polars or pyarrow frame, or a 1-D/2-D NumPy array)"
        )
    start = entry["start"]
    table = frames.to_arrow(raw, column_offset=start[1] if len(start) > 1 else 0)
    declared = tuple(entry["shape"]) if len(entry["shape"]) == 2 else (entry["shape"][0], 1)
    actual = frames.frame_shape(table)
    if actual != declared:
        raise PartitionedError(f"partitions[{pos}].shape: declared {tuple(entry['shape'])}, but its data "
                               f"has shape {actual}")
    return table


def from_partitioned(obj: Any, *, columns: Sequence[str] | None = None) -> pa.Table:
    """Any conforming producer's data as one ``pyarrow.Table``.

    Works with row and column tilings and parts of pandas, polars, pyarrow
    or NumPy type; raises :class:`PartitionedError` on what it cannot read.
    """
    d = validate(obj)
    if len(d["shape"]) not in (1, 2):
        raise PartitionedError(f"shape: flightpart reads 1-D and 2-D data, got {len(d['shape'])} dimensions")
    check_host_locations(d)
    raw = fetch_parts(d, tiling.grid_positions(d["partition_tiling"]))
    tables = {pos: part_table(pos, d["partitions"][pos], part) for pos, part in raw.items()}
    table = frames.assemble(tables, d["partition_tiling"])
    return select_columns(table, columns)


def select_columns(table: pa.Table, columns: Sequence[str] | None) -> pa.Table:
    """``table`` restricted to ``columns``, with a clear error for unknown names."""
    if columns is None:
        return table
    unknown = [c for c in columns if c not in table.column_names]
    if unknown:
        raise PartitionedError(f"columns: unknown column {unknown[0]!r}; the data has {table.column_names}")
    return table.select(list(columns))
