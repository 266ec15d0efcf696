"""The ``flightpart`` command: its group, and the modules whose commands join it on import."""

from . import bench, daemons, datasets, queries, secret, users  # noqa: F401  (each registers its commands on the group)
from .group import main

__all__ = ["main"]
