"""The bench and demo commands."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from .group import main, parse_size


@dataclass(frozen=True)
class BenchOptions:
    """What ``flightpart bench`` was asked, one field per option (``json_path``: ``--json``, ``plot_path``:
    ``--plot``, ``compare_path``: ``--compare``, ``from_path``: ``--from-json``, ``markdown_path``: ``--markdown``,
    ``sql_mix``: ``--sql``)."""

    size: str | None
    quick: bool
    runs: int | None
    json_path: str | None
    plot_path: str | None
    scale: bool
    compare_path: str | None
    from_path: str | None
    markdown_path: str | None
    strict: bool
    sql_mix: bool
    network: str | None


@main.command()
@click.option("--size", default=None,
              help="Bytes of data (suffixes K, M, G allowed) [default: 1G; 256M with --network].")
@click.option("--quick", is_flag=True, help="64 MiB and fewer runs: a smoke test in well under 3 minutes.")
@click.option("--runs", default=None, type=int, help="Timed runs per contender (after one warm-up).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="Write every figure as JSON.")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False), help="Draw a bar chart (PNG).")
@click.option("--scale", is_flag=True,
              help="How costs grow: up to 100,000 partitions, 4,000 simulated nodes and 10,000 columns "
                   "(about 10 minutes; with --quick, small sizes).")
@click.option("--compare", "compare_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Show each case against a previous run's --json, flagging a slowdown beyond the noise "
                   "(within the runs, or between kept runs of one code); a run saved with --json then carries the runs "
                   "kept before it.")
@click.option("--from-json", "from_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Show (and --plot) a saved run (plain, --scale or --network) instead of running the bench; "
                   "--compare and --markdown take a plain or --network one.")
@click.option("--markdown", "markdown_path", default=None, type=click.Path(dir_okay=False),
              help="Write the result (and the comparison) as Markdown tables, as docs/benchmarks.md shows them.")
@click.option("--strict", is_flag=True, help="With --compare: exit 1 when a case is slower than before.")
@click.option("--sql", "sql_mix", is_flag=True,
              help="A query mix through one ADBC client: flightpart's catalog (3 nodes, 6 M rows; "
                   "300,000 with --quick) against roapi's Flight SQL server (when installed) and DuckDB on the "
                   "same Parquet files.")
@click.option("--network", default=None, metavar="RATES",
              help="Hosts as network namespaces with links shaped to each rate in turn, comma-separated: "
                   "loopback, 10gbit, 1gbit, ... (needs root for anything but loopback).")
def bench(**options: Any) -> None:
    """flightpart against raw Flight, Dask and Ray on this machine, side by side (--scale: how its costs grow;
    --network: on hosts with real, shaped links; --sql: SQL clients' queries against roapi and DuckDB; --compare:
    against an earlier run)."""
    o = BenchOptions(**options)
    if o.strict and not o.compare_path:
        raise click.UsageError("--strict judges a comparison: give --compare OLD.json too")
    if o.sql_mix:
        _sql_bench(o.quick, o.runs, o.json_path, o.plot_path, o.compare_path, o.from_path, o.markdown_path, o.strict)
        return
    if o.network:
        from flightpart.bench.network import plot_network, run_network_bench
        from flightpart.bench.run import render

        nbytes = parse_size(o.size, "--size") if o.size else (32 << 20 if o.quick else 256 << 20)
        earlier = _load_run(o.compare_path, "network_runs", "--network") if o.compare_path else None  # fails at once
        results = []
        if o.from_path:  # a saved run shown again, not run
            results = _load_run(o.from_path, "network_runs", "--network")["network_runs"]
            for result in results:
                render(result)
        rates = [] if o.from_path else [r.strip() for r in o.network.split(",") if r.strip()]
        for rate in rates:
            try:
                results.append(run_network_bench(rate, nbytes, runs=o.runs or (3 if o.quick else 5),
                                                 log=lambda m: click.echo(m, err=True)))
            except (RuntimeError, ValueError) as exc:
                raise click.ClickException(str(exc)) from None
            render(results[-1])
        if o.json_path:
            Path(o.json_path).write_text(json.dumps({"network_runs": results}, indent=2))
        if o.plot_path:
            plot_network(results, o.plot_path)
        _compared({"network_runs": results}, o.compare_path, earlier, o.markdown_path, o.strict)
        return
    if o.scale:
        from flightpart.bench.scale import plot_scale, render_scale, run_scale

        if o.compare_path or o.markdown_path:
            raise click.UsageError("--compare and --markdown show the plain bench's and --network's cases; a --scale "
                                   "run's goals are shown by --scale alone (docs/limits.md keeps them)")

        if o.from_path:  # a saved run shown again, not run
            result = _load_run(o.from_path, "goals", "--scale")
        else:
            result = run_scale(quick=o.quick, log=lambda m: click.echo(m, err=True))
        render_scale(result)
        if o.json_path:
            Path(o.json_path).write_text(json.dumps(result, indent=2))
        if o.plot_path:
            plot_scale(result, o.plot_path)
        return
    from flightpart.bench.history import carried, code_digest, stamp
    from flightpart.bench.run import plot, render, run_bench

    earlier = _load_run(o.compare_path) if o.compare_path else None  # before the run: a bad file fails at once
    if o.from_path:
        result = _load_run(o.from_path)
    else:
        nbytes = 64 << 20 if o.quick else parse_size(o.size or "1G", "--size")
        code = code_digest()  # the code as the run starts
        result = stamp(run_bench(nbytes, quick=o.quick, runs=o.runs, log=lambda m: click.echo(m, err=True)), code)
    render(result)
    if earlier is not None:  # the run carries the runs kept before it: the noise between runs of one code
        result["history"] = carried(earlier)
    if o.json_path:
        Path(o.json_path).write_text(json.dumps(result, indent=2))
    if o.plot_path:
        plot(result, o.plot_path)
    _compared(result, o.compare_path, earlier, o.markdown_path, o.strict)


def _sql_bench(quick: bool, runs: int | None, json_path: str | None, plot_path: str | None, compare_path: str | None,
               from_path: str | None, markdown_path: str | None, strict: bool) -> None:
    """``bench --sql``: run (or show a saved run of) the query mix, its goals, and its comparison with an earlier
    one."""
    from flightpart.bench.history import carried, code_digest, stamp
    from flightpart.bench.run import render
    from flightpart.bench.sql_mix import goals_markdown, plot_sql, render_goals, run_sql_bench

    earlier = _load_run(compare_path, kind="--sql") if compare_path else None
    if earlier is not None and earlier.get("kind") != "sql":
        raise click.BadParameter(f"{compare_path}: not a bench --sql run saved with --json")
    if from_path:
        result = _load_run(from_path, kind="--sql")
        if result.get("kind") != "sql":
            raise click.BadParameter(f"{from_path}: not a bench --sql run saved with --json")
    else:
        code = code_digest()
        result = stamp(run_sql_bench(300_000 if quick else 6_000_000, runs=runs or (3 if quick else 7), quick=quick,
                                     log=lambda m: click.echo(m, err=True)), code)
    render(result)
    render_goals(result)
    if earlier is not None:
        result["history"] = carried(earlier)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
    if plot_path:
        plot_sql(result, plot_path)
    _compared(result, compare_path, earlier, markdown_path, strict)
    if markdown_path:
        with open(markdown_path, "a") as out:
            out.write("\n" + goals_markdown(result))


def _load_run(path: str, key: str = "cases", kind: str = "") -> dict:
    """A run saved with --json (a usage error names what is wrong with any other file); ``key`` is the list every
    run of that ``kind`` (the plain bench, ``--scale`` or ``--network``) has."""
    what = " ".join(filter(None, ("a", kind, "bench run saved with --json")))
    try:
        result = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise click.BadParameter(f"{path}: not {what} ({exc})") from None
    if not isinstance(result, dict) or not isinstance(result.get(key), list):
        raise click.BadParameter(f"{path}: not {what} (it has no list of {key.replace('_', ' ')})")
    if key == "network_runs":
        rates = [run.get("network") if isinstance(run, dict) and isinstance(run.get("cases"), list) else None
                 for run in result[key]]
        if not all(isinstance(rate, str) for rate in rates) or len(set(rates)) != len(rates):
            raise click.BadParameter(f"{path}: not {what} (each run must name its link once, as \"network\", and "
                                     "list its cases)")
    return result


def _compared(result: dict, compare_path: str | None, earlier: dict | None, markdown_path: str | None,
              strict: bool) -> None:
    """The comparison with an earlier run (of a ``--network`` run: link by link), shown and written as Markdown; exit
    1 under --strict when slower."""
    from flightpart.bench.compare import any_slower, compare, compare_links, markdown, render_comparison
    from flightpart.bench.run import as_markdown

    links = result.get("network_runs")
    if earlier is None:
        changes = []
    else:
        changes = compare(earlier, result) if links is None else compare_links(earlier, result)
    if compare_path:
        render_comparison(changes, compare_path)
    if markdown_path:
        text = as_markdown(result) if links is None else \
            "\n".join(f"#### {run['network']}\n\n" + as_markdown(run) for run in links)
        if compare_path:
            text += f"\nAgainst `{Path(compare_path).name}`:\n\n" + markdown(changes)
        Path(markdown_path).write_text(text)
    if strict and any_slower(changes):
        raise SystemExit(1)


@main.command()
@click.option("--size-mb", default=300, show_default=True, type=int, help="Size of the demo dataset.")
def demo(size_mb: int) -> None:
    """A catalog and 3 nodes on 127.0.0.2-4: put, open and read a dataset, then stop."""
    from .demo import run_demo

    sys.exit(run_demo(size_mb))
