"""``flightpart queries``: the SQL queries a catalog runs now and the last it finished."""

from __future__ import annotations

import json

import click

from .group import CATALOG_OPTION, JSON_OPTION, client_for, main, print_table


@main.command()
@CATALOG_OPTION
@JSON_OPTION
@click.option("--running", is_flag=True, help="Only the queries running now.")
def queries(catalog: str, as_json: bool, running: bool) -> None:
    """The catalog's SQL queries: running now, then the last finished (an admin's)."""
    with client_for(catalog) as client:
        found = client.queries()
    rows = found.running + ([] if running else found.recent)
    if as_json:
        click.echo(json.dumps(rows))
        return
    print_table(("id", "caller", "outcome", "seconds", "rows", "bytes from nodes", "query"),
                [(q["id"], q["caller"], q["outcome"], f"{q['seconds']:.3f}",
                  "" if q["rows"] is None else f"{q['rows']:,}",
                  "" if q["bytes_from_nodes"] is None else f"{q['bytes_from_nodes']:,}", q["text"]) for q in rows])
