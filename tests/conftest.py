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


class ClusterFactory:
    """Clusters for tests, each on a loopback address range of its own (127.0.0.2-9, 10-17, ...).

    ``process=False`` (the default): catalog and nodes as servers in the test process
    (:class:`~flightpart.local.InProcessCluster`), for tests that neither kill, freeze nor
    restart a daemon; ``process=True``: each a child process (:class:`~flightpart.local.LocalCluster`).
    ``first_ip`` pins a range (a test whose assertions name 127.0.0.2 ...). Every cluster stops
    with the factory's scope.
    """

    RANGE = 8

    def __init__(self, root_factory):
        self.root_factory = root_factory
        self.started: list = []
        self.next_range = 0

    def __call__(self, nodes: int = 3, *, process: bool = False, first_ip: int | None = None, **options):
        from flightpart.local import InProcessCluster, LocalCluster

        if first_ip is None:
            first_ip = 2 + self.RANGE * (self.next_range % 30)
            self.next_range += 1
        assert nodes <= self.RANGE and first_ip + nodes <= 255, "a cluster's nodes fit in one address range"
        kind = LocalCluster if process else InProcessCluster
        made = kind(self.root_factory(), nodes, first_ip=first_ip, **options)
        self.started.append(made)
        return made

    def stop(self) -> None:
        for made in reversed(self.started):
            made.stop()


@pytest.fixture(scope="module")
def make_cluster(tmp_path_factory):
    """The module's cluster factory (see :class:`ClusterFactory`)."""
    factory = ClusterFactory(lambda: tmp_path_factory.mktemp("cluster"))
    yield factory
    factory.stop()


@pytest.fixture(scope="module")
def cluster(make_cluster, request):
    """A catalog and three nodes on 127.0.0.2-4, each playing a host: servers in the test process, or child
    processes where the module says ``PROCESS_CLUSTER = True`` (its tests kill, freeze or restart them)."""
    return make_cluster(3, process=getattr(request.module, "PROCESS_CLUSTER", False), first_ip=2)


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MB tmpfs, mounted for the test (root only) and always unmounted."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"this machine cannot mount a tmpfs: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
