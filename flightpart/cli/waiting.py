"""``flightpart wait``: block until a daemon answers, for scripts that start daemons in the background.

A shell script that runs ``flightpart serve ... &`` cannot know when the
node is listening and has joined its catalog; sleeping a guessed number of
seconds is either slow or flaky. This asks the daemon itself: a node or a
catalog answers ``stats`` once it serves calls, and a catalog's ``stats``
counts the nodes alive, so a script can also wait for its cluster to be
whole before its first put.
"""

from __future__ import annotations

import time

from flightpart.errors import FlightpartError, Forbidden, NodeUnavailable, Unauthenticated
from flightpart.io.access import Access
from flightpart.io.connections import ConnectionPool
from flightpart.io.errors import translated
from flightpart.io.leader import CatalogAddresses, split_addresses
from flightpart.wire import GetStats

POLL_SECONDS = 0.2


def wait_for(uri: str, *, timeout: float = 60.0, min_nodes: int = 0, access: Access | None = None) -> dict:
    """``{"uri", "role", "nodes_alive", "waited"}`` once the daemon at ``uri`` answers (and has ``min_nodes`` nodes).

    Raises :class:`NodeUnavailable` after ``timeout`` seconds, saying what
    was last seen; a refused credential is raised at once (waiting will not
    mend it).
    """
    start = time.monotonic()
    last = "no answer yet"
    catalogs = CatalogAddresses(split_addresses(uri), wait=0)  # several catalogs: the leader's answer counts
    with ConnectionPool(access or Access.from_environment()) as pool:
        while True:
            try:
                with translated():
                    stats = catalogs.call(lambda one: pool.action(one, GetStats(), timeout=max(1.0, min(5.0, timeout)))
                                          ).to_json()
                role = "catalog" if "nodes_alive" in stats else "node"
                alive = int(stats.get("nodes_alive", 0))
                if role == "node" or alive >= min_nodes:
                    return {"uri": uri, "role": role, "nodes_alive": alive,
                            "waited": round(time.monotonic() - start, 3)}
                last = f"{alive} of {min_nodes} nodes alive"
            except (Unauthenticated, Forbidden):
                raise
            except NodeUnavailable as exc:
                last = exc.message
                pool.discard(catalogs.current)
            except FlightpartError as exc:  # answered, but not as a flightpart daemon would
                raise NodeUnavailable(f"{uri} answered, but not as a flightpart daemon: {exc.message}") from None
            if time.monotonic() - start >= timeout:
                raise NodeUnavailable(f"{uri} not ready after {timeout:g} s: {last}")
            time.sleep(POLL_SECONDS)
