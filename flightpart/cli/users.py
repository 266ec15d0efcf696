"""``flightpart user``, ``group``, ``grant``, ``revoke``, ``grants`` and ``revoke-token``: a catalog's users and who
may see which dataset (an admin's commands, run with an admin's token or the cluster secret as $FLIGHTPART_TOKEN,
or signed in as an admin user with $FLIGHTPART_USER and $FLIGHTPART_PASSWORD)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from .group import CATALOG_OPTION, JSON_OPTION, client_for, emit, main, print_table

ROLES = click.Choice(["reader", "writer", "admin"])
ACCESS = click.Choice(["read", "write"])
PASSWORD_ENV = "FLIGHTPART_NEW_PASSWORD"


def _new_password(password_file: str | None) -> str:
    """The password to set: from ``--password-file`` (its first line), ``$FLIGHTPART_NEW_PASSWORD``, standard input
    when it is not a terminal, else asked twice."""
    if password_file is not None:
        lines = Path(password_file).read_text().splitlines()
        return lines[0] if lines else ""
    if os.environ.get(PASSWORD_ENV):
        return os.environ[PASSWORD_ENV]
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\n")
    return click.prompt("new password", hide_input=True, confirmation_prompt=True)


def _said(as_json: bool, changed: object) -> None:
    emit(as_json, changed.to_json(), changed.said)  # type: ignore[attr-defined]


PASSWORD_OPTION = click.option("--password-file", type=click.Path(exists=True, dir_okay=False), default=None,
                               help=f"Read the password from this file (else ${PASSWORD_ENV}, standard input, or a "
                                    "prompt).")


@main.group()
def user() -> None:
    """A catalog's users: they sign in with a name and a password (ADBC's username/password, fp.connect(user=...,
    password=...)); their grants say which datasets they see."""


@user.command("add")
@click.argument("name")
@click.option("--role", type=ROLES, default="reader", show_default=True,
              help="What the user may do at most; their grants narrow it to datasets.")
@PASSWORD_OPTION
@CATALOG_OPTION
@JSON_OPTION
def user_add(name: str, role: str, password_file: str | None, catalog: str, as_json: bool) -> None:
    """Add a user (a password of 8 to 1024 characters, kept only as a slow hash)."""
    with client_for(catalog) as client:
        _said(as_json, client.users.add(name, _new_password(password_file), role))


@user.command("passwd")
@click.argument("name")
@PASSWORD_OPTION
@CATALOG_OPTION
@JSON_OPTION
def user_passwd(name: str, password_file: str | None, catalog: str, as_json: bool) -> None:
    """Set a user's password (an admin's, or the user's own: signed in as them with $FLIGHTPART_USER and
    $FLIGHTPART_PASSWORD, which is then the current one); their sessions end."""
    own = os.environ.get("FLIGHTPART_USER") == name
    with client_for(catalog) as client:
        _said(as_json, client.users.change(name, password=_new_password(password_file),
                                           current=os.environ.get("FLIGHTPART_PASSWORD") if own else None))


@user.command("role")
@click.argument("name")
@click.argument("role", type=ROLES)
@CATALOG_OPTION
@JSON_OPTION
def user_role(name: str, role: str, catalog: str, as_json: bool) -> None:
    """Change a user's role; their sessions end."""
    with client_for(catalog) as client:
        _said(as_json, client.users.change(name, role=role))


@user.command("remove")
@click.argument("name")
@CATALOG_OPTION
@JSON_OPTION
def user_remove(name: str, catalog: str, as_json: bool) -> None:
    """Remove a user: their sessions and every handle they opened stop working, on every node."""
    with client_for(catalog) as client:
        _said(as_json, client.users.remove(name))


@user.command("list")
@CATALOG_OPTION
@JSON_OPTION
def user_list(catalog: str, as_json: bool) -> None:
    """Every user, their role and groups."""
    with client_for(catalog) as client:
        users = client.users.list()
    if as_json:
        click.echo(json.dumps([u.to_json() for u in users]))
        return
    print_table(("user", "role", "groups"), [(u.name, u.role, ", ".join(u.groups)) for u in users])


@user.command("sign-out")
@click.argument("name")
@CATALOG_OPTION
@JSON_OPTION
def user_sign_out(name: str, catalog: str, as_json: bool) -> None:
    """End every session of a user and void the handles they opened (they may sign in again)."""
    with client_for(catalog) as client:
        _said(as_json, client.users.revoke_sessions(user=name))


@main.group("group")
def group_command() -> None:
    """Groups of users: a grant to a group is a grant to each member."""


def _membership(verb: str, joins: bool, doc: str) -> None:
    """``flightpart group VERB GROUP USER...``: each user joins (or leaves) the group, one call each."""

    @group_command.command(verb, help=doc)
    @click.argument("group")
    @click.argument("users", nargs=-1, required=True)
    @CATALOG_OPTION
    @JSON_OPTION
    def change(group: str, users: tuple[str, ...], catalog: str, as_json: bool) -> None:
        with client_for(catalog) as client:
            for name in users:
                _said(as_json, client.users.join(group, name) if joins else client.users.leave(group, name))


_membership("add", True, "Add users to a group (made by its first member).")
_membership("remove", False, "Take users out of a group: what only the group's grants allowed them is withdrawn.")


def _grantee(word: str, grantee: str, expected: tuple[str, ...]) -> str:
    if word.upper() not in expected:
        raise click.UsageError(f"expected {' or '.join(expected)} before the user or group, got {word!r}")
    return grantee


@main.command()
@click.argument("access", type=ACCESS)
@click.argument("pattern")
@click.argument("to", metavar="TO")
@click.argument("grantee")
@CATALOG_OPTION
@JSON_OPTION
def grant(access: str, pattern: str, to: str, grantee: str, catalog: str, as_json: bool) -> None:
    """Give read or write on the datasets PATTERN matches (a name, or * and ? as in file names) TO a user or group:
    ``flightpart grant read 'sales_*' TO analysts``. Write includes read."""
    with client_for(catalog) as client:
        _said(as_json, client.users.grant(access, pattern, _grantee(to, grantee, ("TO",))))


@main.command()
@click.argument("access", type=ACCESS)
@click.argument("pattern")
@click.argument("from_", metavar="FROM")
@click.argument("grantee")
@CATALOG_OPTION
@JSON_OPTION
def revoke(access: str, pattern: str, from_: str, grantee: str, catalog: str, as_json: bool) -> None:
    """Withdraw a grant: ``flightpart revoke read 'sales_*' FROM analysts``. Handles it alone allowed stop working on
    every node within a round trip."""
    with client_for(catalog) as client:
        _said(as_json, client.users.revoke(access, pattern, _grantee(from_, grantee, ("FROM", "TO"))))


@main.command()
@CATALOG_OPTION
@JSON_OPTION
def grants(catalog: str, as_json: bool) -> None:
    """Every grant."""
    with client_for(catalog) as client:
        found = client.users.grants()
    if as_json:
        click.echo(json.dumps([g.to_json() for g in found]))
        return
    print_table(("access", "datasets", "to"), [(g.access, g.pattern, g.grantee) for g in found])


@main.command("revoke-token")
@click.argument("token_file", type=click.Path(exists=True, dir_okay=False))
@CATALOG_OPTION
@JSON_OPTION
def revoke_token(token_file: str, catalog: str, as_json: bool) -> None:
    """Void a role token `flightpart token` minted before it expires, with the handles opened with it (a user's session
    given here ends every session of that user); the token is read from TOKEN_FILE so it stays off the command
    line."""
    token = Path(token_file).read_text().strip()
    with client_for(catalog) as client:
        _said(as_json, client.users.revoke_sessions(token=token))
