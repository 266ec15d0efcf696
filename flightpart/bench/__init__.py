"""``flightpart bench``: the data-path cases against baselines run side by side (:mod:`.run`), the raw
Flight baseline server (:mod:`.baseline`), reader processes (:mod:`.driver`), the cases over shaped
links between network namespaces (:mod:`.network`) and the scale cases (:mod:`.scale`)."""

from .network import plot_network, run_network_bench
from .run import plot, render, run_bench
from .scale import plot_scale, render_scale, run_scale

__all__ = ["plot", "plot_network", "plot_scale", "render", "render_scale", "run_bench", "run_network_bench",
           "run_scale"]
