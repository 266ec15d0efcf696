"""The catalog's FlightInfo cache: one build per key however many ask at once, a new build when the nodes
change, and a bound on the partitions the kept infos describe. No cluster needed."""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.server.info_cache import FlightInfoCache


def info(name: str) -> flight.FlightInfo:
    return flight.FlightInfo(pa.schema([("a", pa.int64())]), flight.FlightDescriptor.for_path(name), [], -1, -1)


def test_opens_that_arrive_during_a_build_wait_for_it_instead_of_building_again():
    cache = FlightInfoCache()
    started, release, builds = threading.Event(), threading.Event(), []

    def build() -> tuple[flight.FlightInfo, int]:
        builds.append(1)
        started.set()
        release.wait(10)
        return info("d"), 10

    got = []
    threads = [threading.Thread(target=lambda: got.append(cache.get(("d", 1, 0), "n", build))) for _ in range(5)]
    threads[0].start()
    started.wait(10)
    for t in threads[1:]:
        t.start()
    release.set()
    for t in threads:
        t.join(10)
    assert len(builds) == 1 and len(got) == 5 and all(g is got[0] for g in got)


def test_a_change_of_the_nodes_builds_again_and_a_failed_build_is_not_kept():
    cache = FlightInfoCache()
    first = cache.get("k", ("a", True), lambda: (info("1"), 1))
    assert cache.get("k", ("a", True), lambda: (info("2"), 1)) is first
    assert cache.get("k", ("a", False), lambda: (info("3"), 1)) is not first

    def broken() -> tuple[flight.FlightInfo, int]:
        raise RuntimeError("the state database does not answer")

    try:
        cache.get("other", "n", broken)
    except RuntimeError:
        pass
    assert cache.get("other", "n", lambda: (info("4"), 1)).descriptor.path == [b"4"]


def test_kept_infos_are_bounded_by_the_partitions_they_describe_least_recently_used_first():
    cache = FlightInfoCache(max_partitions=100)
    for k in range(5):
        cache.get(k, "n", lambda k=k: (info(str(k)), 40))
    assert len(cache) == 2  # 80 partitions kept, the three oldest let go
    cache.get(3, "n", lambda: (info("again"), 40))  # used: now the most recent
    cache.get(9, "n", lambda: (info("9"), 40))
    assert cache.get(3, "n", lambda: (info("rebuilt"), 40)).descriptor.path == [b"3"]
    assert cache.get(4, "n", lambda: (info("rebuilt"), 40)).descriptor.path == [b"rebuilt"]
    cache.clear()
    assert len(cache) == 0
