"""Which stored rows and columns make each partition of a new grid: repartition, rebalance and append.

Pure arithmetic over a version's geometry, so the client (which plans) and the node (which assembles and must
not trust the plan blindly) agree. A target partition is its global row range and its column group's columns
(:func:`flightpart.frames.stored_columns`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .tiling import blocks_meeting, starts_from_sizes


@dataclass(frozen=True)
class Piece:
    """Rows ``[rows[0], rows[1])`` (local to the source partition) of ``columns`` of source partition ``source``."""

    source: tuple[int, int]
    rows: tuple[int, int]
    columns: tuple[str, ...]


def pieces_of(rows: tuple[int, int], columns: Sequence[str], row_sizes: Sequence[int],
              groups: Sequence[Sequence[str]], row_starts: Sequence[int] | None = None) -> list[list[Piece]]:
    """The source pieces of a target partition (global ``rows``, stored ``columns``), per source row block in order,
    over a source grid of ``row_sizes`` and ``groups`` (``row_starts``: their prefix sums, if at hand). Each column is
    taken from the first group storing it; an empty target has no pieces."""
    wanted = list(dict.fromkeys(columns))
    owner: dict[str, int] = {}
    for j, group in enumerate(groups):
        for c in group:
            owner.setdefault(c, j)
    missing = [c for c in wanted if c not in owner]
    if missing:
        raise ValueError(f"column {missing[0]!r} is in no column group of the source")
    by_group: dict[int, list[str]] = {}
    for c in wanted:
        by_group.setdefault(owner[c], []).append(c)
    starts = starts_from_sizes(row_sizes) if row_starts is None else row_starts
    return [[Piece((i, j), (a, z), tuple(cols)) for j, cols in sorted(by_group.items())]
            for i, a, z in blocks_meeting(starts, row_sizes, *rows)]


def is_whole(pieces: list[list[Piece]], row_sizes: Sequence[int], groups: Sequence[Sequence[str]]) -> Piece | None:
    """The one source partition a target is exactly (all its rows, its columns in order), or None; such a target is
    linked, not copied."""
    if len(pieces) != 1 or len(pieces[0]) != 1:
        return None
    piece = pieces[0][0]
    i, j = piece.source
    whole = piece.rows == (0, row_sizes[i]) and list(piece.columns) == list(groups[j])
    return piece if whole else None


def balanced(sizes: Mapping[tuple[int, int], int], holders: Mapping[tuple[int, int], Sequence[str]],
             nodes: Sequence[str]) -> dict[tuple[int, int], list[str]]:
    """New holders so that bytes per node differ by at most one partition, moving as little as it can (a holder not in
    ``nodes`` is gone). Greedy: the largest partition that narrows the gap moves from the most to the least loaded
    node. It ends, since every move lowers the sum of squared loads."""
    load = dict.fromkeys(nodes, 0)
    placed: dict[tuple[int, int], list[str]] = {}
    orphans = []
    for pos in sorted(sizes):
        kept = [n for n in dict.fromkeys(holders.get(pos, ())) if n in load]
        placed[pos] = kept
        for n in kept:
            load[n] += sizes[pos]
        orphans.extend([pos] * (max(len(holders.get(pos, ())), 1) - len(kept)))
    for pos in sorted(orphans, key=lambda p: -sizes[p]):
        free = [n for n in nodes if n not in placed[pos]]
        if free:
            target = min(free, key=lambda n: (load[n], nodes.index(n)))
            placed[pos].append(target)
            load[target] += sizes[pos]
    largest = max(sizes.values(), default=0)
    while True:
        heavy = max(nodes, key=lambda n: (load[n], -nodes.index(n)))
        light = min(nodes, key=lambda n: (load[n], nodes.index(n)))
        gap = load[heavy] - load[light]
        if gap <= largest:
            break
        movable = [p for p, h in placed.items() if heavy in h and light not in h and 0 < sizes[p] < gap]
        if not movable:
            break
        pos = max(movable, key=lambda p: (sizes[p], p))
        placed[pos] = [light if n == heavy else n for n in placed[pos]]
        load[heavy] -= sizes[pos]
        load[light] += sizes[pos]
    return placed


def near_placement(weights: Sequence[Mapping[str, int]], nodes: Sequence[str], replicas: int) -> list[list[str]]:
    """For each new partition, ``replicas`` distinct nodes, preferring those holding most of its source bytes
    (``weights``), none past its share (partitions times replicas over nodes, rounded up)."""
    cap = -(-len(weights) * replicas // max(len(nodes), 1))
    count = dict.fromkeys(nodes, 0)
    order = {n: k for k, n in enumerate(nodes)}
    out = []
    for k, weight in enumerate(weights):
        ranked = sorted(nodes,
                        key=lambda n: (count[n] >= cap, -weight.get(n, 0), count[n], (order[n] - k) % len(nodes)))
        chosen = ranked[:replicas]
        for n in chosen:
            count[n] += 1
        out.append(chosen)
    return out
