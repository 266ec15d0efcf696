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


RANGE = 8
"""Addresses a cluster holds: its nodes on the first ones, the rest free for the nodes its test adds."""

READER_HOSTS = frozenset({9, 99})
"""Last bytes of 127.0.0.x that tests give a pretend reader host (``fp.connect(..., host=...)``): no node's."""

HAND_PICKED = frozenset({*range(41, 45), *range(50, 55), *range(70, 78), *range(81, 89), *range(91, 99), 131,
                         *range(171, 176), 179, 183, 230, 231, 236, 237, 238, *range(250, 255)})
"""Last bytes a test starts a daemon (or a compose file's services) on by hand, outside any factory."""

PINNED = frozenset({2, 32, 34, 61})
"""First addresses of the ranges tests pin with ``first_ip=``: only where an assertion, a certificate or a
process outside the cluster names the addresses. ``tests/test_architecture.py`` holds every pin to this set."""

NOT_AUTOMATIC = READER_HOSTS | HAND_PICKED | {ip for first in PINNED for ip in range(first, first + RANGE)}
"""No automatically chosen range holds one of these."""


class AddressPool:
    """The session's loopback ranges: one allocator for every factory, so no two live clusters share an address.

    A range is ``RANGE`` addresses from its first; an automatic one is the first of 127.0.0.2-9, 10-17, ...
    that holds no address of a live range nor of :data:`NOT_AUTOMATIC`. A pinned one (``first_ip=``) must not
    overlap a live range: the pool refuses it rather than let two daemons fight for an address. Ranges go back
    to the pool when their factory stops, so the session never runs out.
    """

    def __init__(self):
        self.taken: set[int] = set()

    def take(self, first_ip: int | None = None) -> int:
        if first_ip is None:
            first_ip = next((start for start in range(2, 256 - RANGE, RANGE)
                             if not set(range(start, start + RANGE)) & (self.taken | NOT_AUTOMATIC)), None)
            if first_ip is None:
                raise RuntimeError("no loopback range is free: too many clusters alive at once")
        wanted = set(range(first_ip, min(first_ip + RANGE, 255)))
        if wanted & self.taken:
            raise RuntimeError(f"127.0.0.{first_ip}-{max(wanted)} overlaps a live cluster's range")
        self.taken |= wanted
        return first_ip

    def give_back(self, first_ip: int) -> None:
        self.taken -= set(range(first_ip, min(first_ip + RANGE, 255)))


class ClusterFactory:
    """Clusters for tests, each on a loopback address range of its own from the session's :class:`AddressPool`.

    ``process=False`` (the default): catalog and nodes as servers in the test process
    (:class:`~flightpart.local.InProcessCluster`), for tests that neither kill, freeze nor
    restart a daemon; ``process=True``: each a child process (:class:`~flightpart.local.LocalCluster`).
    Other options go to the cluster unchanged. ``first_ip`` pins a range (only for a test whose
    assertions name 127.0.0.2 ...); ``root`` is the cluster's directory (a new temporary one unless
    given), reachable as ``c.root``. ``c.ips`` lists the range's addresses: the nodes on the first
    ones, the rest for nodes the test adds. Every cluster stops, and gives its range back, with the
    factory's scope; a test may stop it earlier, as stopping twice is harmless.
    """

    def __init__(self, root_factory, pool: AddressPool):
        self.root_factory = root_factory
        self.pool = pool
        self.started: list = []
        self.ranges: list[int] = []

    def __call__(self, nodes: int = 3, *, process: bool = False, first_ip: int | None = None, root=None, **options):
        from flightpart.local import InProcessCluster, LocalCluster

        assert nodes <= RANGE, "a cluster's nodes fit in one address range"
        first_ip = self.pool.take(first_ip)
        self.ranges.append(first_ip)
        assert first_ip + nodes <= 255, "a cluster's nodes fit in one address range"
        kind = LocalCluster if process else InProcessCluster
        made = kind(self.root_factory() if root is None else root, nodes, first_ip=first_ip, **options)
        made.ips = [f"127.0.0.{first_ip + k}" for k in range(min(RANGE, 255 - first_ip))]
        self.started.append(made)
        return made

    def stop(self) -> None:
        try:
            for made in reversed(self.started):
                made.stop()
        finally:
            for first_ip in self.ranges:
                self.pool.give_back(first_ip)


@pytest.fixture(scope="session")
def address_pool():
    """The session's loopback ranges (see :class:`AddressPool`)."""
    return AddressPool()


@pytest.fixture(scope="module")
def make_cluster(tmp_path_factory, address_pool):
    """The module's cluster factory (see :class:`ClusterFactory`), for module-scoped fixtures."""
    factory = ClusterFactory(lambda: tmp_path_factory.mktemp("cluster"), address_pool)
    yield factory
    factory.stop()


@pytest.fixture
def new_cluster(tmp_path_factory, address_pool):
    """The test's cluster factory (see :class:`ClusterFactory`): its clusters stop when the test ends."""
    factory = ClusterFactory(lambda: tmp_path_factory.mktemp("cluster"), address_pool)
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
