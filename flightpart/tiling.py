"""Grid arithmetic of the Dist dialect RFC, free of any I/O.

Everything here works on plain integers and tuples so that the protocol
validator, the client and the server agree on one definition of how a global
index space is cut, how a slice meets a partition and which neighbour rows a
halo needs.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, product

from .errors import PartitionedError


def block_sizes(n: int, parts: int) -> list[int]:
    """Sizes of ``parts`` blocks over ``n`` elements, the RFC's default.

    Sizes differ by at most one and the larger blocks are the *last* ones:
    8 over 3 gives ``[2, 3, 3]``.
    """
    if parts < 1:
        raise ValueError(f"parts: expected an integer >= 1, got {parts!r}")
    if n < 0:
        raise ValueError(f"n: expected an integer >= 0, got {n!r}")
    base, extra = divmod(n, parts)
    return [base + (1 if k >= parts - extra else 0) for k in range(parts)]


def starts_from_sizes(sizes: Sequence[int]) -> list[int]:
    """Offsets of consecutive blocks: the prefix sums, starting at 0."""
    return [0, *accumulate(sizes)][: len(sizes)]


def blocks_meeting(starts: Sequence[int], sizes: Sequence[int], lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
    """``(block, first, stop)``: the local rows of every block that meets global rows ``[lo, hi)``, in order.

    ``starts`` are the blocks' first rows (sorted, as :func:`starts_from_sizes`
    gives them). A binary search finds the first block, so this costs
    O(log P) plus the blocks met, not a pass over every block.
    """
    k = max(bisect_right(starts, lo) - 1, 0)
    while k < len(starts) and starts[k] < hi:
        a, z = max(lo, starts[k]), min(hi, starts[k] + sizes[k])
        if a < z:
            yield k, a - starts[k], z - starts[k]
        k += 1


def default_partition(nprocs: int, rank: int, gshape: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``dist.default_partition``: the local offsets and shape of ``rank``.

    The first dimension is cut in ``nprocs`` blocks by :func:`block_sizes`;
    other dimensions are not cut.
    """
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs: expected an integer >= 1, got {nprocs!r}")
    if not isinstance(rank, int) or not 0 <= rank < nprocs:
        raise ValueError(f"rank: expected an integer in [0, {nprocs}), got {rank!r}")
    gshape = tuple(int(s) for s in gshape)
    if not gshape:
        return (), ()
    sizes = block_sizes(gshape[0], nprocs)
    offsets = (starts_from_sizes(sizes)[rank],) + (0,) * (len(gshape) - 1)
    return offsets, (sizes[rank],) + gshape[1:]


@dataclass(frozen=True)
class Cell:
    """One partition of a regular grid: its grid position, start and shape."""

    position: tuple[int, ...]
    start: tuple[int, ...]
    shape: tuple[int, ...]


def grid_cells(shape: Sequence[int], tiling: Sequence[int]) -> list[Cell]:
    """All cells of ``shape`` cut by ``tiling``, in row-major grid order."""
    if len(shape) != len(tiling):
        raise ValueError(f"tiling {tuple(tiling)} must have as many entries as shape {tuple(shape)}")
    sizes = [block_sizes(n, t) for n, t in zip(shape, tiling)]
    starts = [starts_from_sizes(s) for s in sizes]
    return [
        Cell(pos, tuple(starts[d][k] for d, k in enumerate(pos)), tuple(sizes[d][k] for d, k in enumerate(pos)))
        for pos in product(*(range(t) for t in tiling))
    ]


def grid_positions(tiling: Sequence[int]) -> list[tuple[int, ...]]:
    """Every position of a grid, row-major."""
    return list(product(*(range(t) for t in tiling)))


def position_at(index: int, tiling: Sequence[int]) -> tuple[int, ...]:
    """The row-major ``index``-th position of a grid, without enumerating it."""
    pos = []
    for t in reversed(tiling):
        index, k = divmod(index, t)
        pos.append(k)
    return tuple(reversed(pos))


Geometry = Mapping[tuple[int, ...], tuple[Sequence[int], Sequence[int]]]


def check_tiling(shape: Sequence[int], tiling: Sequence[int], geometry: Geometry) -> None:
    """Partitions tile ``shape`` exactly: no gap, no overlap, slabs aligned.

    ``geometry`` maps every grid position to its (start, shape). Along each
    axis, the partitions of one slab (same index on that axis) share their
    start and extent, and slab starts are the prefix sums of slab extents.
    One pass per axis: O(P * ndim), so 100,000 partitions check in well
    under a second. Raises :class:`PartitionedError` naming the partition.
    """
    for axis, (n, t) in enumerate(zip(shape, tiling)):
        first: dict[int, tuple[int, ...]] = {}
        for pos, (p_start, p_shape) in geometry.items():
            k = pos[axis]
            head = first.get(k)
            if head is None:
                first[k] = pos
                continue
            f_start, f_shape = geometry[head]
            if p_shape[axis] != f_shape[axis]:
                raise PartitionedError(
                    f"partitions[{pos}].shape[{axis}]: {p_shape[axis]} differs from {f_shape[axis]} of "
                    f"partitions[{head}]; partitions in one grid slab must have the same extent"
                )
            if p_start[axis] != f_start[axis]:
                raise PartitionedError(
                    f"partitions[{pos}].start[{axis}]: {p_start[axis]} differs from {f_start[axis]} of "
                    f"partitions[{head}]; partitions in one grid slab must start together"
                )
        expected_start = 0
        for k in range(t):
            head = first[k]
            f_start, f_shape = geometry[head]
            if f_start[axis] != expected_start:
                kind = "gap" if f_start[axis] > expected_start else "overlap"
                raise PartitionedError(
                    f"partitions[{head}].start[{axis}]: expected {expected_start} (the prefix sum of the shapes "
                    f"before it along axis {axis}), got {f_start[axis]}: the partitions {kind}"
                )
            expected_start += f_shape[axis]
        if expected_start != n:
            raise PartitionedError(f"partitions: extents along axis {axis} add up to {expected_start}, but "
                                   f"shape[{axis}] is {n}")


def _slice_meets_interval(offset: int, size: int, stride: int, lo: int, hi: int) -> tuple[int, int]:
    """First element index k and count of ``offset + k*stride`` (k < size) in [lo, hi)."""
    if size <= 0 or hi <= lo:
        return 0, 0
    last = offset + (size - 1) * stride
    if last < lo or offset >= hi:
        return 0, 0
    k_first = max(0, -(-(lo - offset) // stride))
    k_last = min(size - 1, (hi - 1 - offset) // stride)
    if k_last < k_first:
        return 0, 0
    return k_first, k_last - k_first + 1


def local_target_of_slice(
    part_start: Sequence[int],
    part_shape: Sequence[int],
    offsets: Sequence[int],
    sizes: Sequence[int],
    strides: Sequence[int] | None = None,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``dist.local_target_of_slice``: a global slice met with one local part.

    The slice is the triplet (offsets, sizes, strides) in global indices. The
    result is (local offsets, local sizes) relative to the part's first
    element; a part the slice misses gets sizes of 0 (offsets then 0).
    """
    strides = tuple(strides) if strides is not None else (1,) * len(offsets)
    if not len(part_start) == len(part_shape) == len(offsets) == len(sizes) == len(strides):
        raise ValueError("part_start, part_shape, offsets, sizes and strides must have the same length")
    if any(s < 1 for s in strides):
        raise ValueError(f"strides: expected positive integers, got {tuple(strides)}")
    out_off, out_size = [], []
    for s0, n, off, sz, st in zip(part_start, part_shape, offsets, sizes, strides):
        k, count = _slice_meets_interval(off, sz, st, s0, s0 + n)
        out_off.append(off + k * st - s0 if count else 0)
        out_size.append(count)
    if 0 in out_size:
        return (0,) * len(out_off), tuple(out_size)
    return tuple(out_off), tuple(out_size)


@dataclass(frozen=True)
class HaloPiece:
    """Rows ``[start, stop)`` (local to ``owner``) that another part copies as halo."""

    side: str  # "left" or "right"
    owner: int
    start: int
    stop: int


def halo_sources(sizes: Sequence[int], left: int, right: int, *, periodic: bool = False) -> list[list[HaloPiece]]:
    """For each block of a 1-D cut, which neighbour rows fill its halos.

    ``sizes`` are the block sizes along the cut dimension; ``left``/``right``
    the halo widths. A halo wider than its neighbour reaches further
    neighbours; at the global edges a non-periodic halo is simply shorter.
    """
    if left < 0 or right < 0:
        raise ValueError(f"halo widths must be >= 0, got ({left}, {right})")
    starts = starts_from_sizes(sizes)
    total = sum(sizes)
    result = []
    for s0, n in zip(starts, sizes):
        pieces: list[HaloPiece] = []
        for side, lo, hi in (("left", s0 - left, s0), ("right", s0 + n, s0 + n + right)):
            for g_lo, g_hi in _wrap(lo, hi, total, periodic):
                pieces.extend(HaloPiece(side, owner, a, z) for owner, a, z in blocks_meeting(starts, sizes, g_lo, g_hi))
        result.append(pieces)
    return result


def _wrap(lo: int, hi: int, total: int, periodic: bool) -> list[tuple[int, int]]:
    """Global ranges a halo covers, split at the edges when periodic."""
    if hi <= lo or total == 0:
        return []
    if not periodic:
        return [(max(lo, 0), min(hi, total))] if max(lo, 0) < min(hi, total) else []
    out = []
    g = lo
    while g < hi:  # one range per lap around the ends, not one step per row
        w = g % total
        take = min(hi - g, total - w)
        out.append((w, w + take))
        g += take
    return out


def local_bounding_box(
    offsets: Sequence[int],
    sizes: Sequence[int],
    strides: Sequence[int],
    target_offsets: Sequence[int],
    target_sizes: Sequence[int],
    bb: tuple[Sequence[int], Sequence[int]] | None = None,
    *,
    inner: bool = False,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``dist.local_bounding_box``: source rows a view needs for a target.

    The view maps result index ``k`` to source index ``offsets + k*strides``;
    the target is the region ``[target_offsets, +target_sizes)`` of the
    result computed locally. Returns the global (offsets, shape) of the source
    region needed, merged with ``bb`` as convex hull (or intersection when
    ``inner``).
    """
    lo_out, size_out = [], []
    for off, sz, st, t0, tn in zip(offsets, sizes, strides, target_offsets, target_sizes):
        k0, k1 = max(t0, 0), min(t0 + tn, sz)
        if k1 <= k0:
            lo_out.append(off)
            size_out.append(0)
        else:
            lo_out.append(off + k0 * st)
            size_out.append((k1 - 1 - k0) * st + 1)
    if bb is None:
        return tuple(lo_out), tuple(size_out)
    merged_lo, merged_size = [], []
    for a0, an, b0, bn in zip(lo_out, size_out, bb[0], bb[1]):
        if inner:
            lo, hi = max(a0, b0), min(a0 + an, b0 + bn)
            merged_lo.append(lo)
            merged_size.append(max(hi - lo, 0))
        elif an == 0 or bn == 0:
            merged_lo.append(b0 if an == 0 else a0)
            merged_size.append(bn if an == 0 else an)
        else:
            lo, hi = min(a0, b0), max(a0 + an, b0 + bn)
            merged_lo.append(lo)
            merged_size.append(hi - lo)
    return tuple(merged_lo), tuple(merged_size)
