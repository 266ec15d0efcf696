"""The bench and demo commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .group import (
    main,
)


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
        from flightpart.bench.network import plot_network, run_network_bench
        from flightpart.bench.run import render

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
        from flightpart.bench.scale import plot_scale, render_scale, run_scale

        result = run_scale(quick=quick, log=lambda m: click.echo(m, err=True))
        render_scale(result)
        if json_path:
            Path(json_path).write_text(json.dumps(result, indent=2))
        if plot_path:
            plot_scale(result, plot_path)
        return
    from flightpart.bench.run import plot, render, run_bench

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
    from .demo import run_demo

    sys.exit(run_demo(size_mb))
