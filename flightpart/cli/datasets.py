"""Commands on datasets: put, get, ls, show, repartition, rebalance, append, rm."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from .group import (
    CATALOG_OPTION,
    HOST_OPTION,
    JSON_OPTION,
    client_for,
    emit,
    main,
    parse_tiling,
    print_table,
)


@main.command()
@click.argument("name")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--tiling", default=None, help="Row blocks x column groups, e.g. 4x1 (default: one row block per node).")
@click.option("--replicas", default=1, show_default=True, type=int)
@CATALOG_OPTION
@JSON_OPTION
def put(name: str, file: str, tiling: str | None, replicas: int, catalog: str, as_json: bool) -> None:
    """Store FILE (Parquet, CSV or Arrow IPC) as the next version of NAME."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    from .export import read_file

    try:
        table = read_file(file)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="FILE") from None
    progress = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty())
    with client_for(catalog) as client, progress as bar:
        task = bar.add_task(f"put {name}", total=table.nbytes * replicas)
        ds = client.put(name, table, tiling=parse_tiling(tiling), replicas=replicas,
                        progress=lambda done, total: bar.update(task, completed=done, total=total))
    _published(ds, as_json)


@main.command()
@click.argument("name")
@click.option("-o", "--output", required=True, help="File to write (.parquet, .csv, .arrow), or - for stdout.")
@click.option("--format", "fmt", type=click.Choice(["arrow", "parquet", "csv"]), default=None,
              help="Output format (default: from the file's suffix; an Arrow IPC stream on stdout).")
@click.option("--columns", default=None, help="Comma-separated columns to read (default: all).")
@click.option("--where", default=None, help="Only rows where this holds, e.g. \"amount > 10 and store = 's1'\" (evaluated on the nodes).")
@click.option("--limit", default=None, type=click.IntRange(min=0), help="Stop after this many rows.")
@click.option("--version", "version", default=None, type=int)
@CATALOG_OPTION
@HOST_OPTION
@JSON_OPTION
def get(name: str, output: str, fmt: str | None, columns: str | None, where: str | None, limit: int | None,
        version: int | None, catalog: str, host: str | None, as_json: bool) -> None:
    """Stream dataset NAME (or some of its columns and rows) into a file or to stdout."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    from .export import BatchWriter, check_destination, choose_format

    fmt = choose_format(output, fmt)
    check_destination(output)
    with client_for(catalog, host) as client:
        ds = client.open(name, version)
        if columns:
            ds = ds.select([c.strip() for c in columns.split(",") if c.strip()])
        if where:
            ds = ds.filter(where)
        reader = ds.to_reader()
        writer = BatchWriter(output, fmt, reader.schema)
        total = limit if limit is not None else (ds.shape[0] if where is None else None)
        progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,} rows"),
                            console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty())
        try:
            with progress:
                task = progress.add_task(f"get {name}", total=total)
                for batch in reader:
                    if limit is not None and writer.rows + batch.num_rows > limit:
                        batch = batch.slice(0, limit - writer.rows)
                    writer.write(batch)
                    progress.update(task, completed=writer.rows)
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
        if long_:
            for r in rows:
                r["columns"] = describe_columns(client.open(r["name"], r["version"]).schema)
    if as_json:
        click.echo(json.dumps(rows))
        return
    headers = ("name", "version", "rows", "columns", "tiling", "bytes") + (("column types",) if long_ else ())
    print_table(headers, [(r["name"], r["version"], f"{r['shape'][0]:,}", r["shape"][1], "x".join(map(str, r["partition_tiling"])),
                           f"{r['nbytes']:,}") + ((_types_text(r["columns"]),) if long_ else ()) for r in rows])


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


NODES_OPTION = click.option("--nodes", default=None, help="Comma-separated node ids, URIs or IPs to place partitions on "
                            "(default: every live node).")


def _published(ds: Any, as_json: bool) -> None:
    record = {"name": ds.name, "version": ds.version, "rows": ds.shape[0], "columns": ds.shape[1],
              "tiling": list(ds.partition_tiling), "nbytes": ds.nbytes}
    tiling = "x".join(map(str, ds.partition_tiling))
    emit(as_json, record, f"{ds.name} v{ds.version}: {ds.shape[0]:,} rows x {ds.shape[1]} columns in a {tiling} grid")


@main.command()
@click.argument("name")
@click.option("--tiling", required=True, help="Row blocks x column groups of the new version, e.g. 6x2.")
@click.option("--replicas", default=None, type=click.IntRange(min=1), help="Copies of each partition (default: as now).")
@NODES_OPTION
@CATALOG_OPTION
@JSON_OPTION
def repartition(name: str, tiling: str, replicas: int | None, nodes: str | None, catalog: str, as_json: bool) -> None:
    """Publish NAME's next version cut by --tiling, built by the nodes (no data passes through this command)."""
    with client_for(catalog) as client:
        _published(client.repartition(name, parse_tiling(tiling), nodes=_nodes_option(nodes), replicas=replicas), as_json)


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
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@NODES_OPTION
@CATALOG_OPTION
@JSON_OPTION
def append(name: str, file: str, nodes: str | None, catalog: str, as_json: bool) -> None:
    """Publish NAME's next version: its rows, then FILE's (Parquet, CSV or Arrow IPC); stored rows are not rewritten."""
    from .export import read_file

    try:
        table = read_file(file)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="FILE") from None
    with client_for(catalog) as client:
        _published(client.append(name, table, nodes=_nodes_option(nodes)), as_json)


@main.command()
@click.argument("name")
@click.option("--version", "version", default=None, type=int, help="Drop only this version.")
@CATALOG_OPTION
@JSON_OPTION
def rm(name: str, version: int | None, catalog: str, as_json: bool) -> None:
    """Drop dataset NAME (or one version); nodes free its files."""
    with client_for(catalog) as client:
        client.drop(name, version)
    emit(as_json, {"dropped": name, "version": version}, f"dropped {name}" + (f" v{version}" if version is not None else ""))
