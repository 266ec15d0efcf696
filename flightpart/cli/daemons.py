"""Commands that run daemons and ask them how they are: serve, catalog, nodes, catalogs, repair, scrub, token,
verify-key, health, wait, stats."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from flightpart.server.settings import CatalogSettings, NodeSettings

from .group import CATALOG_OPTION, JSON_OPTION, client_for, emit, flight_address, main, print_table
from .options import options_of, settings_of


@main.command()
@options_of(NodeSettings)
def serve(**options: Any) -> None:
    """Run a node (and, without --catalog, a catalog too)."""
    from flightpart.server.daemon import run_node
    from flightpart.sql import SqlCatalogServer

    run_node(settings_of(NodeSettings, options), catalog_class=SqlCatalogServer)


@main.command("catalog")
@options_of(CatalogSettings)
def catalog_cmd(**options: Any) -> None:
    """Run a catalog alone (it also answers Flight SQL: docs/querying.md, \"SQL over Flight\")."""
    from flightpart.server.daemon import run_catalog
    from flightpart.sql import SqlCatalogServer

    run_catalog(settings_of(CatalogSettings, options), catalog_class=SqlCatalogServer)


# --------------------------------------------------------------------------- datasets




@main.command()
@CATALOG_OPTION
@JSON_OPTION
def nodes(catalog: str, as_json: bool) -> None:
    """List the nodes the catalog knows, alive or dead."""
    with client_for(catalog) as client:
        rows = client.nodes()
        leadership = client.leadership()
    if as_json:
        click.echo(json.dumps([n.to_json() for n in rows]))
        return
    if leadership.role != "single":
        click.echo(_leadership_text(leadership))
    print_table(("node", "uri", "ip", "pid", "state", "clock skew"),
                 [(n.node_id[:8], n.uri, n.ip, n.pid, "[green]alive[/]" if n.alive else "[red]dead[/]",
                   _skew_text(n.clock_skew)) for n in rows])


@main.command()
@CATALOG_OPTION
@JSON_OPTION
def catalogs(catalog: str, as_json: bool) -> None:
    """Which catalog leads (since when, with which epoch) and which stand by (catalogs sharing a --lease)."""
    with client_for(catalog) as client:
        leadership = client.leadership()
    if as_json:
        click.echo(json.dumps(leadership.to_json()))
        return
    click.echo(_leadership_text(leadership))


def _leadership_text(leadership) -> str:
    """One line: the leader, its epoch and since when, the standbys."""
    import time

    if leadership.role == "single":
        return f"one catalog, {leadership.uri} (no lease: state in SQLite)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(leadership.since)) if leadership.since else "?"
    return (f"leader {leadership.leader or '(being elected)'}, epoch {leadership.epoch}, since {since}; standbys: "
            f"{', '.join(leadership.standbys) or 'none'}")


def _skew_text(seconds: float | None) -> str:
    """A node's clock against the catalog's (from its last heartbeat), as `flightpart nodes` shows it."""
    return "-" if seconds is None else f"{seconds:+.1f} s"


@main.command()
@CATALOG_OPTION
@JSON_OPTION
def repair(catalog: str, as_json: bool) -> None:
    """Copy under-replicated partitions to live nodes. Exits 1 when a partition has no live replica left or a copy
    could not be made (a holder or target did not answer: run it again once it is back)."""
    with client_for(catalog) as client:
        result = client.repair()
    if as_json:
        click.echo(json.dumps(result))
        if result["lost"] or result["failed"]:
            raise SystemExit(1)
        return
    for c in result["copied"]:
        click.echo(f"copied {c['dataset']} v{c['version']} {tuple(c['part'])} to {c['to']}")
    for m in result["lost"]:
        click.echo(f"LOST {m['dataset']} v{m['version']} {tuple(m['part'])}: no live replica", err=True)
    for f in result["failed"]:
        click.echo(f"NOT COPIED {f['dataset']} v{f['version']} {tuple(f['part'])}: {f['reason']}", err=True)
    click.echo(f"{len(result['copied'])} copies made, {len(result['lost'])} partitions without a live replica"
               + (f", {len(result['failed'])} copies not made (run repair again)" if result["failed"] else ""))
    if result["lost"] or result["failed"]:
        raise SystemExit(1)


SCRUB_INCOMPLETE = 3
"""``flightpart scrub``'s exit status when nothing was found but a node was not scrubbed (1: something was found)."""


@main.command()
@CATALOG_OPTION
@JSON_OPTION
def scrub(catalog: str, as_json: bool) -> None:
    """Check every live node's files against their checksums now; report damaged and missing partitions.

    Damaged files are moved to each node's quarantine folder and no
    longer served; the catalog stops listing those replicas, so a
    ``flightpart repair`` recreates them. Exits 1 when anything was found,
    else 3 when a node was not scrubbed (dead, or it stopped beating during
    the scrub), else 0.
    """
    from flightpart.wire import SCRUB_DEADLINE, ScrubCluster

    with client_for(catalog) as client:
        result = client.call(ScrubCluster(), timeout=SCRUB_DEADLINE).to_json()
    if as_json:
        click.echo(json.dumps(result))
    else:
        for node in result["nodes"]:
            for kind in ("damaged", "missing"):
                for p in node.get(kind, ()):
                    click.echo(f"{kind.upper()} {p['dataset']} v{p['version']} {tuple(p['part'])} on {node['uri']}",
                               err=True)
        for uri in result["unreachable"]:
            click.echo(f"UNREACHABLE {uri}: not scrubbed", err=True)
        checked = sum(n.get("checked", 0) for n in result["nodes"])
        click.echo(f"{checked} files checked on {len(result['nodes'])} nodes: {result['damaged']} damaged, "
                   f"{result['missing']} missing")
    if result["damaged"] or result["missing"]:
        raise SystemExit(1)
    if result["unreachable"]:
        raise SystemExit(SCRUB_INCOMPLETE)


@main.command()
@click.option("--role", required=True, type=click.Choice(["reader", "writer", "admin", "node"]),
              help="What the token may do.")
@click.option("--name", required=True, help="Who holds it (a user, or for --role node the node's id).")
@click.option("--expires-in", default=0, type=int, help="Seconds until the token expires (0: never).")
@click.option("--secret-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The cluster secret (mode 600), or $FLIGHTPART_SECRET.")
@JSON_OPTION
def token(role: str, name: str, expires_in: int, secret_file: str | None, as_json: bool) -> None:
    """Print a role token signed with the cluster secret (give it to a user as $FLIGHTPART_TOKEN, or to a node
    as its --node-token-file)."""
    import time

    from flightpart.tokens import CATALOG_NODE, role_token

    if role == "node" and name == CATALOG_NODE:
        raise click.UsageError(f"{CATALOG_NODE!r} is the catalog's own name among nodes: give the node another name")
    secret = _cluster_secret(secret_file)
    expires = int(time.time()) + expires_in if expires_in else 0
    value = role_token(secret, role, name, expires)
    emit(as_json, {"token": value, "role": role, "name": name, "expires": expires or None}, value)


@main.command("verify-key")
@click.option("--secret-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The cluster secret (mode 600), or $FLIGHTPART_SECRET.")
@JSON_OPTION
def verify_key_command(secret_file: str | None, as_json: bool) -> None:
    """Print the cluster's verify key: a node checks tokens with it (`serve --verify-key-file`) and can mint none."""
    from flightpart.tokens import verify_key

    value = verify_key(_cluster_secret(secret_file)).text()
    emit(as_json, {"verify_key": value}, value)


def _cluster_secret(secret_file: str | None) -> bytes:
    from flightpart.server.security import Security

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

    from flightpart.server.health import probe

    try:
        status = probe(address, service, timeout)
    except grpc.RpcError as exc:
        record = {"address": address, "status": "UNREACHABLE", "reason": exc.code().name}
        click.echo(json.dumps(record) if as_json else f"UNREACHABLE {address}: {exc.code().name}. "
                   "Next: is the daemon running, with --health-port?", err=not as_json)
        sys.exit(2)
    emit(as_json, {"address": address, "status": status}, status)
    sys.exit(0 if status == "SERVING" else 1)


@main.command()
@click.argument("uri", callback=lambda _c, _p, v: flight_address(v))
@click.option("--timeout", default=60.0, show_default=True, type=float,
              help="Give up after this many seconds (exit 1).")
@click.option("--nodes", "min_nodes", default=0, show_default=True, type=click.IntRange(min=0),
              help="For a catalog: also wait until this many nodes are alive.")
@JSON_OPTION
def wait(uri: str, timeout: float, min_nodes: int, as_json: bool) -> None:
    """Wait until the daemon at URI answers (and, with --nodes, until that many nodes joined): for scripts that start
    daemons in the background."""
    from .waiting import wait_for

    result = wait_for(uri, timeout=timeout, min_nodes=min_nodes)
    emit(as_json, result, f"ready: {result['role']} {uri}" + (f", {result['nodes_alive']} nodes alive"
                                                                  if result["role"] == "catalog" else ""))


@main.command()
@click.argument("uri", callback=lambda _c, _p, v: flight_address(v))
@JSON_OPTION
def stats(uri: str, as_json: bool) -> None:
    """A daemon's counters: for a node bytes and batches served, partitions held; for a catalog nodes and datasets."""
    from flightpart.io.access import Access
    from flightpart.io.connections import ConnectionPool
    from flightpart.io.errors import translated
    from flightpart.wire import GetStats

    with ConnectionPool(Access.from_environment()) as pool, translated():
        result = pool.action(uri, GetStats()).to_json()
    click.echo(json.dumps(result) if as_json else "\n".join(f"{k}: {v}" for k, v in result.items()))
