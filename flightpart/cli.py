"""The ``flightpart`` command."""

from __future__ import annotations

import click

from . import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="flightpart")
def main() -> None:
    """flightpart: partitioned dataframes over Arrow Flight."""
