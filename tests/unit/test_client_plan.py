"""What a view reads is arithmetic on metadata: row blocks, cells and handles of a Plan, with no cluster."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flightpart.client.plan import Block, Plan, narrowed
from flightpart.client.view import View
from flightpart.query.filters import Filter
from flightpart.wire import PartInfo, VersionInfo

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.float64()), ("c", pa.string())])
HOST = (("grpc://127.0.0.2:1", "127.0.0.2", 7),)


def version(rows=(10, 20, 30), groups=((("a",), 1), (("b", "c"), 2)), stats=None) -> VersionInfo:
    """Three row blocks of 10, 20 and 30 rows, in two column groups (a | b, c: how frames.column_groups cuts them);
    ``stats[i]``: block i's statistics."""
    parts, start = [], 0
    for i, n in enumerate(rows):
        col = 0
        for j, (_names, width) in enumerate(groups):
            parts.append(PartInfo((i, j), (start, col), (n, width), HOST, nbytes=100 * n * width,
                                  stats=(stats or {}).get(i) if j == 0 else None))  # a is in group 0
            col += width
        start += n
    return VersionInfo("d", 3, SCHEMA, (start, 3), (len(rows), len(groups)), tuple(parts))


def never_counted(blocks):
    raise AssertionError(f"asked the nodes to count {blocks}")


def test_the_whole_version_reads_every_block_in_every_group():
    plan = Plan(version(), View())
    assert [(b.i, b.rows, b.size) for b in plan.blocks(never_counted, counted=True)] == [(0, None, 10), (1, None, 20),
                                                                                         (2, None, 30)]
    assert plan.groups() == [0, 1] and plan.width() == 3


def test_a_row_range_meets_only_the_blocks_it_crosses_and_cuts_them():
    plan = Plan(version(), View(rows=(15, 35)))
    assert ([(b.i, b.rows, b.size) for b in plan.blocks(never_counted, counted=True)]
            == [(1, (5, 20), 15), (2, (0, 5), 5)])


def test_cells_tile_the_view_and_carry_their_handles():
    plan = Plan(version(), View(rows=(15, 35)))
    grid, cells = plan.cells(never_counted)
    assert grid == (2, 2)
    assert [(c.position, c.start, c.shape) for c in cells] == [((0, 0), (0, 0), (15, 1)), ((0, 1), (0, 1), (15, 2)),
                                                              ((1, 0), (15, 0), (5, 1)), ((1, 1), (15, 1), (5, 2))]
    first = cells[0].ref
    assert (first.dataset, first.version, first.position, first.rows) == ("d", 3, (1, 0), (5, 20))


def test_a_selection_reads_only_its_column_groups():
    plan = Plan(version(), View(columns={1: ("c",)}))
    grid, cells = plan.cells(never_counted)
    assert grid == (3, 1) and {c.info.position[1] for c in cells} == {1}
    assert plan.schema().names == ["c"] and plan.columns_of(1) == ("c",)


def test_a_filter_skips_blocks_its_statistics_rule_out_and_counts_only_the_undecided():
    stats = {0: {"a": {"nulls": 0, "min": 0, "max": 9}}, 1: {"a": {"nulls": 0, "min": 100, "max": 119}}}
    f = Filter.compile(pc.field("a") >= 100, SCHEMA)
    asked = []

    def count(blocks):
        asked.append([b.i for b in blocks])
        return {b.i: 7 for b in blocks}

    plan = Plan(version(stats=stats), View(filter=f))
    blocks = plan.blocks(count, counted=True)
    assert [(b.i, b.size) for b in blocks] == [(1, 20), (2, 7)]  # block 0 cannot match, block 1 all does
    assert asked == [[2]]
    plan.blocks(count, counted=True)
    assert asked == [[2]]  # counted once per view


def test_a_slice_of_a_filtered_view_narrows_the_counted_blocks():
    blocks = [Block(0, None, 4), Block(2, None, 6), Block(5, None, 3)]
    assert ([(b.i, b.size, b.matched) for b in narrowed(blocks, (2, 11))]
            == [(0, 2, (2, 4)), (2, 6, (0, 6)), (5, 1, (0, 1))])


def test_a_filter_on_columns_of_another_group_cannot_be_pushed():
    f = Filter.compile(pc.field("c") == "x", SCHEMA)
    assert not Plan(version(), View(columns={0: ("a",)}, filter=f)).pushable()
    assert Plan(version(), View(filter=f)).pushable() is False  # the view reads group 0 too, which lacks c
    assert Plan(version(), View(columns={1: ("c",)}, filter=f)).pushable()
    assert (Plan(version(), View()).group_with(["b", "c"]) == 1
            and Plan(version(), View()).group_with(["a", "c"]) is None)


def test_views_of_one_version_share_its_pruner():
    shared: dict = {}
    one = Plan(version(), View(), shared)
    other = Plan(version(), View(rows=(0, 1)), shared)
    assert one.pruner() is other.pruner()


@pytest.mark.parametrize("rows", [(0, 0), (60, 60)])
def test_an_empty_row_range_reads_nothing(rows):
    assert Plan(version(), View(rows=rows)).blocks(never_counted, counted=True) == []


def test_a_block_is_cut_into_row_ranges_of_about_the_target_bytes():
    plan = Plan(version(), View())  # block 2: 30 rows, 100 bytes a row in group 0 and 200 in group 1
    block = plan.blocks(never_counted, counted=True)[2]
    assert plan.estimated_bytes(block) == 9_000
    pieces = plan.pieces(block, 2_000)
    assert [(p.i, p.rows, p.size) for p in pieces] == [(2, (0, 6), 6), (2, (6, 12), 6), (2, (12, 18), 6),
                                                       (2, (18, 24), 6), (2, (24, 30), 6)]
    assert plan.pieces(block, 10_000) == [block]


def test_pieces_of_a_row_range_stay_inside_it_and_a_selection_costs_only_its_columns():
    plan = Plan(version(), View(rows=(15, 35), columns={0: ("a",)}))
    first = plan.blocks(never_counted, counted=True)[0]  # rows 5..20 of block 1, group 0 only
    assert plan.estimated_bytes(first) == 1_500
    assert [p.rows for p in plan.pieces(first, 500)] == [(5, 10), (10, 15), (15, 20)]


def test_a_filtered_block_narrowed_to_some_matches_is_never_cut():
    f = Filter.compile(pc.field("a") >= 0, SCHEMA)
    plan = Plan(version(), View(filter=f, matched=(0, 3)))
    block = Block(2, None, 3, matched=(0, 3))
    assert plan.pieces(block, 1) == [block]
