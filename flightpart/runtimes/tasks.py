"""What every runtime's tasks do: read a row block, send a partition, pick a node by IP.

A read task gets a picklable :class:`RowBlock` and a :class:`BlockReader`, which reads flightpart handles
with the task's own host deciding locality and other producers' handles through their ``get``. Puts run
:func:`send_from_worker` where the data is. Runtimes import this, never each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flightpart import frames, protocol
from flightpart.client.fetch import FlightGet, PartitionRef, read_partitions
from flightpart.errors import PartitionedError
from flightpart.io.access import Access
from flightpart.io.connections import shared_pool
from flightpart.io.transfer import PutCall, SentPart, send_partition
from flightpart.wire import ROW_NUMBER, NodeRow


@dataclass(frozen=True)
class RowBlock:
    """The handles of one row block (one per column group), and where it starts."""

    index: int
    start: int
    rows: int
    handles: tuple
    column_starts: tuple[int, ...]
    hosts: tuple[str, ...] = ()

    def __dask_tokenize__(self) -> tuple:
        """Plain values for Dask's token (see :meth:`PartitionRef.__dask_tokenize__`)."""
        return ("flightpart.RowBlock", self.index, self.start, self.rows, self.handles, self.column_starts, self.hosts)


def row_blocks(d: dict) -> list[RowBlock]:
    """The row blocks of a validated 1-D or 2-D ``__partitioned__``, in order."""
    grid = d["partition_tiling"]
    p, q = (grid[0], grid[1]) if len(grid) == 2 else (grid[0], 1)
    blocks = []
    for i in range(p):
        positions = [(i, j) if len(grid) == 2 else (i,) for j in range(q)]
        entries = [d["partitions"][pos] for pos in positions]
        for pos, e in zip(positions, entries):
            if e["data"] is None:
                raise PartitionedError(f"partitions[{pos}].data: is None; an SPMD view cannot be read "
                                       "by a task runtime")
        hosts = tuple(dict.fromkeys(loc[0] for e in entries for loc in e["location"]))
        blocks.append(RowBlock(i, entries[0]["start"][0], entries[0]["shape"][0], tuple(e["data"] for e in entries),
                               tuple(e["start"][1] if len(e["start"]) > 1 else 0 for e in entries), hosts))
    return blocks


AUTO_DETECT = "*"


class BlockReader:
    """Picklable: reads a :class:`RowBlock` as an Arrow table.

    The host deciding locality is resolved in the task: ``host_of_task`` returns its address,
    :data:`AUTO_DETECT` for the addresses of the machine it runs on, or None in the driver (whose ``host=``
    applies).
    """

    def __init__(self, get: Callable, columns: Sequence[str] | None = None,
                 group_columns: Sequence[Sequence[str]] | None = None,
                 host_of_task: Callable[[], str | None] | None = None, filter: bytes | None = None,
                 row_numbers: bool = False):
        self.get = get
        self.columns = list(columns) if columns is not None else None
        self.group_columns = [list(g) for g in group_columns] if group_columns is not None else None
        self.host_of_task = host_of_task
        self.filter = filter  # Substrait: the nodes send only the rows it keeps (flightpart handles only)
        self.row_numbers = row_numbers  # each row comes with its position in its partition (wire.ROW_NUMBER)

    def project(self, columns: Sequence[str] | None) -> "BlockReader":
        return BlockReader(self.get, columns, self.group_columns, self.host_of_task, self.filter, self.row_numbers)

    def filtered(self, substrait: bytes, row_numbers: bool) -> "BlockReader":
        """This reader with a row filter applied where the data is (handles of flightpart datasets only)."""
        return BlockReader(self.get, self.columns, self.group_columns, self.host_of_task, substrait, row_numbers)

    def read(self, block: RowBlock) -> pa.Table:
        handles = list(block.handles)
        keep = list(range(len(handles)))
        if isinstance(self.get, FlightGet) and all(isinstance(h, PartitionRef) for h in handles):
            if self.filter is not None:
                handles = [h.asking(filter=self.filter, row_numbers=self.row_numbers) for h in handles]
            if self.columns is not None and self.group_columns is not None:
                wanted = [[c for c in group if c in self.columns] for group in self.group_columns]
                keep = [j for j, w in enumerate(wanted) if w] or [0]
                handles = [handles[j].asking(columns=tuple(wanted[j]) if wanted[j] else None) for j in keep]
            host = self.host_of_task() if self.host_of_task else None
            host = self.get.host if host is None else (None if host == AUTO_DETECT else host)
            tables = read_partitions(handles, host=host, pool=self.get.pool(), idle_timeout=self.get.idle_timeout,
                                     compression=self.get.compression, expected_columns=self.get.expected_columns)
        else:
            raw = self.get(handles)
            tables = [frames.to_arrow(r, column_offset=block.column_starts[j]) for j, r in zip(keep, raw)]
        table = frames.assemble({(0, k): t for k, t in enumerate(tables)}, (1, len(tables)))
        if self.columns is not None:
            index_cols = [c for c in table.column_names if c not in frames.data_columns(table)]
            kept = self.columns + [c for c in index_cols if c not in self.columns]
            table = protocol.select_columns(table, kept + ([ROW_NUMBER] if self.row_numbers else []))
        return table


def group_columns_of(schema: pa.Schema, q: int) -> list[list[str]]:
    """The column groups a flightpart dataset of ``schema`` was cut into."""
    data = frames.data_columns(frames.empty_table(schema))
    index_cols = [c for c in schema.names if c not in data]
    return [g + index_cols for g in frames.column_groups(data, q)]


def global_range_index(schema: pa.Schema | None) -> bool:
    """Whether row positions can serve as the index (no pandas index stored)."""
    meta = (schema.pandas_metadata if schema is not None else None) or {}
    stored = [c for c in meta.get("index_columns", []) if not isinstance(c, dict)]
    return not stored


def stored_range(schema: pa.Schema | None, rows: int) -> tuple[int, int, Any]:
    """The pandas RangeIndex (start, step, name) a frame was put with, which row positions map to, while it
    spans the dataset's ``rows`` as ``to_pandas()`` restores it; ``(0, 1, None)`` (positions) otherwise."""
    meta = (schema.pandas_metadata if schema is not None else None) or {}
    ranges = [c for c in meta.get("index_columns", []) if isinstance(c, dict) and c.get("kind") == "range"]
    if len(ranges) != 1:
        return 0, 1, None
    try:
        start, stop, step = (int(ranges[0].get(key, default)) for key, default in
                             (("start", 0), ("stop", rows), ("step", 1)))
        spans = step != 0 and len(range(start, stop, step)) == rows
    except (TypeError, ValueError, OverflowError):  # metadata a writer made up: positions, as pandas would fall back
        return 0, 1, None
    return (start, step, ranges[0].get("name")) if spans else (0, 1, None)


def divisions_for(blocks: Sequence[RowBlock], start: int = 0, step: int = 1) -> tuple | None:
    """Known divisions from row starts (each the index of its first row: ``start + position * step``), when every
    block has rows and the index grows."""
    if not blocks or any(b.rows == 0 for b in blocks) or step <= 0:
        return None
    return tuple(start + b.start * step for b in blocks) + (start + (blocks[-1].start + blocks[-1].rows - 1) * step,)


# --------------------------------------------------------------------------- puts


def send_from_worker(frame: Any, uri: str, access: Access, name: str, version: int, part: tuple[int, int],
                     grant: str | None = None) -> SentPart:
    """Runs where ``frame`` is (a Dask worker, a Ray task): one partition to the node ``uri``.

    ``access`` arrives pickled without the client's private key; a worker presents its own client certificate,
    if any, from its environment. ``grant``: the catalog's leave to write ``version`` (decision 0015).
    """
    table = frames.to_arrow(frame)
    send_partition(shared_pool(access), uri, name, version, part, table, PutCall(grant=grant))
    rows, cols = frames.frame_shape(table)
    return SentPart(rows, cols, table.schema)


def node_for(hosts: Sequence[str], nodes: Sequence[NodeRow], index: int) -> NodeRow:
    """The flightpart node on one of ``hosts`` (the data's own host), else round-robin by ``index``."""
    by_ip: dict[str, NodeRow] = {}
    for n in nodes:
        by_ip.setdefault(n.ip, n)
    local = [by_ip[h] for h in hosts if h in by_ip]
    return local[0] if local else nodes[index % len(nodes)]


def host_of(address: str) -> str:
    """The host of a worker address (``tcp://127.0.0.2:40001``, ``inproc://10.0.0.5/77/3``, ...)."""
    try:
        from distributed.comm.addressing import get_address_host

        return get_address_host(address)
    except (ImportError, ValueError):
        return address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
