"""Runtimes the client hands work to, found as plugins instead of imported.

``client.put(dask_dataframe)``, ``ds.to_dask()`` and ``ds.to_ray()`` need a
runtime module, but the client sits below the runtimes (they import it), so
it finds them by name through the ``flightpart.runtimes`` entry points that
``pyproject.toml`` declares, as pandas finds its plotting backends. A third
party adds a runtime by declaring an entry point of its own: a module with
``owns(obj)``, ``put(client, name, obj, nodes, version)`` and
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
    """The runtime whose collections ``obj`` is one of (a Dask DataFrame, a Ray Dataset), if any.

    Only the runtime named after the object's top-level module is loaded,
    so a put of a pandas frame imports neither Dask nor Ray.
    """
    top = type(obj).__module__.split(".", 1)[0]
    if top not in {ep.name for ep in entry_points(group=GROUP)}:
        return None
    module = runtime(top)
    return module if module.owns(obj) else None
