"""flightpart on a Ray cluster: one node actor per Ray node, one catalog actor.

Detached, named actors in the ``flightpart`` namespace, each node actor pinned to its Ray node and restarted
by Ray if it dies (it then re-registers what its data directory holds). ``start`` reuses existing actors, so
calling it again after Ray nodes joined starts only theirs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

NAMESPACE = "flightpart"
CATALOG_ACTOR = "flightpart-catalog"
NODE_PREFIX = "flightpart-node-"


class _ServerActor:
    """What every flightpart actor answers: its URI, its PID, and stop."""

    server: Any

    def uri(self) -> str:
        return self.server.uri

    def pid(self) -> int:
        return os.getpid()

    def stop(self) -> None:
        self.server.shutdown()


class CatalogActor(_ServerActor):
    def __init__(self, host: str | None, port: int, state_dir: str | None):
        import ray

        from flightpart.server.catalog import CatalogServer
        from flightpart.server.settings import CatalogSettings

        # the head is only preferred: where Ray placed the actor (or restarted it), its own node's address binds
        host = host or ray.util.get_node_ip_address()

        if state_dir is not None:
            Path(state_dir).mkdir(parents=True, exist_ok=True)
        self.server = CatalogServer(CatalogSettings.in_process(host, port=port, state_dir=state_dir))


class NodeActor(_ServerActor):
    def __init__(self, host: str, port: int, data_dir: str, catalog: str):
        from flightpart.server.node import NodeServer
        from flightpart.server.settings import NodeSettings

        self.server = NodeServer(NodeSettings.in_process(host, port=port, data_dir=data_dir, catalog=catalog))
        self.server.register()


def _data_dir(base: str | None, node_id: str) -> str:
    import platformdirs

    root = Path(base) if base else Path(platformdirs.user_data_dir("flightpart")) / "ray"
    return str(root / node_id[:16])


def _get_or_create(ray: Any, cls: type, name: str, options: dict, *args: Any) -> Any:
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        remote = ray.remote(cls)
        return remote.options(name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                              num_cpus=0, **options).remote(*args)


def start(num_nodes: int | None = None, data_dir: str | None = None, port: int = 0, *, host: str | None = None,
          max_restarts: int = 3) -> Any:
    """Start (or join) flightpart on every alive Ray node (or the first ``num_nodes``); returns a connected
    ``Client``. ``host``: the address the daemons bind and advertise, instead of each Ray node's IP."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from flightpart.client import Client

    alive = [n for n in ray.nodes() if n["Alive"]]
    if num_nodes is not None:
        alive = alive[:num_nodes]
    head = ray.get_runtime_context().get_node_id()
    catalog = _get_or_create(ray, CatalogActor, CATALOG_ACTOR,
                             {"scheduling_strategy": NodeAffinitySchedulingStrategy(head, soft=True),
                              "max_restarts": max_restarts},
                             host, 0, None)
    catalog_uri = ray.get(catalog.uri.remote())
    nodes = []
    for n in alive:
        options = {"scheduling_strategy": NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                   "max_restarts": max_restarts, "max_task_retries": 3}
        nodes.append(_get_or_create(ray, NodeActor, NODE_PREFIX + n["NodeID"], options,
                                    host or n["NodeManagerAddress"], port, _data_dir(data_dir, n["NodeID"]),
                                    catalog_uri))
    ray.get([a.uri.remote() for a in nodes])  # every node is up and registered
    return Client(catalog_uri)


def stop() -> None:
    """Stop every flightpart actor (nodes first, then the catalog)."""
    import ray

    for name in sorted(_names(ray), key=lambda n: n == CATALOG_ACTOR):
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            continue  # it died between the listing and the lookup
        try:
            ray.get(actor.stop.remote(), timeout=30)
        except Exception:
            pass  # already gone: killing it is all that is left
        ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + STOP_SECONDS  # Ray lets go of a killed actor's name a moment after the kill
    while _names(ray) and time.monotonic() < deadline:
        time.sleep(0.1)


STOP_SECONDS = 30.0
"""How long :func:`stop` waits for Ray to forget the names of the actors it killed."""


def _names(ray: Any) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a.get("namespace") == NAMESPACE]


def actors() -> dict[str, int]:
    """Names and PIDs of the running flightpart actors."""
    import ray
    from ray.exceptions import RayActorError

    out = {}
    for name in _names(ray):
        try:
            out[name] = ray.get(ray.get_actor(name, namespace=NAMESPACE).pid.remote())
        except (ValueError, RayActorError):
            continue  # it died between the listing and the lookup
    return out
