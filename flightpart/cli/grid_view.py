"""The partition grid of a dataset, for people (rich) and scripts (JSON)."""

from __future__ import annotations

from typing import Any

from flightpart.frames import describe_columns
from flightpart.palette import node_colour
from flightpart.wire import NodeRow


def grid_json(ds: Any) -> dict:
    d = ds.__partitioned__
    sizes = ds.partition_nbytes()
    return {
        "name": ds.name,
        "version": ds.version,
        "shape": list(d["shape"]),
        "partition_tiling": list(d["partition_tiling"]),
        "columns": describe_columns(ds.schema),
        "partitions": [
            {"position": list(pos), "start": list(p["start"]), "shape": list(p["shape"]), "nbytes": sizes[pos],
             "nodes": [uri for uri, _ip, _pid in p["data"].replicas], "location": [list(loc) for loc in p["location"]]}
            for pos, p in sorted(d["partitions"].items())
        ],
    }


def render_grid(ds: Any, nodes: list[NodeRow], console: Any = None) -> None:
    """One cell per partition, coloured by the node holding its first replica."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    d = ds.__partitioned__
    colour = {n.uri: node_colour(k) for k, n in enumerate(nodes)}
    p, q = d["partition_tiling"]
    table = Table(title=f"{ds.name} v{ds.version}: {d['shape'][0]:,} rows x {d['shape'][1]} columns, "
                        f"{ds.nbytes:,} bytes", show_lines=True)
    table.add_column("rows")
    for j in range(q):
        table.add_column(f"column group {j}")
    sizes = ds.partition_nbytes()
    for i in range(p):
        first = d["partitions"][(i, 0)]
        cells = []
        for j in range(q):
            part = d["partitions"][(i, j)]
            holders = part["data"].replicas
            label = "\n".join(f"[{colour.get(uri, 'white')}]{ip}[/]" for uri, ip, _pid in holders)
            cells.append(f"{label}\n{part['shape'][0]:,} rows\n{sizes[(i, j)] / 1e6:,.1f} MB")
        table.add_row(f"{first['start'][0]:,}..{first['start'][0] + first['shape'][0]:,}", *cells)
    console.print(table)
    console.print(columns_table(ds.schema))


def columns_table(schema: Any) -> Any:
    """The columns of a dataset: name, type, nullable (what ``show`` prints under the grid)."""
    from rich.table import Table
    from rich.text import Text

    table = Table("column", "type", "nulls allowed", title="columns")
    for c in describe_columns(schema):  # as Text: a type such as timestamp[us] is not markup
        table.add_row(Text(c["name"]), Text(c["type"]), "yes" if c["nullable"] else "no")
    return table
