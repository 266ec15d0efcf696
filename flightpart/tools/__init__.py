"""Programs built on flightpart: a local cluster of daemons, the demo, the bench, the grid view."""
