"""The Dist RFC's partitioning rules, checked against brute force."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flightpart as fp
from flightpart import tiling


@pytest.mark.parametrize(
    "n,parts,sizes",
    [(8, 4, [2, 2, 2, 2]), (8, 3, [2, 3, 3]), (44, 4, [11, 11, 11, 11]), (2, 4, [0, 0, 1, 1]), (0, 2, [0, 0])],
)
def test_block_sizes_put_extras_last(n, parts, sizes):
    assert tiling.block_sizes(n, parts) == sizes


def test_default_partition_examples():
    assert fp.default_partition(3, 0, (8, 5)) == ((0, 0), (2, 5))
    assert fp.default_partition(3, 1, (8, 5)) == ((2, 0), (3, 5))
    assert fp.default_partition(3, 2, (8, 5)) == ((5, 0), (3, 5))
    assert fp.default_partition(4, 2, (44,)) == ((22,), (11,))


@pytest.mark.parametrize("args", [(0, 0, (8,)), (2, 2, (8,)), (2, -1, (8,))])
def test_default_partition_bad_input(args):
    with pytest.raises(ValueError):
        fp.default_partition(*args)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 200), st.integers(1, 17))
def test_default_partition_covers_and_balances(n, procs):
    parts = [fp.default_partition(procs, r, (n, 3)) for r in range(procs)]
    sizes = [shape[0] for _, shape in parts]
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes)
    assert [off[0] for off, _ in parts] == tiling.starts_from_sizes(sizes)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 30), st.integers(0, 30),  # part start, shape
    st.integers(0, 40), st.integers(0, 20), st.integers(1, 5),  # slice offset, size, stride
)
def test_local_target_of_slice_matches_brute_force(p0, pn, off, size, stride):
    (loff,), (lsize,) = fp.local_target_of_slice((p0,), (pn,), (off,), (size,), (stride,))
    inside = [off + k * stride - p0 for k in range(size) if p0 <= off + k * stride < p0 + pn]
    assert lsize == len(inside)
    if inside:
        assert loff == inside[0]


def test_local_target_of_slice_2d():
    # part rows 10..20, cols 0..8; slice rows 15..25 step 2, cols 2..5
    assert fp.local_target_of_slice((10, 0), (10, 8), (15, 2), (5, 3), (2, 1)) == ((5, 2), (3, 3))
    assert fp.local_target_of_slice((10, 0), (10, 8), (30, 2), (5, 3), (1, 1)) == ((0, 0), (0, 3))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=6), st.integers(0, 8), st.integers(0, 8), st.booleans())
def test_halo_sources_match_brute_force(sizes, left, right, periodic):
    total = sum(sizes)
    starts = tiling.starts_from_sizes(sizes)
    owner_of = {g: (b, g - s) for b, (s, n) in enumerate(zip(starts, sizes)) for g in range(s, s + n)}
    result = tiling.halo_sources(sizes, left, right, periodic=periodic)
    for b, (s, n) in enumerate(zip(starts, sizes)):
        for side, lo, hi in (("left", s - left, s), ("right", s + n, s + n + right)):
            want = []
            for g in range(lo, hi):
                if periodic and total:
                    want.append(owner_of[g % total])
                elif 0 <= g < total:
                    want.append(owner_of[g])
            got = [(p.owner, r) for p in result[b] if p.side == side for r in range(p.start, p.stop)]
            assert got == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=8), st.integers(-3, 40), st.integers(0, 40))
def test_blocks_meeting_a_range_match_brute_force(sizes, lo, width):
    starts = tiling.starts_from_sizes(sizes)
    want: dict[int, list[int]] = {}
    for b, (s, n) in enumerate(zip(starts, sizes)):
        for g in range(max(lo, s), min(lo + width, s + n)):
            want.setdefault(b, []).append(g - s)
    got = {b: list(range(a, z)) for b, a, z in tiling.blocks_meeting(starts, sizes, lo, lo + width)}
    assert got == want


def test_halo_widths_must_be_non_negative():
    with pytest.raises(ValueError):
        tiling.halo_sources([4, 4], -1, 0)


def test_local_bounding_box_hull_and_intersection():
    # view: source rows 10, 12, 14, ... (stride 2), 8 elements; target result rows 2..5
    assert tiling.local_bounding_box((10,), (8,), (2,), (2,), (4,)) == ((14,), (7,))
    hull = tiling.local_bounding_box((10,), (8,), (2,), (2,), (4,), bb=((0,), (5,)))
    assert hull == ((0,), (21,))
    inner = tiling.local_bounding_box((10,), (8,), (2,), (2,), (4,), bb=((16,), (10,)), inner=True)
    assert inner == ((16,), (5,))
    assert tiling.local_bounding_box((10,), (8,), (2,), (9,), (4,)) == ((10,), (0,))


def test_grid_cells_row_major():
    cells = tiling.grid_cells((8, 5), (3, 2))
    assert [c.position for c in cells][:3] == [(0, 0), (0, 1), (1, 0)]
    assert cells[-1].start == (5, 2) and cells[-1].shape == (3, 3)
