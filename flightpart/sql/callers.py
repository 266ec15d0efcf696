"""Who the query being answered is for: what they may read and what listings show them, set per call by the SQL
server (:data:`CALLER`) and asked by the gateway wherever a dataset is named or listed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, Protocol

from flightpart.errors import Forbidden
from flightpart.tokens import Credential

from .names import VERSIONED, dataset_named


class CallerReads(Protocol):
    """What the call being answered may read (set per call in :data:`CALLER` by the SQL server)."""

    def check(self, datasets: list[str]) -> None:
        """Raise :class:`~flightpart.errors.Forbidden` unless the caller may read every one of ``datasets``."""
        ...

    def shows(self, dataset: str) -> bool:
        """Whether listings (``SHOW TABLES``, ``information_schema``, GetTables) show ``dataset`` to the caller."""
        ...


CALLER: ContextVar[CallerReads | None] = ContextVar("flightpart_sql_caller", default=None)
"""The caller of the query this thread answers; None (the catalog's own use): every dataset."""


def check_caller(named: list[str], names: Callable[[], set[str]]) -> None:
    """:class:`~flightpart.errors.Forbidden` unless this call's caller may read every dataset of ``named`` (table
    names as a query writes them: any case, ``name@version``; ``names()``: every dataset's name)."""
    caller = CALLER.get()
    if caller is None or not named:
        return
    known = names()
    datasets = []
    for table in named:
        match = VERSIONED.match(table)
        base = match["name"] if match else table
        datasets.append(dataset_named(base, known) or base)
    caller.check(sorted(set(datasets)))


class UserReads:
    """A user's reads (:class:`CallerReads`): their grants, each decision checked by ``require`` (which writes it to
    the audit trail); ``visible``: what listings show them."""

    def __init__(self, credential: Credential, client: str, require: Any, visible: Callable[[str], bool]):
        self.credential, self.client, self.require, self._shows = credential, client, require, visible

    def check(self, datasets: list[str]) -> None:
        for dataset in datasets:
            self.require(self.credential, "read", dataset, "query", client=self.client)

    def shows(self, dataset: str) -> bool:
        return bool(self._shows(dataset))


@contextlib.contextmanager
def reading_as(credential: Credential, client: str, require: Any, visible: Any) -> Iterator[None]:
    """``credential`` as :data:`CALLER` while a call is answered: a user reads and lists only what their grants allow
    (``require``, ``visible(credential)``); anyone else every dataset (nothing is set)."""
    if not credential.user:
        yield
        return
    token = CALLER.set(UserReads(credential, client, require, visible(credential)))
    try:
        yield
    finally:
        CALLER.reset(token)


def ingest_check(credential: Credential, client: str, require: Any,
                 may_write: Callable[[Credential, str], bool]) -> Callable[[str], None]:
    """What an ``adbc_ingest`` asks before it reads its stream and before each batch (:func:`.puts.ingest`): the first
    time ``require`` (the decision, written to the audit trail), then ``may_write(credential, name)`` again, so a
    write grant withdrawn while the stream runs stops it before anything is published."""
    asked: list[str] = []

    def check(name: str) -> None:
        if not asked:
            require(credential, "write", name, "ingest", client=client)
            asked.append(name)
        elif not may_write(credential, name):
            raise Forbidden(f"user {credential.name}'s write grant on {name} was withdrawn while the ingest ran: "
                            "nothing of it was published", field="table")

    return check
