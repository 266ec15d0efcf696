"""SPMD publishing: every rank sends its own rows to the node on its own host."""

from __future__ import annotations

from typing import Any

from flightpart import frames
from flightpart.errors import NodeUnavailable
from flightpart.io.access import Access
from flightpart.io.errors import translated
from flightpart.io.hosts import host_addresses
from flightpart.io.transfer import PutCall, send_partition
from flightpart.wire import PublishPart, check_name

from .client import Client


def publish(name: str, frame: Any, *, rank: int, nranks: int, catalog: str, host: str | None = None,
            token: str | None = None, access: Access | None = None) -> dict:
    """Store rank ``rank``'s rows as partition ``(rank, 0)`` of the next version.

    The catalog publishes the version when all ``nranks`` ranks have
    committed, with starts from the prefix sums of their row counts.
    Returns ``{"version", "complete"}`` (complete on the last rank in).
    """
    check_name(name)
    if not (isinstance(rank, int) and isinstance(nranks, int) and 0 <= rank < nranks):
        raise ValueError(f"rank must be in [0, nranks), got rank={rank!r}, nranks={nranks!r}")
    table = frames.to_arrow(frame)
    access = access or Access.from_environment(token=token)
    with Client(catalog, host=host, access=access) as client:
        mine = host_addresses(host)
        nodes = [n for n in client.nodes() if n.alive and n.ip in mine]
        if not nodes:
            raise NodeUnavailable(
                f"no live node on this host ({', '.join(sorted(mine))}); start `flightpart serve --catalog "
                f"{catalog}` here"
            )
        node = nodes[0]
        version = client.publish_begin(name, rank, nranks)
        with translated():
            send_partition(client.pool, node.uri, name, version, (rank, 0), table,
                           PutCall(grant=client.grant_for(name, version)))
        rows, cols = frames.frame_shape(table)
        reply = client.publish_part(PublishPart(name, version, rank, rows, cols, node.node_id, table.schema))
        return {"version": reply.version, "complete": reply.complete, "joined": reply.joined}
