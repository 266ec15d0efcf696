"""Runtimes the client hands work to, found as plugins instead of imported.

The client sits below the runtimes, so it finds them by name through the ``flightpart.runtimes`` entry points.
A runtime is a module with ``owns(obj)``, ``put(client, name, obj, nodes, version)`` and
``from_partitioned(obj, schema=...)``.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

GROUP = "flightpart.runtimes"


@cache
def runtime(name: str) -> ModuleType:
    """The runtime module registered as ``name`` (e.g. ``dask``, ``ray``)."""
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        known = sorted(ep.name for ep in entry_points(group=GROUP))
        raise LookupError(f"no flightpart runtime named {name!r} is installed (installed: {known}); "
                          "install flightpart with its extras, e.g. pip install 'flightpart[dask,ray]'")
    return found[0].load()


def runtime_of(obj: Any) -> ModuleType | None:
    """The runtime whose collections ``obj`` is one of, if any; only the one named after ``obj``'s top-level module is
    loaded."""
    top = type(obj).__module__.split(".", 1)[0]
    if top not in {ep.name for ep in entry_points(group=GROUP)}:
        return None
    module = runtime(top)
    return module if module.owns(obj) else None
