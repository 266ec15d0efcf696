"""The colours that tell nodes apart, the same in ``flightpart show`` (terminal) and the catalog's status page (HTML).

A node's colour is its index in the catalog's node list, so a partition has
the same colour in both views.
"""

from __future__ import annotations

NODE_COLOURS: tuple[tuple[str, str], ...] = (
    ("cyan", "#1fa2b8"),
    ("magenta", "#b8369f"),
    ("green", "#3a9a3a"),
    ("yellow", "#c9a227"),
    ("blue", "#3d63c9"),
    ("red", "#c93d3d"),
    ("bright_cyan", "#5fd7e8"),
    ("bright_magenta", "#e06fd0"),
)
"""(terminal colour name, HTML colour) per node index, repeating past the last."""


def node_colour(index: int, html: bool = False) -> str:
    name, hex_colour = NODE_COLOURS[index % len(NODE_COLOURS)]
    return hex_colour if html else name
