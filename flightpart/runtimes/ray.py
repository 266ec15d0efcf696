"""Ray as producer and consumer of ``__partitioned__``, with locality kept.

- :func:`partitioned`: a Ray Dataset's Arrow blocks, ``data`` their ``ray.ObjectRef`` s, each located at
  (node IP, PID of the raylet holding that node's object store), or at this driver when Ray keeps it inline.
- :func:`from_partitioned` / ``Dataset.to_ray()``: one read task per row block, placed (softly) on the Ray
  node of its partition's host.
- :func:`put`: the task holding each block sends it to the node on its own host.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa

from flightpart import frames, protocol
from flightpart.io.transfer import SentPart
from flightpart.protocol import StatelessGet
from flightpart.runtimes.ray_cluster import start, stop
from flightpart.runtimes.tasks import (
    AUTO_DETECT,
    BlockReader,
    RowBlock,
    group_columns_of,
    node_for,
    row_blocks,
    send_from_worker,
)
from flightpart.wire import NodeRow

__all__ = ["RayGet", "from_partitioned", "object_locations", "owns", "partitioned", "put", "read_refs", "start", "stop"]


class RayGet(StatelessGet):
    """Picklable ``get`` for ``ray.ObjectRef`` handles (the spec's lambda, as a class)."""

    def fetch(self, handles: list) -> list:
        import ray

        return ray.get(handles)


def _node_ips() -> dict[str, str]:
    import ray

    return {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}


_raylet_pids: dict[str, int] = {}


def _raylet_pid(node_id: str) -> int:
    """PID of the raylet (and so the object store) of a node, asked on that node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if node_id not in _raylet_pids:
        task = ray.remote(num_cpus=0)(_parent_pid)
        _raylet_pids[node_id] = ray.get(
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote())
    return _raylet_pids[node_id]


def _parent_pid() -> int:
    """In a Ray worker: the raylet that started it, which holds the node's object store."""
    return os.getppid()


def _shape(table: Any) -> tuple[int, int]:
    """(rows, columns) of a block, as the protocol counts them."""
    return table.num_rows, frames.frame_shape(frames.to_arrow(table))[1]


class RayPartitioned:
    """Arrow blocks in Ray's object store seen through ``__partitioned__``."""

    def __init__(self, refs: list, lengths: list[int], ncols: int, locations: list[list[tuple[str, int]]]):
        self.refs = refs
        self.lengths = lengths
        self.ncols = ncols
        self.locations = locations

    @property
    def __partitioned__(self) -> dict:
        return protocol.row_blocks_dict(self.refs, self.lengths, self.ncols, self.locations, RayGet())


def partitioned(dataset: Any) -> RayPartitioned:
    """A Ray Dataset (materialized) as ``__partitioned__``, one block per partition."""
    import ray

    refs = list(dataset.to_arrow_refs())
    locations = object_locations(refs)
    node_by_ip = {ip: node for node, ip in _node_ips().items()}
    shape = ray.remote(num_cpus=0)(_shape)
    # each block measured on its own node: a task elsewhere would copy the block there first
    shapes = ray.get([shape.options(scheduling_strategy=_affinity(tuple(ip for ip, _pid in locs), node_by_ip)).remote(r)
                      for r, locs in zip(refs, locations)])
    return RayPartitioned(refs, [rows for rows, _ in shapes], shapes[0][1] if shapes else 0, locations)


def ray_ip_of(ip: str) -> str:
    """The IP Ray knows a host by: a loopback address (an embedded or single-machine cluster) is this Ray node's."""
    import ray

    return ray.util.get_node_ip_address() if ip.startswith("127.") or ip in ("::1", "localhost") else ip


def for_consumers(dataset: Any, frames: str = "pandas", *, text: str = "codes") -> Any:
    """A flightpart dataset as Ray-based consumers of ``__partitioned__`` read it (xgboost_ray's ``RayDMatrix``).

    ``get`` returns frames with their column names; ``location[0]`` is the IP Ray reports for the partition's
    host, which consumers match with their actors' IPs. Text columns (pandas) arrive as ``text`` says:
    ``"codes"``, each value's index in the column's sorted distinct values, counted on the nodes so every part
    agrees; ``"categories"``, pandas categoricals over those values; ``"raw"``, the text (decision 0017).
    """
    if text not in ("codes", "categories", "raw"):
        raise ValueError(f"text must be 'codes', 'categories' or 'raw', got {text!r}")
    categories = None
    if frames == "pandas" and text != "raw":
        columns = [f.name for f in dataset.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
        categories = {name: dataset.distinct(name) for name in columns} or None
    return dataset.as_partitioned(frames=frames, location="ip", ip_of=ray_ip_of, categories=categories,
                                  codes=text == "codes")


def object_locations(refs: list) -> list[list[tuple[str, int]]]:
    """(IP, PID) of where each object can be read without a transfer."""
    import ray

    ips = _node_ips()
    if refs:  # an object still being made has no location yet: wait for it to exist, without moving it here
        ray.wait(refs, num_returns=len(refs), fetch_local=False)
    found = ray.experimental.get_object_locations(refs)
    owner = (ray.util.get_node_ip_address(), os.getpid())
    out = []
    for ref in refs:
        nodes = [n for n in found.get(ref, {}).get("node_ids", []) if n in ips]
        out.append([(ips[n], _raylet_pid(n)) for n in nodes] or [owner])
    return out


# --------------------------------------------------------------------------- consumer


def _ray_host() -> str:
    """Ray tasks judge locality by the addresses of the machine they run on."""
    return AUTO_DETECT


def _read_block(reader: BlockReader, block: RowBlock) -> Any:
    return reader.read(block)


def _affinity(hosts: tuple[str, ...], node_by_ip: dict[str, str]):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    for host in hosts:
        if host in node_by_ip:
            return NodeAffinitySchedulingStrategy(node_by_ip[host], soft=True)
    return "DEFAULT"


def read_refs(obj: Any, *, schema: Any = None) -> list:
    """One Ray task per row block, each on the node of its partition's host."""
    import ray

    d = protocol.validate(obj, require_pickle=True)
    protocol.check_host_locations(d)
    groups = group_columns_of(schema, d["partition_tiling"][1]) if schema is not None and len(d["shape"]) == 2 else None
    # stored once and shared by every task: an argument is pickled with each call (decision 0018)
    reader = ray.put(BlockReader(d["get"], None, groups, _ray_host))
    node_by_ip = {ip: node for node, ip in _node_ips().items()}
    task = ray.remote(_read_block)
    return [task.options(scheduling_strategy=_affinity(b.hosts, node_by_ip)).remote(reader, b) for b in row_blocks(d)]


def from_partitioned(obj: Any, *, schema: Any = None) -> Any:
    """Any conforming object as a ``ray.data.Dataset`` of Arrow blocks."""
    import ray.data

    return ray.data.from_arrow_refs(read_refs(obj, schema=schema))


# --------------------------------------------------------------------------- put


def owns(obj: Any) -> bool:
    """Whether ``obj`` is a Ray Dataset (what ``client.put`` sends from the tasks holding its blocks)."""
    return type(obj).__module__.startswith("ray.data") and hasattr(obj, "to_arrow_refs")


def put(client: Any, name: str, dataset: Any, nodes: list[NodeRow], version: int) -> tuple[list[SentPart], list]:
    """Each block is sent by a task on the Ray node that holds it."""
    import ray

    p = partitioned(dataset)
    node_by_ip = {ip: node for node, ip in _node_ips().items()}
    task = ray.remote(send_from_worker)
    refs, placement = [], []
    for k, (ref, locs) in enumerate(zip(p.refs, p.locations)):
        hosts = tuple(ip for ip, _pid in locs)
        node = node_for(hosts, nodes, k)
        placement.append((locs[0][0], node))
        strategy = _affinity(hosts, node_by_ip)
        grant = client.grant_for(name, version)
        refs.append(task.options(scheduling_strategy=strategy).remote(ref, node.uri, client.access, name, version,
                                                                      (k, 0), grant))
    return ray.get(refs), placement
