"""The catalog's status page: every node with its health and traffic, every dataset's grid coloured by node.

One self-reloading HTML page, and the same facts at ``/status.json``. Node figures come from each live node's
``stats``, asked in parallel with a short deadline (a hung node shows unreachable). Grids use the colours of
``flightpart show``.
"""

from __future__ import annotations

import html
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from flightpart.frames import describe_columns
from flightpart.io.connections import ConnectionPool
from flightpart.palette import node_colour
from flightpart.version import __version__
from flightpart.wire import GetStats, error_message

from .auth import CLOCK_MARGIN
from .state import CatalogState

REFRESH_SECONDS = 3
NODE_DEADLINE = 1.5
MAX_GRIDS = 50
MAX_CELLS = 1024
"""Past this many partitions a grid is summarised, not drawn (a page of 100,000 cells helps nobody)."""


def cluster_status(state: CatalogState, pool: ConnectionPool, catalogs: dict | None = None) -> dict:
    """Nodes (with their stats where they answer) and each dataset's latest version, as JSON-ready dicts;
    ``catalogs``: :class:`~flightpart.wire.Leadership` as JSON."""
    records = state.nodes()
    colours = {n.uri: node_colour(k, html=True) for k, n in enumerate(records)}

    def ask(uri: str) -> Any:
        try:
            return pool.action(uri, GetStats(), timeout=NODE_DEADLINE).values  # judged by readable_stats
        except Exception as exc:
            pool.discard(uri)
            return {"unreachable": " ".join(error_message(exc).split())[:200]}

    alive = [n.uri for n in records if n.alive]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(alive)))) as workers:
        stats = dict(zip(alive, workers.map(ask, alive)))
    nodes = []
    for n in records:
        s, problems = readable_stats(stats.get(n.uri, {})) if n.alive else ({}, ["no heartbeat: dead"])
        nodes.append({"node_id": n.node_id, "uri": n.uri, "ip": n.ip, "pid": n.pid, "alive": n.alive,
                      "colour": colours[n.uri],
                      "health": "SERVING" if not problems else "NOT_SERVING", "problems": problems,
                      "bytes_sent": s.get("bytes_sent"), "partitions_held": s.get("partitions_held"),
                      "free_bytes": s.get("free_bytes", n.free_bytes), "clock_skew": n.clock_skew})
    datasets = []
    for k, record in enumerate(state.datasets()):
        entry: dict[str, Any] = {"name": record.dataset, "version": record.version, "shape": list(record.shape),
                                 "tiling": list(record.grid), "nbytes": record.nbytes, "partitions": None,
                                 "columns": stored_columns(record.schema)}
        if k < MAX_GRIDS and len(record.parts) <= MAX_CELLS:
            entry["partitions"] = [{"part": list(p.part), "start": list(p.start), "shape": list(p.shape),
                                    "nbytes": p.nbytes, "nodes": [h.uri for h in p.nodes]} for p in record.parts]
        datasets.append(entry)
    return {"version": __version__, "time": time.time(), "nodes": nodes, "datasets": datasets, "colours": colours,
            "catalogs": catalogs}


def stored_columns(schema: bytes | None) -> list[dict[str, Any]]:
    """The version's columns and types (none when its stored schema cannot be read: the page still draws)."""
    try:
        return describe_columns(pa.ipc.read_schema(pa.py_buffer(schema)))
    except (pa.ArrowException, TypeError, ValueError):
        return []


MAX_COLUMNS_SHOWN = 40
"""Columns the page lists per dataset; the rest are counted (``/status.json`` has them all)."""

FIGURES = ("bytes_sent", "partitions_held", "free_bytes")
"""The numbers of a node's ``stats`` reply the page shows."""


def readable_stats(reply: Any) -> tuple[dict, list[str]]:
    """A node's ``stats`` reply as the page may show it: its figures (numbers only) and its problems.

    A malformed reply shows that node as "stats unreadable" (NOT_SERVING)
    with what was wrong, never breaking the page.
    """
    if not isinstance(reply, dict):
        return {}, [f"stats unreadable: the reply is {_kind(reply)}, not an object"]
    if "unreachable" in reply:
        return {}, [f"unreachable: {reply['unreachable']}"]
    figures, wrong = {}, []
    for key in FIGURES:
        value = reply.get(key)
        if _is_count(value):
            figures[key] = value
        else:
            wrong.append(f"{key} is missing" if key not in reply else f"{key} is {_kind(value)}")
    problems = reply.get("problems", [])
    if not isinstance(problems, list) or not all(isinstance(p, str) for p in problems):
        wrong.append(f"problems is {_kind(problems)}")
        problems = []
    return figures, (([f"stats unreadable: {', '.join(wrong)}"] if wrong else [])
                     + [" ".join(p.split())[:200] for p in problems])


def _is_count(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _kind(value: Any) -> str:
    """What a value is, in a few words (never the value itself at length)."""
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return f"a {'list' if isinstance(value, list) else 'object'} of {len(value)}"
    return f"{type(value).__name__} {str(value)[:40]}"


def status_json(status: dict) -> bytes:
    return json.dumps(status).encode()


STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; background: #fafafa; }
h1 { font-size: 1.4em; margin: 0 0 .2em; } h2 { font-size: 1.15em; margin: 1.4em 0 .4em; }
.sub { color: #666; margin-bottom: 1em; }
table.nodes { border-collapse: collapse; background: #fff; }
table.nodes th, table.nodes td { padding: .35em .8em; border-bottom: 1px solid #ddd; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.swatch { display: inline-block; width: .9em; height: .9em; border-radius: 2px; vertical-align: middle; margin-right: .4em; }
.ok { color: #2a7a2a; font-weight: 600; } .bad { color: #b02a2a; font-weight: 600; }
.dataset { margin: 0 0 1.2em; } .dataset .title { font-weight: 600; margin-bottom: .3em; }
.grid { display: grid; gap: 3px; max-width: 960px; }
.cell { color: #fff; padding: .35em .45em; border-radius: 3px; font-size: 12px; line-height: 1.3; overflow: hidden; }
.cell.lost { background: #999 !important; }
"""  # noqa: E501


def render(status: dict) -> str:
    """The status page for ``status`` (from :func:`cluster_status`)."""
    e = html.escape
    rows = []
    for n in status["nodes"]:
        health = '<span class="ok">SERVING</span>' if n["health"] == "SERVING" else \
            f'<span class="bad" title="{e("; ".join(n["problems"]))}">NOT_SERVING</span> {e("; ".join(n["problems"]))}'
        rows.append(
            f'<tr class="node" data-uri="{e(n["uri"])}"><td><span class="swatch" '
            f'style="background:{n["colour"]}"></span>{e(n["node_id"][:8])}</td><td>{e(n["uri"])}</td>'
            f'<td>{"alive" if n["alive"] else "dead"}</td><td>{health}</td>'
            f'<td class="num">{_count(n["partitions_held"])}</td><td class="num">{_bytes(n["bytes_sent"])}</td>'
            f'<td class="num">{_bytes(n["free_bytes"])}</td><td class="num">{_skew(n["clock_skew"])}</td></tr>')
    grids = [_grid(d, status["colours"]) for d in status["datasets"]]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status["time"]))
    alive = sum(n["alive"] for n in status["nodes"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{REFRESH_SECONDS}">
<title>flightpart: {alive} nodes, {len(status["datasets"])} datasets</title><style>{STYLE}</style></head>
<body><h1>flightpart cluster</h1>
<div class="sub">catalog {e(status["version"])} · {alive} of {len(status["nodes"])} nodes alive · {len(status["datasets"])} datasets ·
updated {stamp} (every {REFRESH_SECONDS} s) · <a href="status.json">status.json</a> · <a href="metrics">metrics</a></div>
{_catalogs_line(status.get("catalogs"))}<h2>Nodes</h2>
<table class="nodes"><tr><th>node</th><th>address</th><th>state</th><th>health</th><th>partitions</th><th>bytes served</th>
<th>free disk</th><th>clock skew</th></tr>
{"".join(rows) or '<tr><td colspan="8">no node has registered yet</td></tr>'}
</table>
<h2>Datasets</h2>
{"".join(grids) or "<p>no dataset has been committed yet</p>"}
{_queries_section(status.get("queries"))}</body></html>
"""  # noqa: E501


QUERIES_SHOWN = 20
"""Recent SQL queries the page lists (``/status.json`` and ``flightpart queries`` have every one kept)."""


def _queries_section(queries: dict | None) -> str:
    """The SQL queries running now and the last finished, as a table (nothing for a catalog without SQL)."""
    if queries is None:
        return ""
    e = html.escape
    rows = [f'<tr class="query"><td class="num">{q["id"]}</td><td>{e(q["caller"])}</td><td>{e(q["outcome"])}</td>'
            f'<td class="num">{q["seconds"]:.3f} s</td><td class="num">{_count(q["rows"])}</td>'
            f'<td class="num">{_bytes(q["bytes_from_nodes"])}</td><td><code>{e(q["text"])}</code></td></tr>'
            for q in [*queries["running"], *queries["recent"][:QUERIES_SHOWN]]]
    return ('<h2>SQL queries</h2>\n<table class="nodes"><tr><th>id</th><th>caller</th><th>outcome</th><th>time</th>'
            '<th>rows</th><th>from nodes</th><th>query</th></tr>\n'
            + ("".join(rows) or '<tr><td colspan="7">no query yet</td></tr>') + "</table>\n")


def _catalogs_line(catalogs: dict | None) -> str:
    """Which catalog leads, since when and with which epoch, and the standbys (nothing for a single catalog)."""
    if not catalogs or catalogs.get("role") == "single":
        return ""
    e = html.escape
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(catalogs["since"])) if catalogs.get("since") else "?"
    standbys = ", ".join(e(s) for s in catalogs.get("standbys") or ()) or "none"
    return (f'<div class="catalogs">leader <b>{e(catalogs.get("leader") or "being elected")}</b> (epoch '
            f'{catalogs.get("epoch")}, since {since}) · standbys: {standbys} · this page from {e(catalogs["uri"])} '
            f'({e(catalogs["role"])})</div>')


def _grid(d: dict, colours: dict[str, str]) -> str:
    e = html.escape
    p, q = d["tiling"]
    head = (f'<div class="dataset" data-name="{e(d["name"])}"><div class="title">{e(d["name"])} v{d["version"]}: '
            f'{d["shape"][0]:,} rows × {d["shape"][1]} columns, {_bytes(d["nbytes"])}, {p}×{q} partitions</div>'
            + _columns_line(d.get("columns") or []))
    if d["partitions"] is None:
        return head + (f"<div>{p * q:,} partitions: too many to draw here; "
                       f"<code>flightpart show {e(d['name'])}</code></div></div>")
    cells = []
    for part in sorted(d["partitions"], key=lambda x: tuple(x["part"])):
        holders = part["nodes"]
        colour = colours.get(holders[0], "#999") if holders else "#999"
        label = "<br>".join(e(h.split("://")[-1]) for h in holders) or "no replica"
        tip = (f"partition {tuple(part['part'])}: rows {part['start'][0]:,}.., {part['shape'][0]:,} rows, "
               f"{_bytes(part['nbytes'])}")
        cells.append(f'<div class="cell{" lost" if not holders else ""}" style="background:{colour}" title="{e(tip)}" '
                     f'data-part="{part["part"][0]},{part["part"][1]}">{label}<br>{part["shape"][0]:,} rows</div>')
    return head + (f'<div class="grid" style="grid-template-columns: repeat({q}, minmax(8em, 1fr))">'
                   f'{"".join(cells)}</div></div>')


def _columns_line(columns: list[dict[str, Any]]) -> str:
    if not columns:
        return ""
    e = html.escape
    shown = ", ".join(f'<code>{e(c["name"])}</code> {e(c["type"])}' for c in columns[:MAX_COLUMNS_SHOWN])
    more = f" and {len(columns) - MAX_COLUMNS_SHOWN:,} more" if len(columns) > MAX_COLUMNS_SHOWN else ""
    return f'<div class="columns">{shown}{more}</div>'


def _skew(seconds: float | None) -> str:
    """A node's clock against the catalog's, marked when it is past the margin tokens are checked with."""
    if seconds is None:
        return "–"
    text = f"{seconds:+.1f} s"
    return f'<span class="bad">{text}</span>' if abs(seconds) > CLOCK_MARGIN else text


def _bytes(n: int | None) -> str:
    if n is None:
        return "–"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1000:
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1000
    return f"{value:,.1f} TB"


def _count(n: int | None) -> str:
    return "–" if n is None else f"{n:,}"
