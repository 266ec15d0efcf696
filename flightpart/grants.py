"""Who may read or write which datasets: grants to users and groups, and what a withdrawal voids.

A grant gives ``read`` or ``write`` on the datasets a pattern matches (a dataset's name, ``*`` for any run of
characters and ``?`` for one, as a shell matches file names) to a user or a group: users and groups share one
namespace. ``write`` (put, append, ingest, drop) includes ``read``. A user may do to a dataset what some grant to
them or to one of their groups allows; an operator's role token and the cluster secret are no user and are not
narrowed.

A withdrawal (a user removed, a grant revoked, a user's sessions or a token revoked) is a :class:`Revocation`:
credentials and read capabilities issued to its holder before it, for datasets its pattern matches, are void. The
catalog hands the list to every node, so handles pickled into tasks stop working there as well; an entry is
kept until everything it voids has expired anyway.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

ACCESS = ("read", "write")
ANY = "*"
PATTERN = re.compile(r"[A-Za-z0-9_.*?-][A-Za-z0-9_.*?@-]{0,127}")
"""A dataset pattern: a dataset's name characters, with ``*`` and ``?``."""
PRINCIPAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A user's or a group's name."""
TOKEN_HOLDER_PREFIX = "#"
"""A role token's holder name in a capability and a revocation: ``#`` and the first characters of its signature
(users' names cannot begin so)."""
IDP_HOLDER_PREFIX = "!"
"""An identity provider's user's holder name: ``!`` and their name, never the same holder as a local user's."""
ANY_IDP_HOLDER = "!*"
"""A revocation's holder meaning every identity provider's user: the catalog does not know who a provider puts in a
group, so a grant withdrawn from a group voids the capabilities of all of them for the datasets it covered."""


def check_pattern(pattern: str) -> str:
    """``pattern`` when it is a valid dataset pattern, else ValueError saying what is allowed."""
    if not isinstance(pattern, str) or not PATTERN.fullmatch(pattern):
        raise ValueError(f"dataset pattern {pattern!r:.80}: use a dataset's name characters (letters, digits, '_', "
                         "'.', '-') with '*' for any run of characters and '?' for one, at most 128 in all")
    return pattern


def check_principal(name: str, what: str = "user") -> str:
    """``name`` when it is a valid user or group name, else ValueError."""
    if not isinstance(name, str) or not PRINCIPAL.fullmatch(name):
        raise ValueError(f"{what} name {name!r:.80}: use 1 to 64 letters, digits, '_', '.' and '-', starting with a "
                         "letter or digit")
    return name


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    """``*`` and ``?`` as wildcards, every other character itself (no character classes)."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), re.DOTALL)


def matches(pattern: str, dataset: str) -> bool:
    """Whether ``pattern`` covers ``dataset`` (case matters, as in dataset names)."""
    return pattern == ANY or pattern == dataset or _compiled(pattern).fullmatch(dataset) is not None


@dataclass(frozen=True)
class Grant:
    """``access`` (read or write) on the datasets ``pattern`` matches, to the user or group ``grantee``."""

    access: str
    pattern: str
    grantee: str

    def covers(self, access: str, dataset: str) -> bool:
        """Whether this grant allows ``access`` on ``dataset`` (``write`` allows ``read`` too)."""
        return (self.access == access or self.access == "write") and matches(self.pattern, dataset)


def allowed(grants: Iterable[Grant], principals: frozenset[str], access: str, dataset: str) -> bool:
    """Whether some grant to one of ``principals`` (a user and their groups) allows ``access`` on ``dataset``."""
    return any(g.grantee in principals and g.covers(access, dataset) for g in grants)


@dataclass(frozen=True)
class Revocation:
    """Credentials and capabilities issued to ``holder`` before ``at`` (Unix seconds, the catalog's clock) for
    datasets ``pattern`` matches (``*``: every one, and the holder's sessions too) are void until ``until``, when
    they have all expired anyway."""

    holder: str
    pattern: str
    at: float
    until: float

    def voids(self, holder: str, dataset: str | None, issued: float) -> bool:
        """Whether this entry voids a credential of ``holder`` issued at ``issued`` for ``dataset`` (None: a session,
        which only a ``*`` entry voids)."""
        if issued >= self.at or (holder != self.holder and not (
                self.holder == ANY_IDP_HOLDER and holder.startswith(IDP_HOLDER_PREFIX))):
            return False
        return self.pattern == ANY if dataset is None else matches(self.pattern, dataset)


def voided(entries: Iterable[Revocation], holder: str, dataset: str | None, issued: float) -> bool:
    """Whether any of ``entries`` voids that credential (:meth:`Revocation.voids`)."""
    return any(e.voids(holder, dataset, issued) for e in entries)
