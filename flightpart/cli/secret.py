"""``flightpart secret``: a fresh cluster secret that every daemon takes (32 random bytes), printed or written 600."""

from __future__ import annotations

import os

import click

from .group import main


@main.command()
@click.option("--out", "out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write it to this new file, mode 600 (an existing file is left alone), instead of printing it.")
def secret(out: str | None) -> None:
    """Make a new cluster secret (32 random bytes in URL-safe base64, 256 bits). Give the file to the catalog with
    --secret-file, then mint tokens with `flightpart token` and the nodes' verify key with `flightpart verify-key`."""
    from flightpart.tokens import new_secret

    value = new_secret()
    if out is None:
        click.echo(value)
        return
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise click.UsageError(f"{out} exists: a cluster secret is not overwritten (its tokens would stop working); "
                               "remove it first, or write the new one elsewhere") from None
    except OSError as exc:
        raise click.UsageError(f"{out}: cannot create it ({exc.strerror})") from None
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)  # whatever the umask allowed, never more than its owner
        f.write(value + "\n")
    click.echo(f"wrote a new cluster secret to {out} (mode 600): give it to the catalog with --secret-file {out}",
               err=True)
