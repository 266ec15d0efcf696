"""The ``flightpart`` command: daemons, dataset management and the demo."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from .cli_errors import error_line
from .version import __version__

CATALOG_OPTION = click.option("--catalog", envvar="FLIGHTPART_CATALOG", required=True, callback=lambda _c, _p, v: _address(v),
                              help="Catalog URI, e.g. grpc://head:8815 (or $FLIGHTPART_CATALOG).")
HOST_OPTION = click.option("--client-host", "host", envvar="FLIGHTPART_HOST", default=None,
                           help="Address that counts as this host for locality (or $FLIGHTPART_HOST).")
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
CAPABILITY_TTL_OPTION = click.option("--capability-ttl", default=86400.0, show_default=True, type=float,
                                     help="Catalog: seconds the read capability in a dataset handle stays valid.")
def identity_options(f):
    """--cluster-id and --rebuild-grace: how a catalog on new or lost state settles the cluster's identity."""
    f = click.option("--rebuild-grace", default=5.0, show_default=True, type=click.FloatRange(min=0),
                     help="Catalog on new or lost state: seconds writes wait for nodes to report their cluster, versions "
                          "and tombstones before version numbers are handed out (more than the nodes' --heartbeat).")(f)
    return click.option("--cluster-id", default=None,
                        help="Catalog: the cluster's identity, given instead of learned from the nodes (a fresh state "
                             "takes it at once; a state of another cluster refuses to start).")(f)


PENDING_TTL_OPTION = click.option("--pending-ttl", default=3600.0, show_default=True, type=float,
                                  help="Catalog: abort a put still pending after this many seconds and delete its files.")


def security_options(f):
    """--secret-file and TLS options shared by the daemons."""
    options = [
        click.option("--secret-file", "--token-file", "secret_file", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="File (mode 600) whose first line is the cluster secret (or $FLIGHTPART_SECRET); "
                          "role tokens and read capabilities derive from it. Without one the cluster is open."),
        click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None, help="PEM certificate to serve TLS."),
        click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None, help="PEM private key of --tls-cert."),
        click.option("--tls-client-ca", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="Require client certificates signed by this CA (mutual TLS)."),
        click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False), envvar="FLIGHTPART_TLS_CA", default=None,
                     help="CA that signs the other daemons' certificates (or $FLIGHTPART_TLS_CA)."),
        click.option("--insecure", is_flag=True, default=False,
                     help="Without a secret, bind beyond loopback anyway: an open daemon that anyone who reaches it may "
                          "read, write and delete through. Without this flag an open daemon binds loopback only."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def observability_options(f):
    """--health-port, --metrics-port and --metrics-host shared by the daemons."""
    f = click.option("--metrics-host", default="127.0.0.1", show_default=True,
                     help="Address the HTTP endpoint binds. Its metrics show counts only; a catalog's status page shows "
                          "node addresses and dataset names, so expose it only where they may be seen.")(f)
    f = click.option("--metrics-port", default=None, type=int,
                     help="Serve HTTP on this port (8818 by convention; 0: any): /metrics for Prometheus, /healthz "
                          "(200 or 503 with reasons) and, on a catalog, the status page at / and /status.json.")(f)
    f = click.option("--health-port", default=None, type=int,
                     help="Serve grpc.health.v1.Health on this port (8817 by convention; 0: any).")(f)
    return f


class FriendlyGroup(click.Group):
    """Every error as one line with what to do next (:mod:`flightpart.cli_errors`), not a traceback, unless --debug."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except Exception as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(error_line(exc, (ctx.obj or {}).get("address")), err=True)
            ctx.exit(1)


@click.group(cls=FriendlyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="flightpart")
@click.option("--log-level", default="WARNING", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--log-format", default="text", show_default=True, type=click.Choice(["text", "json"]),
              help="Log lines as text, or as JSON objects for a log collector.")
@click.option("--debug", is_flag=True, help="Show full tracebacks.")
@click.pass_context
def main(ctx: click.Context, log_level: str, log_format: str, debug: bool) -> None:
    """flightpart: partitioned dataframes over Arrow Flight."""
    from .tools.logs import configure_logging

    configure_logging(log_level, log_format)
    ctx.obj = {"debug": debug}


# --------------------------------------------------------------------------- daemons


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind and advertise.")
@click.option("--port", default=8815, show_default=True, type=int, help="Port (0: any free port).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="Where partitions live (default: per-user data dir).")
@click.option("--catalog", "catalog_uri", default=None, callback=lambda _c, _p, v: v and _address(v),
              help="Catalog to join; without it this process is also the catalog. ($FLIGHTPART_CATALOG is not read "
                   "here: it names the catalog for client commands.)")
@click.option("--node-port", default=0, type=int, help="Node port when this process is also the catalog.")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None, help="Catalog state when embedded.")
@click.option("--heartbeat", default=2.0, show_default=True, type=float, help="Seconds between heartbeats.")
@click.option("--dead-after", default=10.0, show_default=True, type=float, help="Embedded catalog: seconds without heartbeat before a node is dead.")
@click.option("--max-partition-bytes", default=None, type=int, help="Refuse partitions larger than this.")
@click.option("--max-streams", default=64, show_default=True, type=int, help="Refuse new do_get/do_put streams past this many open.")
@click.option("--stream-idle-timeout", default=60.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Free the slot of a do_get stream whose reader has taken nothing for this many seconds.")
@click.option("--advertise", default=None, help="Host name clients use to reach this node (default: --host).")
@click.option("--min-free-bytes", default=64 << 20, show_default=True, type=int,
              help="Report NOT_SERVING and low space (no new partitions placed here) below this much free disk.")
@click.option("--group", default=None,
              help="Let this group's members map partitions zero-copy (directories 750, files 640); default: owner only.")
@click.option("--scrub-rate", default=64 << 20, show_default=True, type=int,
              help="Bytes per second the background scrub reads to check stored files against their checksums (0: off).")
@click.option("--scrub-interval", default=3600.0, show_default=True, type=float,
              help="Seconds between background scrub passes (0: off); a pass over B bytes takes B / --scrub-rate seconds.")
@click.option("--node-token-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="File (mode 600) holding this node's own token (`flightpart token --role node --name NODE`): with "
                   "--verify-key-file, what a node needs instead of the cluster secret. The token names the node.")
@click.option("--verify-key-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="File holding the cluster's verify key (`flightpart verify-key`): checks callers' tokens, mints none.")
@PENDING_TTL_OPTION
@CAPABILITY_TTL_OPTION
@identity_options
@security_options
@observability_options
def serve(host: str, port: int, data_dir: str | None, catalog_uri: str | None, node_port: int, state_dir: str | None,
          heartbeat: float, dead_after: float, max_partition_bytes: int | None, max_streams: int, stream_idle_timeout: float,
          advertise: str | None, min_free_bytes: int, group: str | None, scrub_rate: int, scrub_interval: float,
          node_token_file: str | None, verify_key_file: str | None,
          pending_ttl: float, capability_ttl: float, cluster_id: str | None, rebuild_grace: float, secret_file: str | None,
          tls_cert: str | None, tls_key: str | None, tls_client_ca: str | None, tls_ca: str | None,
          insecure: bool, health_port: int | None, metrics_port: int | None, metrics_host: str) -> None:
    """Run a node (and, without --catalog, a catalog too)."""
    from .server.daemon import Observability, Security, run_node

    run_node(host, port, data_dir=data_dir, catalog=catalog_uri, node_port=node_port, state_dir=state_dir, heartbeat=heartbeat,
             dead_after=dead_after, max_partition_bytes=max_partition_bytes, max_streams=max_streams, advertise=advertise,
             security=Security(secret_file, tls_cert, tls_key, tls_client_ca, tls_ca, insecure, node_token_file, verify_key_file),
             ports=Observability(health_port, metrics_port, metrics_host), min_free_bytes=min_free_bytes, group=group,
             pending_ttl=pending_ttl, capability_ttl=capability_ttl, stream_idle_timeout=stream_idle_timeout,
             cluster_id=cluster_id, rebuild_grace=rebuild_grace, scrub=(scrub_rate, scrub_interval))


@main.command("catalog")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8815, show_default=True, type=int)
@click.option("--state-dir", type=click.Path(file_okay=False), default=None, help="SQLite state (default: per-user data dir).")
@click.option("--dead-after", default=10.0, show_default=True, type=float, help="Seconds without heartbeat before a node is dead.")
@click.option("--retire-after", default=86400.0, show_default=True, type=float,
              help="Seconds without heartbeat before a dead node is forgotten; its partitions then count as lost replicas.")
@PENDING_TTL_OPTION
@CAPABILITY_TTL_OPTION
@identity_options
@security_options
@observability_options
def catalog_cmd(host: str, port: int, state_dir: str | None, dead_after: float, retire_after: float, pending_ttl: float,
                capability_ttl: float, cluster_id: str | None, rebuild_grace: float, secret_file: str | None,
                tls_cert: str | None,
                tls_key: str | None, tls_client_ca: str | None, tls_ca: str | None, insecure: bool, health_port: int | None,
                metrics_port: int | None, metrics_host: str) -> None:
    """Run a catalog alone."""
    from .server.daemon import Observability, Security, run_catalog

    run_catalog(host, port, state_dir, dead_after, Security(secret_file, tls_cert, tls_key, tls_client_ca, tls_ca, insecure),
                Observability(health_port, metrics_port, metrics_host), pending_ttl, capability_ttl, retire_after,
                cluster_id=cluster_id, rebuild_grace=rebuild_grace)


# --------------------------------------------------------------------------- datasets


def _print_table(columns: tuple[str, ...], rows: list[tuple]) -> None:
    """A rich table of ``rows`` for people (``--json`` gives scripts the same)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(*columns)
    for row in rows:
        table.add_row(*(str(v) for v in row))
    Console().print(table)


def _address(value: str | None) -> str | None:
    """A daemon's address as a Flight URI (a web address or one without a port is a usage error), remembered for hints."""
    if value is None:
        return None
    from .io.access import TLS_CA_ENV
    from .io.uris import flight_uri

    try:
        uri = flight_uri(value, tls=bool(os.environ.get(TLS_CA_ENV)))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx else None
    if root is not None and root.obj is not None:
        root.obj["address"] = uri
    return uri


def _client(catalog: str, host: str | None = None):
    from .client import connect

    return connect(catalog, host=host)


def _emit(as_json: bool, record: dict, text: str) -> None:
    """A command's result: ``record`` as one JSON line for scripts, else ``text`` for people."""
    click.echo(json.dumps(record) if as_json else text)


def _parse_tiling(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        p, q = (int(v) for v in value.lower().replace("x", ",").split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected ROWSxCOLS such as 4x1", param_hint="--tiling") from None
    return (p, q)


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

    from .tools.export import read_file

    try:
        table = read_file(file)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="FILE") from None
    progress = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty())
    with _client(catalog) as client, progress as bar:
        task = bar.add_task(f"put {name}", total=table.nbytes * replicas)
        ds = client.put(name, table, tiling=_parse_tiling(tiling), replicas=replicas,
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

    from .tools.export import BatchWriter, check_destination, choose_format

    fmt = choose_format(output, fmt)
    check_destination(output)
    with _client(catalog, host) as client:
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
@CATALOG_OPTION
@JSON_OPTION
def ls_cmd(catalog: str, as_json: bool) -> None:
    """List datasets (latest version of each)."""
    with _client(catalog) as client:
        rows = client.list()
    if as_json:
        click.echo(json.dumps(rows))
        return
    _print_table(("name", "version", "rows", "columns", "tiling", "bytes"),
                 [(r["name"], r["version"], f"{r['shape'][0]:,}", r["shape"][1], "x".join(map(str, r["partition_tiling"])), f"{r['nbytes']:,}")
                  for r in rows])


@main.command()
@click.argument("name")
@click.option("--version", "version", default=None, type=int)
@CATALOG_OPTION
@JSON_OPTION
def show(name: str, version: int | None, catalog: str, as_json: bool) -> None:
    """Draw the partition grid of NAME: who holds what, rows and bytes."""
    from .tools.grid_view import grid_json, render_grid

    with _client(catalog) as client:
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
    _emit(as_json, record, f"{ds.name} v{ds.version}: {ds.shape[0]:,} rows x {ds.shape[1]} columns in a {tiling} grid")


@main.command()
@click.argument("name")
@click.option("--tiling", required=True, help="Row blocks x column groups of the new version, e.g. 6x2.")
@click.option("--replicas", default=None, type=click.IntRange(min=1), help="Copies of each partition (default: as now).")
@NODES_OPTION
@CATALOG_OPTION
@JSON_OPTION
def repartition(name: str, tiling: str, replicas: int | None, nodes: str | None, catalog: str, as_json: bool) -> None:
    """Publish NAME's next version cut by --tiling, built by the nodes (no data passes through this command)."""
    with _client(catalog) as client:
        _published(client.repartition(name, _parse_tiling(tiling), nodes=_nodes_option(nodes), replicas=replicas), as_json)


@main.command()
@click.argument("name")
@NODES_OPTION
@CATALOG_OPTION
@JSON_OPTION
def rebalance(name: str, nodes: str | None, catalog: str, as_json: bool) -> None:
    """Move NAME's partitions node to node until bytes per node differ by at most one partition (a new version)."""
    with _client(catalog) as client:
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
    from .tools.export import read_file

    try:
        table = read_file(file)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="FILE") from None
    with _client(catalog) as client:
        _published(client.append(name, table, nodes=_nodes_option(nodes)), as_json)


@main.command()
@click.argument("name")
@click.option("--version", "version", default=None, type=int, help="Drop only this version.")
@CATALOG_OPTION
@JSON_OPTION
def rm(name: str, version: int | None, catalog: str, as_json: bool) -> None:
    """Drop dataset NAME (or one version); nodes free its files."""
    with _client(catalog) as client:
        client.drop(name, version)
    _emit(as_json, {"dropped": name, "version": version}, f"dropped {name}" + (f" v{version}" if version is not None else ""))


@main.command()
@CATALOG_OPTION
@JSON_OPTION
def nodes(catalog: str, as_json: bool) -> None:
    """List the nodes the catalog knows, alive or dead."""
    with _client(catalog) as client:
        rows = client.nodes()
    if as_json:
        click.echo(json.dumps(rows))
        return
    _print_table(("node", "uri", "ip", "pid", "state", "clock skew"),
                 [(n["node_id"][:8], n["uri"], n["ip"], n["pid"], "[green]alive[/]" if n["alive"] else "[red]dead[/]",
                   _skew_text(n.get("clock_skew"))) for n in rows])


def _skew_text(seconds: float | None) -> str:
    """A node's clock against the catalog's (from its last heartbeat), as `flightpart nodes` shows it."""
    return "-" if seconds is None else f"{seconds:+.1f} s"


@main.command()
@CATALOG_OPTION
@JSON_OPTION
def repair(catalog: str, as_json: bool) -> None:
    """Copy under-replicated partitions to live nodes."""
    with _client(catalog) as client:
        result = client.repair()
    if as_json:
        click.echo(json.dumps(result))
        return
    for c in result["copied"]:
        click.echo(f"copied {c['dataset']} v{c['version']} {tuple(c['part'])} to {c['to']}")
    for m in result["lost"]:
        click.echo(f"LOST {m['dataset']} v{m['version']} {tuple(m['part'])}: no live replica", err=True)
    click.echo(f"{len(result['copied'])} copies made, {len(result['lost'])} partitions without a live replica")


@main.command()
@CATALOG_OPTION
@JSON_OPTION
def scrub(catalog: str, as_json: bool) -> None:
    """Check every live node's files against their checksums now; report damaged and missing partitions.

    Damaged files are moved to each node's quarantine folder and no
    longer served; the catalog stops listing those replicas, so a
    ``flightpart repair`` recreates them. Exits 1 when anything was found.
    """
    from .wire import Empty

    with _client(catalog) as client:
        result = client.call("scrub", Empty(), timeout=3600)
    if as_json:
        click.echo(json.dumps(result))
    else:
        for node in result["nodes"]:
            for kind in ("damaged", "missing"):
                for p in node.get(kind, ()):
                    click.echo(f"{kind.upper()} {p['dataset']} v{p['version']} {tuple(p['part'])} on {node['uri']}", err=True)
        for uri in result["unreachable"]:
            click.echo(f"UNREACHABLE {uri}: not scrubbed", err=True)
        checked = sum(n.get("checked", 0) for n in result["nodes"])
        click.echo(f"{checked} files checked on {len(result['nodes'])} nodes: {result['damaged']} damaged, "
                   f"{result['missing']} missing")
    if result["damaged"] or result["missing"]:
        raise SystemExit(1)


@main.command()
@click.option("--role", required=True, type=click.Choice(["reader", "writer", "admin", "node"]), help="What the token may do.")
@click.option("--name", required=True, help="Who holds it (a user, or for --role node the node's id).")
@click.option("--expires-in", default=0, type=int, help="Seconds until the token expires (0: never).")
@click.option("--secret-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The cluster secret (mode 600), or $FLIGHTPART_SECRET.")
@JSON_OPTION
def token(role: str, name: str, expires_in: int, secret_file: str | None, as_json: bool) -> None:
    """Print a role token signed with the cluster secret (give it to a user as $FLIGHTPART_TOKEN, or to a node
    as its --node-token-file)."""
    import time

    from .tokens import CATALOG_NODE
    from .wire import role_token

    if role == "node" and name == CATALOG_NODE:
        raise click.UsageError(f"{CATALOG_NODE!r} is the catalog's own name among nodes: give the node another name")
    secret = _cluster_secret(secret_file)
    expires = int(time.time()) + expires_in if expires_in else 0
    value = role_token(secret, role, name, expires)
    _emit(as_json, {"token": value, "role": role, "name": name, "expires": expires or None}, value)


@main.command("verify-key")
@click.option("--secret-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The cluster secret (mode 600), or $FLIGHTPART_SECRET.")
@JSON_OPTION
def verify_key_command(secret_file: str | None, as_json: bool) -> None:
    """Print the cluster's verify key: a node checks tokens with it (`serve --verify-key-file`) and can mint none."""
    from .tokens import verify_key

    value = verify_key(_cluster_secret(secret_file)).text()
    _emit(as_json, {"verify_key": value}, value)


def _cluster_secret(secret_file: str | None) -> bytes:
    from .server.daemon import Security

    secret = Security(secret_file).secret()
    if secret is None:
        raise click.UsageError("no cluster secret: pass --secret-file or set $FLIGHTPART_SECRET")
    return secret


@main.command()
@click.argument("address")
@click.option("--service", default="", help="Service name to ask about (default: the whole daemon).")
@click.option("--timeout", default=5.0, show_default=True, type=float)
@JSON_OPTION
def health(address: str, service: str, timeout: float, as_json: bool) -> None:
    """Probe a daemon's health port (grpc.health.v1): exit 0 when SERVING, 1 when not, 2 when unreachable."""
    import grpc

    from .server.health import probe

    try:
        status = probe(address, service, timeout)
    except grpc.RpcError as exc:
        record = {"address": address, "status": "UNREACHABLE", "reason": exc.code().name}
        click.echo(json.dumps(record) if as_json else f"UNREACHABLE {address}: {exc.code().name}. "
                   "Next: is the daemon running, with --health-port?", err=not as_json)
        sys.exit(2)
    _emit(as_json, {"address": address, "status": status}, status)
    sys.exit(0 if status == "SERVING" else 1)


@main.command()
@click.argument("uri", callback=lambda _c, _p, v: _address(v))
@click.option("--timeout", default=60.0, show_default=True, type=float, help="Give up after this many seconds (exit 1).")
@click.option("--nodes", "min_nodes", default=0, show_default=True, type=click.IntRange(min=0),
              help="For a catalog: also wait until this many nodes are alive.")
@JSON_OPTION
def wait(uri: str, timeout: float, min_nodes: int, as_json: bool) -> None:
    """Wait until the daemon at URI answers (and, with --nodes, until that many nodes joined): for scripts that start
    daemons in the background."""
    from .tools.waiting import wait_for

    result = wait_for(uri, timeout=timeout, min_nodes=min_nodes)
    _emit(as_json, result, f"ready: {result['role']} {uri}" + (f", {result['nodes_alive']} nodes alive"
                                                                  if result["role"] == "catalog" else ""))


@main.command()
@click.argument("uri", callback=lambda _c, _p, v: _address(v))
@JSON_OPTION
def stats(uri: str, as_json: bool) -> None:
    """A daemon's counters: for a node bytes and batches served, partitions held; for a catalog nodes and datasets."""
    from .io.access import Access
    from .io.connections import ConnectionPool
    from .io.errors import translated
    from .wire import Empty

    with ConnectionPool(Access.from_environment()) as pool, translated():
        result = pool.action(uri, "stats", Empty())
    click.echo(json.dumps(result) if as_json else "\n".join(f"{k}: {v}" for k, v in result.items()))


@main.command()
@click.option("--size", default=None, help="Bytes of data (suffixes K, M, G allowed) [default: 1G; 256M with --network].")
@click.option("--quick", is_flag=True, help="64 MiB and fewer runs: a smoke test in well under 3 minutes.")
@click.option("--runs", default=None, type=int, help="Timed runs per contender (after one warm-up).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="Write every figure as JSON.")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False), help="Draw a bar chart (PNG).")
@click.option("--scale", is_flag=True, help="How costs grow: up to 100,000 partitions, 4,000 simulated nodes and 10,000 columns "
                                            "(about 10 minutes; with --quick, small sizes).")
@click.option("--network", default=None, metavar="RATES",
              help="Hosts as network namespaces with links shaped to each rate in turn, comma-separated: "
                   "loopback, 10gbit, 1gbit, ... (needs root for anything but loopback).")
def bench(size: str | None, quick: bool, runs: int | None, json_path: str | None, plot_path: str | None, scale: bool,
          network: str | None) -> None:
    """flightpart against raw Flight, Dask and Ray on this machine, side by side (--scale: how its costs grow;
    --network: on hosts with real, shaped links)."""
    if network:
        from .tools.bench import render
        from .tools.bench_network import plot_network, run_network_bench

        nbytes = _parse_size(size) if size else (32 << 20 if quick else 256 << 20)
        results = []
        for rate in [r.strip() for r in network.split(",") if r.strip()]:
            try:
                results.append(run_network_bench(rate, nbytes, runs=runs or (3 if quick else 5),
                                                 log=lambda m: click.echo(m, err=True)))
            except (RuntimeError, ValueError) as exc:
                raise click.ClickException(str(exc)) from None
            render(results[-1])
        if json_path:
            Path(json_path).write_text(json.dumps({"network_runs": results}, indent=2))
        if plot_path:
            plot_network(results, plot_path)
        return
    if scale:
        from .tools.bench_scale import plot_scale, render_scale, run_scale

        result = run_scale(quick=quick, log=lambda m: click.echo(m, err=True))
        render_scale(result)
        if json_path:
            Path(json_path).write_text(json.dumps(result, indent=2))
        if plot_path:
            plot_scale(result, plot_path)
        return
    from .tools.bench import plot, render, run_bench

    nbytes = 64 << 20 if quick else _parse_size(size or "1G")
    result = run_bench(nbytes, quick=quick, runs=runs, log=lambda m: click.echo(m, err=True))
    render(result)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
    if plot_path:
        plot(result, plot_path)


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("IB").rstrip("B") if text[-1:].isalpha() else text
    try:
        if text[-1:] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected bytes such as 1073741824, 512M or 1G", param_hint="--size") from None


@main.command()
@click.option("--size-mb", default=300, show_default=True, type=int, help="Size of the demo dataset.")
def demo(size_mb: int) -> None:
    """A catalog and 3 nodes on 127.0.0.2-4: put, open and read a dataset, then stop."""
    from .tools.demo import run_demo

    sys.exit(run_demo(size_mb))
