"""The ``flightpart`` command group and the options and helpers its commands share."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from flightpart.version import __version__

from .errors import error_line

CATALOG_OPTION = click.option("--catalog", envvar="FLIGHTPART_CATALOG", required=True,
                              callback=lambda _c, _p, v: flight_address(v),
                              help="Catalog URI, e.g. grpc://head:8815 (or $FLIGHTPART_CATALOG).")
HOST_OPTION = click.option("--client-host", "host", envvar="FLIGHTPART_HOST", default=None,
                           help="Address that counts as this host for locality (or $FLIGHTPART_HOST).")
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


class FriendlyGroup(click.Group):
    """Every error as one line with what to do next (:mod:`flightpart.cli.errors`), not a traceback, unless --debug."""

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
    from .logs import configure_logging

    configure_logging(log_level, log_format)
    ctx.obj = {"debug": debug}


# --------------------------------------------------------------------------- daemons




def print_table(columns: tuple[str, ...], rows: list[tuple]) -> None:
    """A rich table of ``rows`` for people (``--json`` gives scripts the same)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(*columns)
    for row in rows:
        table.add_row(*(Text(str(v)) for v in row))  # plain text: a name or type such as x[us] is not markup
    Console().print(table)


def flight_address(value: str | None) -> str | None:
    """A daemon's address as a Flight URI (a web address or one without a port is a usage error), remembered for
    hints."""
    if value is None:
        return None
    from flightpart.io.access import TLS_CA_ENV
    from flightpart.io.leader import split_addresses
    from flightpart.io.uris import flight_uri

    try:  # several catalogs sharing a lease: a comma-separated list, each a Flight URI
        uri = ",".join(flight_uri(one, tls=bool(os.environ.get(TLS_CA_ENV))) for one in split_addresses(value)
                       or [value])
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx else None
    if root is not None and root.obj is not None:
        root.obj["address"] = uri
    return uri


def client_for(catalog: str, host: str | None = None):
    from flightpart.client import connect

    return connect(catalog, host=host)


def emit(as_json: bool, record: dict, text: str) -> None:
    """A command's result: ``record`` as one JSON line for scripts, else ``text`` for people."""
    click.echo(json.dumps(record) if as_json else text)


def parse_size(text: str, option: str) -> int:
    """Bytes written as 1073741824, 512M, 1G or 64MiB (K, M, G: powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    number = text.strip().upper().removesuffix("IB").removesuffix("B") if text[-1:].isalpha() else text.strip()
    try:
        value = int(float(number[:-1]) * units[number[-1]]) if number[-1:] in units else int(number)
    except (ValueError, IndexError):
        value = -1
    if value <= 0:
        raise click.BadParameter(f"{text!r}: expected bytes such as 1073741824, 512M or 1G", param_hint=option)
    return value


def parse_tiling(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        p, q = (int(v) for v in value.lower().replace("x", ",").split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected ROWSxCOLS such as 4x1", param_hint="--tiling") from None
    return (p, q)
