"""Commands on datasets: put, get, ls, show, repartition, rebalance, append, rm."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import click
import pyarrow as pa

from flightpart import frames

from .group import (
    CATALOG_OPTION,
    HOST_OPTION,
    JSON_OPTION,
    client_for,
    emit,
    main,
    parse_size,
    parse_tiling,
    print_table,
)


@main.command()
@click.argument("name")
@click.argument("source")
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv", "json", "arrow"]), default=None,
              help="Format of SOURCE (default: from its suffix; an Arrow IPC stream on stdin).")
@click.option("--partition-size", default="64M", show_default=True,
              help="Bytes of data per partition (K, M, G); partitions go round-robin to the nodes as SOURCE is read.")
@click.option("--tiling", default=None,
              help="Row blocks x column groups, e.g. 4x1: SOURCE is read whole into memory and cut so "
                   "(default: partitions of --partition-size, cut as SOURCE streams).")
@click.option("--replicas", default=1, show_default=True, type=int)
@CATALOG_OPTION
@JSON_OPTION
def put(name: str, source: str, fmt: str | None, partition_size: str, tiling: str | None, replicas: int, catalog: str,
        as_json: bool) -> None:
    """Store SOURCE as the next version of NAME, read as it streams, in bounded memory.

    SOURCE is a Parquet, CSV, newline-delimited JSON or Arrow IPC file (CSV
    and JSON also .gz, .zst, .bz2), a directory of them (a Hive layout such as
    year=2024/ kept as columns), a quoted glob such as 'trips/*.csv.gz', or -
    for stdin (an Arrow IPC stream, or --format csv|json).
    """
    size = parse_size(partition_size, "--partition-size")
    grid = parse_tiling(tiling)
    reader = _opened(source, fmt)
    with client_for(catalog) as client, byte_bar(f"put {name}") as shown:
        try:
            if grid is not None:
                ds = client.put(name, reader.read_all(), tiling=grid, replicas=replicas, progress=shown)
            else:
                stream, rows = _cut_by_bytes(reader, size)
                ds = client.put(name, stream, replicas=replicas, progress=shown, rows_per_partition=rows)
        except pa.ArrowInvalid as exc:  # the source itself: a CSV value its column's type cannot hold, a torn file
            raise click.ClickException(f"{source}: {exc}; nothing was published") from None
    _published(ds, as_json)


def _opened(source: str, fmt: str | None) -> pa.RecordBatchReader:
    """``source`` open for reading, or a usage error that names it."""
    from .sources import SourceError, open_source

    try:
        return open_source(source, fmt)
    except SourceError as exc:
        raise click.BadParameter(str(exc), param_hint="SOURCE") from None
    except (OSError, pa.ArrowInvalid) as exc:
        raise click.BadParameter(f"{source}: {exc}", param_hint="SOURCE") from None


class _ReadAhead:
    """Up to ``size`` bytes read ahead of a reader (:attr:`ended`: that was all of it)."""

    def __init__(self, reader: pa.RecordBatchReader, size: int):
        self.schema = reader.schema
        self.batches: list[pa.RecordBatch] = []
        self.rest = iter(reader)
        held = 0
        for batch in self.rest:
            self.batches.append(batch)
            held += frames.size_of(batch)
            if held > size:
                self.ended = False
                return
        self.ended = True

    def table(self) -> pa.Table:
        """Everything read, when :attr:`ended`."""
        return pa.Table.from_batches(self.batches, self.schema)

    def reader(self) -> pa.RecordBatchReader:
        """The whole source again: the batches read ahead, then the rest."""
        return pa.RecordBatchReader.from_batches(self.schema, itertools.chain(self.batches, self.rest))


def _cut_by_bytes(reader: pa.RecordBatchReader, size: int) -> tuple[pa.RecordBatchReader, int | None]:
    """``reader`` again (its first batch read ahead) and the rows per partition that make about ``size`` bytes."""
    first = next(iter(reader), None)
    if first is None:
        return reader, None
    rows = max(1, size * first.num_rows // max(frames.size_of(first), 1))
    return pa.RecordBatchReader.from_batches(reader.schema, itertools.chain([first], reader)), rows


@contextlib.contextmanager
def byte_bar(description: str) -> Iterator[Callable[[int, int], None]]:
    """A bar of bytes moved, with speed and time left (when the total is known), on a terminal's stderr (nothing when
    stderr is not a terminal); yields the ``progress=`` function (bytes done, bytes total) that moves it."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    progress = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), TimeRemainingColumn(), console=Console(stderr=True), transient=True,
                        disable=not sys.stderr.isatty())
    with progress as bar:
        task = bar.add_task(description, total=None)

        def shown(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total or None)

        yield shown


@dataclass(frozen=True)
class Selection:
    """Which version, columns and rows ``get`` reads (``--version``, ``--columns``, ``--where``, ``--limit``)."""

    columns: str | None = None
    where: str | None = None
    limit: int | None = None
    version: int | None = None

    def of(self, client: Any, name: str) -> Any:
        """The dataset ``name`` narrowed to this selection, so the nodes send only what was chosen."""
        ds = client.open(name, self.version)
        if self.columns:
            ds = ds.select([c.strip() for c in self.columns.split(",") if c.strip()])
        if self.where:
            ds = ds.filter(self.where)
        if self.limit is not None:  # a row slice: the nodes send those rows only, not whole partitions cut here
            ds = ds[:self.limit]
        return ds


@main.command()
@click.argument("name")
@click.option("-o", "--output", required=True, help="File to write (.parquet, .csv, .arrow), or - for stdout.")
@click.option("--format", "fmt", type=click.Choice(["arrow", "parquet", "csv"]), default=None,
              help="Output format (default: from the file's suffix; an Arrow IPC stream on stdout).")
@click.option("--columns", default=None, help="Comma-separated columns to read (default: all).")
@click.option("--where", default=None,
              help="Only rows where this holds, e.g. \"amount > 10 and store = 's1'\" (evaluated on the nodes).")
@click.option("--limit", default=None, type=click.IntRange(min=0), help="Stop after this many rows.")
@click.option("--version", "version", default=None, type=int)
@CATALOG_OPTION
@HOST_OPTION
@JSON_OPTION
def get(name: str, output: str, fmt: str | None, catalog: str, host: str | None, as_json: bool,
        **selection: Any) -> None:
    """Stream dataset NAME (or some of its columns and rows) into a file or to stdout."""
    from .export import BatchWriter, check_destination, choose_format

    fmt = choose_format(output, fmt)
    check_destination(output)
    chosen = Selection(**selection)
    limit = chosen.limit
    with client_for(catalog, host) as client:
        ds = chosen.of(client, name)
        with byte_bar(f"get {name}") as shown:
            reader = ds.to_reader(progress=shown)
            writer = BatchWriter(output, fmt, reader.schema)
            try:
                for batch in reader:
                    if limit is not None and writer.rows + batch.num_rows > limit:
                        batch = batch.slice(0, limit - writer.rows)
                    writer.write(batch)
                    if limit is not None and writer.rows >= limit:
                        break
                writer.commit()
            except BrokenPipeError:  # the reader of stdout went away (| head): not an error of ours
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return
            except BaseException:
                writer.abort()
                raise
            finally:
                reader.close()
    summary = {"name": name, "version": ds.version, "rows": writer.rows, "format": fmt, "output": output}
    if as_json:
        click.echo(json.dumps(summary), err=output == "-")
    elif output != "-":
        click.echo(f"wrote {writer.rows:,} rows of {name} v{ds.version} to {output}")


@main.command("ls")
@click.option("-l", "--long", "long_", is_flag=True, help="Also each dataset's columns and their types.")
@CATALOG_OPTION
@JSON_OPTION
def ls_cmd(long_: bool, catalog: str, as_json: bool) -> None:
    """List datasets (latest version of each)."""
    from flightpart.frames import describe_columns

    with client_for(catalog) as client:
        rows = client.list()
        columns = [describe_columns(client.open(r.name, r.version).schema) if long_ else None for r in rows]
    if as_json:
        click.echo(json.dumps([{**r.to_json(), **({"columns": c} if long_ else {})} for r, c in zip(rows, columns)]))
        return
    headers = ("name", "version", "rows", "columns", "tiling", "bytes") + (("column types",) if long_ else ())
    print_table(headers, [(r.name, r.version, f"{r.shape[0]:,}", r.shape[1], "x".join(map(str, r.partition_tiling)),
                           f"{r.nbytes:,}") + ((_types_text(c),) if long_ else ())
                          for r, c in zip(rows, columns)])


def _types_text(columns: list[dict]) -> str:
    return ", ".join(f"{c['name']}: {c['type']}" for c in columns)


@main.command()
@click.argument("name")
@click.option("--version", "version", default=None, type=int)
@CATALOG_OPTION
@JSON_OPTION
def show(name: str, version: int | None, catalog: str, as_json: bool) -> None:
    """Draw the partition grid of NAME: who holds what, rows and bytes."""
    from .grid_view import grid_json, render_grid

    with client_for(catalog) as client:
        ds = client.open(name, version)
        nodes = client.nodes()
    if as_json:
        click.echo(json.dumps(grid_json(ds)))
    else:
        render_grid(ds, nodes)


def _nodes_option(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


NODES_OPTION = click.option("--nodes", default=None,
                            help="Comma-separated node ids, URIs or IPs to place partitions on "
                            "(default: every live node).")


def _published(ds: Any, as_json: bool) -> None:
    record = {"name": ds.name, "version": ds.version, "rows": ds.shape[0], "columns": ds.shape[1],
              "tiling": list(ds.partition_tiling), "nbytes": ds.nbytes}
    tiling = "x".join(map(str, ds.partition_tiling))
    emit(as_json, record, f"{ds.name} v{ds.version}: {ds.shape[0]:,} rows x {ds.shape[1]} columns in a {tiling} grid")


@main.command()
@click.argument("name")
@click.option("--tiling", required=True, help="Row blocks x column groups of the new version, e.g. 6x2.")
@click.option("--replicas", default=None, type=click.IntRange(min=1),
              help="Copies of each partition (default: as now).")
@NODES_OPTION
@CATALOG_OPTION
@JSON_OPTION
def repartition(name: str, tiling: str, replicas: int | None, nodes: str | None, catalog: str, as_json: bool) -> None:
    """Publish NAME's next version cut by --tiling, built by the nodes (no data passes through this command)."""
    with client_for(catalog) as client:
        _published(client.repartition(name, parse_tiling(tiling), nodes=_nodes_option(nodes), replicas=replicas),
                   as_json)


@main.command()
@click.argument("name")
@NODES_OPTION
@CATALOG_OPTION
@JSON_OPTION
def rebalance(name: str, nodes: str | None, catalog: str, as_json: bool) -> None:
    """Move NAME's partitions node to node until bytes per node differ by at most one partition (a new version)."""
    with client_for(catalog) as client:
        before = client.versions(name)[-1]
        ds = client.rebalance(name, nodes=_nodes_option(nodes))
    if ds.version == before and not as_json:
        click.echo(f"{name} v{ds.version} is balanced already; nothing moved")
    else:
        _published(ds, as_json)


@main.command()
@click.argument("name")
@click.argument("source")
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv", "json", "arrow"]), default=None,
              help="Format of SOURCE (default: from its suffix; an Arrow IPC stream on stdin).")
@click.option("--partition-size", default="64M", show_default=True, help="Bytes of new data per partition (K, M, G).")
@NODES_OPTION
@CATALOG_OPTION
@JSON_OPTION
def append(name: str, source: str, fmt: str | None, partition_size: str, nodes: str | None, catalog: str,
           as_json: bool) -> None:
    """Publish NAME's next version: its rows, then SOURCE's (read as it streams; SOURCE as for put); stored rows are
    not rewritten."""
    size = parse_size(partition_size, "--partition-size")
    reader = _opened(source, fmt)
    with client_for(catalog) as client:
        try:
            ahead = _ReadAhead(reader, size)
            if ahead.ended:  # small: appended as a frame, with no staging version, so it publishes the next number
                ds = client.append(name, ahead.table(), nodes=_nodes_option(nodes))
            else:
                stream, rows = _cut_by_bytes(ahead.reader(), size)
                ds = client.append(name, stream, nodes=_nodes_option(nodes), rows_per_partition=rows)
        except pa.ArrowInvalid as exc:
            raise click.ClickException(f"{source}: {exc}; nothing was published") from None
    _published(ds, as_json)


@main.command()
@click.argument("name")
@click.option("--version", "version", default=None, type=int, help="Drop only this version.")
@CATALOG_OPTION
@JSON_OPTION
def rm(name: str, version: int | None, catalog: str, as_json: bool) -> None:
    """Drop dataset NAME (or one version); nodes free its files."""
    with client_for(catalog) as client:
        client.drop(name, version)
    emit(as_json, {"dropped": name, "version": version},
         f"dropped {name}" + (f" v{version}" if version is not None else ""))


@main.command("sql")
@click.argument("query")
@click.option("-o", "--output", default=None,
              help="File to write (.parquet, .csv, .arrow), or - for stdout (default: the answer as a table of text).")
@click.option("--format", "fmt", type=click.Choice(["arrow", "parquet", "csv"]), default=None,
              help="Output format (default: from the file's suffix; an Arrow IPC stream on stdout).")
@CATALOG_OPTION
@JSON_OPTION
def sql_cmd(query: str, output: str | None, fmt: str | None, catalog: str, as_json: bool) -> None:
    """Answer QUERY, one SELECT over datasets as tables (`sales`, `"sales@3"`), at the catalog (Flight SQL).

    The nodes send only the columns the query uses and the rows its pushed
    filters keep; joins, aggregates and ordering run at the catalog.
    """
    from .export import BatchWriter, check_destination, choose_format

    with client_for(catalog) as client:
        answer = client.sql(query).to_arrow()
    if output is None:
        if as_json:
            click.echo(json.dumps(answer.to_pylist(), default=str))
        else:
            click.echo(answer.to_pandas().to_string(index=False, max_rows=200))
        return
    fmt = choose_format(output, fmt)
    check_destination(output)
    writer = BatchWriter(output, fmt, answer.schema)
    try:
        for batch in answer.to_batches():
            writer.write(batch)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    if output != "-":
        click.echo(json.dumps({"rows": answer.num_rows, "output": output}) if as_json else
                   f"wrote {answer.num_rows:,} rows to {output}")
