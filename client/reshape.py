"""New versions made on the nodes from a committed one: repartition, rebalance, and the kept part of an append.

The client plans which node holds each new partition and its global rows; each node gathers its partitions from
the source's holders (``assemble``, linking one it already holds whole), and the client commits the receipts.
No partition byte passes through this process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import frames
from flightpart.errors import NodeUnavailable, RequestRejected, SchemaMismatch
from flightpart.frames import widens_losslessly
from flightpart.io.connections import DEFAULT_TIMEOUT, ConnectionPool
from flightpart.io.errors import translated
from flightpart.io.transfer import put_deadline
from flightpart.tiling import blocks_meeting, starts_from_sizes
from flightpart.wire import Assemble, AssemblePart, CommitPart, LinkPart, NodeRow, Relink, VersionInfo

ORDER_PARTS = 256
"""Partitions per ``assemble`` order: a bounded call that reports progress in steps a user can wait for."""


def assemble_on_nodes(pool: ConnectionPool, source: VersionInfo, version: int, groups: int,
                      rows: Mapping[tuple[int, int], tuple[int, int]],
                      placement: Mapping[tuple[int, int], Sequence[NodeRow]], *,
                      timeout: float = DEFAULT_TIMEOUT, grant: str | None = None) -> list[CommitPart]:
    """Have every node build its partitions of ``version`` (rows by ``rows``, nodes by ``placement``); returns the
    commit's partitions in grid order. ``grant``: the catalog's leave to write ``version``.

    Orders run in parallel; a receipt that disagrees with the plan fails the whole operation, which the caller
    aborts. Each order's deadline (``timeout`` plus its bytes at the put rate) travels to the node and bounds its
    own calls, so a frozen target or holder fails the operation with NodeUnavailable naming it.
    """
    by_node: dict[str, list[AssemblePart]] = {}
    for pos in sorted(placement):
        for node in placement[pos]:
            by_node.setdefault(node.uri, []).append(AssemblePart(pos, rows[pos]))

    def run(uri: str) -> list:
        out = []
        parts = by_node[uri]
        for k in range(0, len(parts), ORDER_PARTS):
            chunk = tuple(parts[k:k + ORDER_PARTS])
            deadline = put_deadline(timeout, order_bytes(source, chunk))
            order = Assemble(source.dataset, source.version, version, groups, chunk, deadline_ms=int(deadline * 1000))
            try:
                with translated():
                    reply = pool.action(uri, order, timeout=deadline, grant=grant)
            except NodeUnavailable as exc:
                late = isinstance(exc.__cause__, flight.FlightTimedOutError)
                why = f"did not answer within {deadline:.0f} s" if late else "could not build them"
                raise NodeUnavailable(f"the node at {uri} was ordered to build partitions of {source.dataset!r} "
                                      f"v{version} and {why}: {exc.message}", field=exc.field) from exc
            out.extend(reply.partitions)
        return out

    with ThreadPoolExecutor(max_workers=max(len(by_node), 1), thread_name_prefix="flightpart-assemble") as ex:
        received = dict(zip(by_node, ex.map(run, by_node)))
    for uri, receipts in received.items():
        missing = {p.part for p in by_node[uri]} - {r.part for r in receipts}
        if missing:
            raise RequestRejected(f"the node at {uri} acknowledged {len(receipts)} of {len(by_node[uri])} partitions; "
                                  f"missing {sorted(missing)[:5]}", field="assemble reply")
        for receipt in receipts:
            lo, hi = rows.get(receipt.part, (0, -1))
            if receipt.rows != hi - lo:
                raise RequestRejected(f"the node at {uri} built partition {receipt.part} with {receipt.rows} rows, "
                                      f"planned {hi - lo}", field="assemble reply")
    widths = {j: len(cols) for j, cols in enumerate(_data_groups(source, groups))}
    return [CommitPart(pos, (rows[pos][0], _col_start(widths, pos[1])), (rows[pos][1] - rows[pos][0], widths[pos[1]]),
                       tuple(n.node_id for n in placement[pos])) for pos in sorted(placement)]


def relink_on_nodes(pool: ConnectionPool, order: Relink, staged: Sequence[CommitPart], base: tuple[int, int],
                    uri_of: Mapping[str, str], *, timeout: float = DEFAULT_TIMEOUT,
                    grant: str | None = None) -> list[CommitPart]:
    """Have the holders of ``staged`` (partitions of the uncommitted ``order.source``) link them into
    ``order.version`` after ``base`` (row blocks, rows), carrying both grants (``grant`` for the version, the order's
    ``source_grant``); returns the commit's partitions for them. No byte moves. ``order`` is the order each holder
    gets, its ``parts`` filled in here."""
    by_node: dict[str, list[LinkPart]] = {}
    moved = []
    for p in staged:
        pos = (base[0] + p.part[0], p.part[1])
        for node_id in p.nodes:
            by_node.setdefault(uri_of[node_id], []).append(LinkPart(p.part, pos))
        moved.append(CommitPart(pos, (base[1] + p.start[0], p.start[1]), p.shape, p.nodes))

    def run(uri: str) -> None:
        links = by_node[uri]
        for k in range(0, len(links), ORDER_PARTS):
            these = replace(order, parts=tuple(links[k:k + ORDER_PARTS]))
            with translated():
                reply = pool.action(uri, these, timeout=timeout, grant=grant)
            if len(reply.partitions) != len(these.parts):
                raise RequestRejected(f"the node at {uri} linked {len(reply.partitions)} of {len(these.parts)} "
                                      "partitions", field="relink reply")

    with ThreadPoolExecutor(max_workers=max(len(by_node), 1), thread_name_prefix="flightpart-relink") as ex:
        list(ex.map(run, by_node))
    return moved


def order_bytes(source: VersionInfo, parts: Sequence[AssemblePart]) -> int:
    """About how many source bytes building ``parts`` reads."""
    total = sum(p.nbytes for p in source.parts)
    rows = sum(p.rows[1] - p.rows[0] for p in parts)
    return total * rows // max(source.shape[0], 1)


def _data_groups(source: VersionInfo, groups: int) -> list[list[str]]:
    return frames.column_groups(frames.data_columns(frames.empty_table(source.schema)), groups)


def _col_start(widths: Mapping[int, int], j: int) -> int:
    return sum(widths[k] for k in range(j))


def live_holders(source: VersionInfo, live: Sequence[NodeRow]) -> dict[tuple[int, int], list[NodeRow]]:
    """For each source partition, the live nodes that hold it (raises when a partition has none)."""
    by_uri = {n.uri: n for n in live}
    out = {}
    for part in source.parts:
        holders = [by_uri[uri] for uri, _ip, _pid in part.replicas if uri in by_uri]
        if not holders:
            raise NodeUnavailable(f"partition {part.position} of {source.dataset!r} v{source.version}: no "
                                  "live node holds it; start its node again or run repair")
        out[part.position] = holders
    return out


def replicas_of(source: VersionInfo) -> int:
    """How many copies the source keeps of each partition (its fewest)."""
    return min((len(p.replicas) for p in source.parts), default=1) or 1


def source_bytes(source: VersionInfo, targets: Sequence[tuple[int, int]]) -> list[dict[str, int]]:
    """For each target row range, about how many of its source bytes each node holds, for placement."""
    blocks: dict[int, list] = {}
    for p in source.parts:
        blocks.setdefault(p.position[0], []).append(p)
    sizes = [blocks[i][0].shape[0] for i in sorted(blocks)]
    starts = starts_from_sizes(sizes)
    out = []
    for lo, hi in targets:
        held: dict[str, int] = {}
        for i, a, z in blocks_meeting(starts, sizes, lo, hi):
            for p in blocks[i]:
                share = p.nbytes * (z - a) // p.shape[0]
                for uri, _ip, _pid in p.replicas:
                    held[uri] = held.get(uri, 0) + share
        out.append(held)
    return out


def conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` as rows of a dataset of ``schema``: its columns in order and types, casting types that hold the same
    values (string kinds, lossless widening, whole-number floats into integers), else SchemaMismatch naming the
    column, both types and the fix."""
    _check_columns(table.schema, schema)
    return _cast(table.select(schema.names), schema)


def conformed_stream(reader: pa.RecordBatchReader, schema: pa.Schema) -> pa.RecordBatchReader:
    """A stream's batches as rows of a dataset of ``schema`` (columns checked before the first batch is read)."""
    _check_columns(reader.schema, schema)
    return pa.RecordBatchReader.from_batches(schema, (_cast(batch.select(schema.names), schema) for batch in reader))


def _check_columns(got: pa.Schema, expected: pa.Schema) -> None:
    if set(got.names) != set(expected.names) or len(got.names) != len(expected.names):
        missing = [n for n in expected.names if n not in got.names]
        extra = [n for n in got.names if n not in expected.names]
        raise SchemaMismatch(f"the appended data has columns {got.names}, the dataset {expected.names}"
                             f"{f'; missing {missing}' if missing else ''}"
                             f"{f'; not in the dataset {extra}' if extra else ''}: "
                             "select or rename the columns to the dataset's", field="schema")
    for field in expected:
        other = got.field(field.name).type
        if widens_losslessly(other, field.type) or _whole_numbers_may_fit(other, field.type):
            continue
        raise SchemaMismatch(_type_mismatch(field.name, other, field.type), field=f"schema.{field.name}")


def _whole_numbers_may_fit(source: pa.DataType, target: pa.DataType) -> bool:
    """A float (or wider integer) column into an integer one (pandas makes nullable ints float64); values checked
    when cast."""
    return pa.types.is_integer(target) and (pa.types.is_floating(source) or pa.types.is_integer(source))


def _cast(data: Any, schema: pa.Schema) -> Any:
    try:
        return data.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        for field in schema:
            try:
                data.column(field.name).cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise SchemaMismatch(_type_mismatch(field.name, data.schema.field(field.name).type, field.type,
                                                    values=True), field=f"schema.{field.name}") from None
        raise SchemaMismatch(f"the appended data does not fit the dataset's schema ({exc})", field="schema") from None


def _type_mismatch(name: str, got: pa.DataType, want: pa.DataType, *, values: bool = False) -> str:
    why = "holds values that are not" if values else "is"
    return (f"column {name!r} of the appended data {why} {got if not values else want} "
            f"({'its type is ' + str(got) + ', ' if values else ''}the dataset's is {want}): "
            f"cast it first, e.g. table.cast(...) with pa.field({name!r}, pa.{_type_name(want)}), "
            f"or df[{name!r}].astype(...) in pandas")


def _type_name(t: pa.DataType) -> str:
    text = str(t)
    return {"string": "string()", "large_string": "large_string()", "double": "float64()", "float": "float32()"}.get(
        text, f"{text}()" if text.isidentifier() else f"<{text}>")
