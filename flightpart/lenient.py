"""The ``__partitioned__`` forms producers really emit, read as the spec's.

:func:`flightpart.validate` is exact to the spec. Producers written before
or beside it differ in small ways; :func:`as_spec` rewrites each known
difference into the spec's form and says which it applied, so a consumer
can read them (``fp.from_partitioned`` does) without the validator
pretending they conform. Every form here is listed in :data:`FORMS` with
who emits it.
"""

from __future__ import annotations

from typing import Any

from . import protocol
from .errors import PartitionedError

FORMS = {
    "location-ip": "location as a bare IP string ('10.0.0.1'), not a list of (IP, PID): xgboost_ray's examples, "
                   "Modin's producer (PR 3452); read as [(IP, 0)], PID unknown",
    "location-rank": "location as an MPI rank (0, or [0]): heat; a rank names no host, read as this host, PID unknown",
    "location-tuple": "location as one (IP, PID) tuple instead of a list of them; read as a list of one",
    "extra-partition-keys": "partition keys the spec does not define (dtype, device, ...): heat; ignored",
    "extra-keys": "top-level keys the spec does not define (dtype, ...): ignored",
    "no-shape": "no top-level shape: Modin's producer (PR 3452); derived from the partitions' starts and shapes",
    "lists": "start, shape or partition_tiling as lists instead of tuples; read as tuples",
    "get-single": "a get that takes or returns one object instead of a list (get = lambda x: ray.get(x)[0]): "
                  "Modin, heat; asked once per handle when a list call does not answer one object per handle",
}
"""Each relaxation :func:`as_spec` applies, with who emits it and how it is read."""


class TolerantGet:
    """A spec ``get`` (a list in, a list of as many out) over a producer's ``get`` that may handle one object only.

    The list call is tried first; when it does not answer with one object
    per handle, each handle is asked for alone, as ``[h]`` (``lambda x:
    ray.get(x)[0]``) and then as ``h``.
    """

    def __init__(self, get: Any):
        self.get = get

    def __call__(self, handles: Any) -> list:
        handles = list(handles) if isinstance(handles, (list, tuple)) else [handles]
        try:
            result = self.get(handles)
        except Exception:  # a get of one object given a list: ask per handle
            return [self._one(h) for h in handles]
        if isinstance(result, (list, tuple)) and len(result) == len(handles):
            return list(result)
        if len(handles) == 1 and not isinstance(result, (list, tuple)):
            return [result]
        return [self._one(h) for h in handles]

    def _one(self, handle: Any) -> Any:
        try:
            result = self.get([handle])
        except Exception:
            return self.get(handle)
        if isinstance(result, (list, tuple)):
            return result[0] if len(result) == 1 else self.get(handle)
        return result


def _location(value: Any, host: str) -> tuple[list, str | None]:
    if isinstance(value, str):
        return [(value, 0)], "location-ip"
    if protocol.is_int(value):
        return [(host, 0)], "location-rank"
    if isinstance(value, tuple) and len(value) in (2, 3) and isinstance(value[0], str):
        return [value], "location-tuple"
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return [(v, 0) for v in value], "location-ip"
    if isinstance(value, list) and value and all(protocol.is_int(v) for v in value):
        return [(host, 0)], "location-rank"
    return value, None


def as_spec(obj: Any) -> tuple[dict, list[str]]:
    """``obj``'s ``__partitioned__`` in the spec's form, and the :data:`FORMS` keys it needed (empty if it conformed).

    Raises :class:`PartitionedError` when even these forms do not make it
    one (the spec's validator then names the field).
    """
    d = protocol.get_partitioned(obj)
    if not isinstance(d, dict):
        raise PartitionedError(f"__partitioned__: expected a dict, got {type(d).__name__}")
    used: set[str] = set()
    parts = d.get("partitions")
    if not isinstance(parts, dict):
        raise PartitionedError("partitions: expected a dict keyed by grid position")
    host = protocol.this_process()[0]
    spec_parts = {}
    for pos, entry in parts.items():
        if not isinstance(entry, dict):
            spec_parts[pos] = entry
            continue
        extra = set(entry) - set(protocol.PARTITION_KEYS)
        if extra:
            used.add("extra-partition-keys")
        entry = {k: v for k, v in entry.items() if k in protocol.PARTITION_KEYS}
        for key in ("start", "shape"):
            if isinstance(entry.get(key), list):
                entry[key] = tuple(entry[key])
                used.add("lists")
        if "location" in entry:
            entry["location"], form = _location(entry["location"], host)
            if form:
                used.add(form)
        spec_parts[pos] = entry
    out = {k: v for k, v in d.items() if k in (*protocol.REQUIRED_KEYS, *protocol.OPTIONAL_KEYS)}
    if set(d) - set(out):
        used.add("extra-keys")
    out["partitions"] = spec_parts
    if isinstance(out.get("partition_tiling"), list):
        out["partition_tiling"] = tuple(out["partition_tiling"])
        used.add("lists")
    if "shape" not in out:
        out["shape"] = _derived_shape(spec_parts)
        used.add("no-shape")
    elif isinstance(out["shape"], list):
        out["shape"] = tuple(out["shape"])
        used.add("lists")
    if callable(out.get("get")) and not type(out["get"]).__module__.startswith("flightpart"):
        out["get"] = TolerantGet(out["get"])
    return out, sorted(used)


def _derived_shape(parts: dict) -> tuple[int, ...]:
    ends = [tuple(s + n for s, n in zip(e["start"], e["shape"])) for e in parts.values()
            if isinstance(e, dict) and isinstance(e.get("start"), tuple) and isinstance(e.get("shape"), tuple)]
    if not ends or len({len(x) for x in ends}) != 1:
        raise PartitionedError("shape: missing, and the partitions' starts and shapes do not give one")
    return tuple(max(x[k] for x in ends) for k in range(len(ends[0])))


def validate_lenient(obj: Any, *, require_pickle: bool = False) -> dict:
    """The spec's validation of :func:`as_spec`'s result (the forms in :data:`FORMS` accepted)."""
    d, _used = as_spec(obj)
    return protocol.validate(d, require_pickle=require_pickle)


def from_partitioned(obj: Any, *, columns: Any = None) -> Any:
    """Any producer's data as one ``pyarrow.Table``, in the spec's form or one of :data:`FORMS`."""
    d, _used = as_spec(obj)
    return protocol.from_partitioned(d, columns=columns)
