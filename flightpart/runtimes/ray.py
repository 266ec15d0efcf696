"""Ray as producer and consumer of ``__partitioned__``."""

from __future__ import annotations

from flightpart.protocol import StatelessGet


class RayGet(StatelessGet):
    """Picklable ``get`` for ``ray.ObjectRef`` handles (the spec's lambda, as a class)."""

    def fetch(self, handles: list) -> list:
        import ray

        return ray.get(handles)
