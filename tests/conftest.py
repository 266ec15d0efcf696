"""Shared fixtures: real Ray, real Dask, real servers; never mocks of them."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray per test module, as the project's standards ask."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def dask_client():
    """A real Dask LocalCluster with two worker processes."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            yield client


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A catalog and three node processes on 127.0.0.2-4, each playing a host."""
    from flightpart.local.cluster import LocalCluster

    with LocalCluster(tmp_path_factory.mktemp("cluster"), nodes=3) as c:
        yield c


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MB tmpfs, mounted for the test (root only) and always unmounted."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"this machine cannot mount a tmpfs: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
