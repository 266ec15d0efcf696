"""The catalog's status page, rendered by a real headless Chromium against a live 3-node cluster."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request

import numpy as np
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.local.cluster import Daemon

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="Debian's chromium is not installed (apt-get install chromium); "
                                       ".ci/run installs it")
WIDTH, HEIGHT = 1100, 900


def chromium(url: str, profile, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium as root on a closed network: no sandbox, no background connections, a fresh profile."""
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={profile}", "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}", *args,
                           url],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def cluster(tmp_path):
    catalog = Daemon(["catalog", "--host", "127.0.0.50", "--port", "0", "--state-dir", str(tmp_path / "state"),
                      "--dead-after", "2", "--metrics-port", "0"])
    nodes = [Daemon(["serve", "--host", f"127.0.0.{51 + k}", "--port", "0", "--data-dir", str(tmp_path / f"n{k}"),
                     "--catalog", catalog.uris["catalog"], "--heartbeat", "0.5"]) for k in range(3)]
    yield catalog, nodes
    for daemon in [*nodes, catalog]:
        daemon.stop()


@pytest.mark.slow  # a long browser test: behind the marker CI still runs
def test_the_status_page_shows_nodes_and_grids_live(cluster, tmp_path):
    catalog, nodes = cluster
    page = catalog.uris["catalog-status"]
    with fp.connect(catalog.uris["catalog"], host="127.0.0.99") as client:
        client.put("events", pa.table({"x": np.arange(300_000)}), tiling=(3, 1))
        client.put("mirrored", pa.table({"x": np.arange(200_000), "y": np.arange(200_000) * 0.5}), tiling=(2, 2),
                   replicas=2)
        client.open("events").to_arrow()  # every node serves a partition
    status = json.loads(urllib.request.urlopen(page + "status.json", timeout=10).read())
    assert ([n["health"] for n in status["nodes"]] == ["SERVING"] * 3
            and all(n["bytes_sent"] > 0 for n in status["nodes"]))

    dom = chromium(page, tmp_path / "profile", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert html.count('<tr class="node"') == 3 and html.count(">SERVING<") == 3
    assert html.count('data-name="events"') == 1 and html.count('data-name="mirrored"') == 1
    assert html.count('class="cell"') == 3 + 4  # every partition of both grids drawn
    assert 'http-equiv="refresh"' in html

    shot = tmp_path / "status.png"
    done = chromium(page, tmp_path / "profile", f"--screenshot={shot}")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    assert image.size == (WIDTH, HEIGHT)
    pixels = list(image.getdata()) if not hasattr(image, "get_flattened_data") else list(image.get_flattened_data())
    for node in status["nodes"]:  # each node's colour fills its cells: many pixels, not a stray swatch
        colour = tuple(int(node["colour"][k:k + 2], 16) for k in (1, 3, 5))
        assert sum(1 for p in pixels if p == colour) > 5_000, node

    os.kill(nodes[1].proc.pid, signal.SIGSTOP)  # a node that hangs: the page still answers, and says so
    try:
        time.sleep(1.1)  # past the one second the catalog reuses a gathering for
        listed = json.loads(urllib.request.urlopen(page + "status.json", timeout=10).read())["nodes"]
        frozen = next(n for n in listed if n["uri"] == nodes[1].uris["node"])
        assert [n["health"] for n in listed].count("SERVING") == 2
        assert frozen["health"] == "NOT_SERVING" and frozen["problems"][0].startswith("unreachable"), frozen
    finally:
        os.kill(nodes[1].proc.pid, signal.SIGCONT)

    nodes[2].stop()  # the page follows the cluster: a node gone is shown dead on the next load
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        html = chromium(page, tmp_path / "profile", "--dump-dom").stdout
        if "no heartbeat: dead" in html:  # first unreachable, then dead once its heartbeats stop counting
            break
        time.sleep(1)
    assert (html.count(">SERVING<"), html.count(">NOT_SERVING<"),
            "no heartbeat: dead" in html) == (2, 1, True), html[-3000:]
