"""What a derived dataset differs by: one immutable value, so a view is the same face with another View."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class View:
    """The selection a Dataset reads: column groups, a row range, a filter, an SPMD rank, a halo, an order. Frozen, so
    deriving a view never changes its dataset."""

    columns: dict[int, tuple[str, ...]] | None = None  # column group -> selected columns (None: all)
    rows: tuple[int, int] | None = None  # rows of the dataset, before the filter
    spmd: tuple[int, int] | None = None  # (rank, nranks)
    order: tuple[str, ...] | None = None  # the user's column order after select()
    filter: Any = None
    matched: tuple[int, int] | None = None  # a range of the rows the filter keeps
    halo: Any = None

    def replace(self, **changes: Any) -> "View":
        """This view with ``changes``; an unknown field is a TypeError, not a silent new attribute."""
        if "order" in changes and changes["order"] is not None:
            changes["order"] = tuple(changes["order"])
        return dataclasses.replace(self, **changes)

    @property
    def rank(self) -> int | None:
        """This view's SPMD rank, None outside SPMD."""
        return self.spmd[0] if self.spmd else None

    @property
    def nranks(self) -> int | None:
        """How many SPMD ranks share the dataset, None outside SPMD."""
        return self.spmd[1] if self.spmd else None
