"""The catalog's state as one object: node state and version state over one database (:class:`CatalogState`)."""

from __future__ import annotations

from flightpart.errors import NotLeader, StateUnavailable

from .access import AccessState
from .nodes import NodeState
from .versions import VersionState


class CatalogState(AccessState, VersionState, NodeState):
    """Thread-safe access to one SQLite database."""

    def close(self) -> None:
        try:
            self.flush_heartbeats()
        except (NotLeader, StateUnavailable):
            pass  # another catalog leads, or the database is away: the heartbeats were its to keep
        self.database.close()
