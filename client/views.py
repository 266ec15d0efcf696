"""``__partitioned__`` in the forms consumers expect that are not the spec's (xgboost_ray: pandas and IPs; heat:
ranks and NumPy), through a picklable :class:`PartitionedView`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flightpart import frames as frame_kinds
from flightpart.distarray import numeric_matrix
from flightpart.errors import PartitionedError
from flightpart.tiling import default_partition

FRAMES = ("arrow", "pandas", "numpy")
LOCATIONS = ("spec", "ip", "rank")


class ConvertingGet:
    """A ``get`` whose Arrow tables come back as pandas frames or 2-D NumPy arrays. ``categories`` (pandas): those
    text columns become categoricals with one list shared by every partition, so concatenated parts stay
    categorical; with ``codes``, their integer codes (-1: not in the list)."""

    def __init__(self, get: Any, frames: str, categories: dict[str, list] | None = None, codes: bool = False):
        self.get = get
        self.frames = frames
        self.categories = categories or {}
        self.codes = codes

    def __call__(self, handles: Any) -> Any:
        single = not isinstance(handles, (list, tuple))
        tables = self.get(handles)
        return self.convert(tables) if single else [self.convert(t) for t in tables]

    def convert(self, table: Any) -> Any:
        if self.frames == "pandas":
            import pandas as pd  # here, not at import: the daemons and a pyarrow-only client run without pandas

            frame = frame_kinds.to_pandas(frame_kinds.drop_pandas_index(table))
            for column, values in self.categories.items():
                if column in frame.columns:
                    category = pd.Categorical(frame[column], categories=values)
                    frame[column] = category.codes if self.codes else category
            return frame
        if self.frames == "numpy":
            return numeric_matrix(table)
        return table


class RowsGet:
    """``get`` of a view with one partition per rank: a handle is a dataset row range ``(start, stop)``, read from the
    stored partitions holding it and converted as ``frames`` says."""

    def __init__(self, dataset: Any, frames: str):
        self.dataset = dataset
        self.frames = frames
        self.convert = ConvertingGet(None, frames).convert

    def __reduce__(self):
        return (RowsGet, (self.dataset, self.frames))

    def __call__(self, handles: Any) -> Any:
        if isinstance(handles, list):
            return [self(h) for h in handles]
        start, stop = handles
        return self.convert(self.dataset[start:stop].to_arrow())


class PartitionedView:
    """A dataset's ``__partitioned__`` with parts as ``frames`` and locations as ``location`` says.

    ``location``: ``"spec"`` (``(IP, PID)`` pairs), ``"ip"`` (IP strings, mapped by ``ip_of``) or ``"rank"`` (SPMD:
    ``[owner rank]``). ``one_per_rank`` (SPMD): one partition per rank over all columns, as the Dist RFC's default
    partition gives, whatever the stored tiling.
    """

    def __init__(self, dataset: Any, frames: str = "arrow", location: str = "spec",
                 ip_of: Callable[[str], str] | None = None, *, one_per_rank: bool = False,
                 categories: dict[str, list] | None = None, codes: bool = False):
        if frames not in FRAMES:
            raise ValueError(f"frames must be one of {FRAMES}, got {frames!r}")
        if location not in LOCATIONS:
            raise ValueError(f"location must be one of {LOCATIONS}, got {location!r}")
        if location == "rank" and dataset.rank is None:
            raise PartitionedError("location='rank' needs the SPMD view: client.open(name, rank=r, nranks=n)")
        if one_per_rank and location != "rank":
            raise ValueError("one_per_rank regroups the grid by rank: pass location='rank'")
        self.dataset = dataset
        self.frames = frames
        self.location = location
        self.ip_of = ip_of
        self.one_per_rank = one_per_rank
        if categories and frames != "pandas":
            raise ValueError("categories are pandas categoricals: pass frames='pandas'")
        self.categories = categories
        self.codes = codes

    @property
    def shape(self) -> tuple[int, int]:
        return self.dataset.shape

    @property
    def __partitioned__(self) -> dict:
        if self.one_per_rank:
            return self._per_rank()
        d = dict(self.dataset.__partitioned__)
        nranks = self.dataset.nranks
        parts = {}
        for pos, entry in d["partitions"].items():
            entry = dict(entry)
            if self.location == "ip":
                entry["location"] = [self.ip_of(ip) if self.ip_of else ip for ip, *_ in entry["location"]]
            elif self.location == "rank":
                entry["location"] = [pos[0] % nranks]  # the rank whose view holds the part (Dataset.__partitioned__)
            parts[pos] = entry
        d["partitions"] = parts
        if self.frames != "arrow":
            d["get"] = ConvertingGet(d["get"], self.frames, self.categories, self.codes)
        return d

    def _per_rank(self) -> dict:
        """One row block per rank over every column; only this rank's ``data`` is set."""
        rank, nranks = self.dataset.rank, self.dataset.nranks
        whole = self.dataset.global_view()
        rows, cols = whole.shape
        parts = {}
        for r in range(nranks):
            (start, _), (size, _) = default_partition(nranks, r, (rows, cols))
            parts[(r, 0)] = {"start": (start, 0), "shape": (size, cols),
                             "data": (start, start + size) if r == rank else None, "location": [r]}
        return {"shape": (rows, cols), "partition_tiling": (nranks, 1), "partitions": parts, "locals": [(rank, 0)],
                "get": RowsGet(whole, self.frames)}

    def __repr__(self) -> str:
        return f"PartitionedView({self.dataset!r}, frames={self.frames!r}, location={self.location!r})"
