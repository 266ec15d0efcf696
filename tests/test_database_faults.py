"""The catalog survives its database: PostgreSQL killed and restarted again and again while writes run, the leader's
link to it cut, and the answer to a version's COMMIT lost. Real catalog and node processes, a real PostgreSQL 15."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time

import pytest

import flightpart as fp
from flightpart.local.postgres import LocalPostgres, missing_reason
from tests.ha import PgProxy, ha_cluster, kill_postgres, table
from tests.helpers import wait_until

pytestmark = pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason()))

GIVE_UP = 60.0
"""Seconds a check waits for the cluster to come back: twenty lease periods, far past the few a recovery takes."""


@pytest.fixture(scope="module")
def postgres():
    with LocalPostgres() as pg:
        yield pg


def _put_or_none(client: fp.Client, name: str, first: int):
    try:
        return client.put(name, table(first))
    except fp.FlightpartError:
        return None


def _roles(ha) -> dict[str, str]:
    roles = {}
    for address in ha.addresses:
        try:
            roles[address] = ha.leadership(address).role
        except fp.FlightpartError as exc:
            roles[address] = type(exc).__name__
    return roles


@pytest.mark.slow
def test_postgres_killed_and_restarted_again_and_again_during_writes_loses_nothing_acknowledged(postgres, tmp_path):
    ha = ha_cluster(postgres, tmp_path)
    acknowledged: dict[str, int] = {}
    stop = threading.Event()

    def writer() -> None:
        with fp.connect(ha.uri, timeout=10) as client:
            k = 0
            while not stop.is_set():
                if _put_or_none(client, f"w{k}", k) is not None:
                    acknowledged[f"w{k}"] = k
                k += 1

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        for restart in range(3):
            wait_until(lambda n=len(acknowledged): len(acknowledged) > n, GIVE_UP,
                       "a write acknowledged before the kill")
            kill_postgres(postgres)
            time.sleep(1.0)
            postgres.start()
            # after each restart, a put succeeds within a few lease periods
            wait_until(lambda r=restart: _put_or_none(ha.client, f"after{r}", r), GIVE_UP,
                       f"a put after PostgreSQL's restart number {restart + 1}")
            roles = wait_until(lambda: sorted(_roles(ha).values()) == ["leader", "standby"] and _roles(ha), GIVE_UP,
                               "one leader and one standby")
            assert sorted(roles.values()) == ["leader", "standby"]
        stop.set()
        thread.join(timeout=120)
        assert len(acknowledged) >= 3
        with fp.connect(ha.uri, timeout=30) as reader:
            for name, first in sorted(acknowledged.items()):
                assert reader.open(name).to_arrow().equals(table(first)), name
            for restart in range(3):
                assert reader.open(f"after{restart}").to_arrow().equals(table(restart))
    finally:
        stop.set()
        ha.stop()


@contextlib.contextmanager
def relayed_cluster(postgres: LocalPostgres, tmp_path, **options):
    """A cluster whose two catalogs reach the database each through a relay of its own; stopped, relays closed."""
    proxies = [PgProxy(postgres.port), PgProxy(postgres.port)]
    ha = None
    try:
        name = f"relayed_{time.monotonic_ns()}"
        postgres.database(name)
        ha = ha_cluster(postgres, tmp_path, urls={k: p.url(name) for k, p in enumerate(proxies)}, database=name,
                        **options)
        yield ha, proxies
    finally:
        if ha is not None:
            ha.stop()
        for proxy in proxies:
            proxy.close()


@pytest.mark.slow
def test_a_leader_cut_off_from_its_database_steps_down_and_sends_callers_to_the_new_leader(postgres, tmp_path):
    with relayed_cluster(postgres, tmp_path) as (ha, proxies):
        before = ha.client.put("t", table(0))
        old = ha.leader()
        new = next(a for a in ha.addresses if a != old)
        proxies[ha.addresses.index(old)].cut()  # its link goes silent: nothing answers, nothing is refused

        wait_until(lambda: ha.leadership(new).role == "leader", GIVE_UP, "the standby takes the lease")
        # the old leader stops claiming to lead and names the new one
        shown = wait_until(lambda: (s := ha.leadership(old)).leader == new and s, GIVE_UP,
                           "the old leader names the new")
        assert shown.role == "standby"
        with pytest.raises(fp.NotLeader) as refused:
            ha.at(old, fp.wire.ListNodes())
        assert refused.value.field == new
        # a writer whose calls went to the old leader is sent on, and its put lands
        ha.client.catalogs.follow(old)
        written = ha.client.put("t", table(1000))
        assert ha.client.uri == new and written.version == before.version + 1

        proxies[ha.addresses.index(old)].mend()
        wait_until(lambda: ha.leadership(old).role == "standby" and ha.leadership(old).leader == new, GIVE_UP,
                   "the old leader stands by once its link is back")
        with fp.connect(ha.uri) as reader:
            assert reader.open("t", before.version).to_arrow().equals(table(0))
            assert reader.open("t").to_arrow().equals(table(1000))


@pytest.mark.slow
def test_a_commit_whose_answer_the_database_lost_is_sealed_and_reads_at_once(postgres, tmp_path):
    # with a secret: a writer (unlike the owner of an open cluster) reads only what is sealed
    with relayed_cluster(postgres, tmp_path, secret=secrets.token_hex(32)) as (ha, proxies):
        ha.client.put("warm", table(0))
        proxy = proxies[ha.addresses.index(ha.leader())]
        proxy.lose_commit_answer(b"state='committed'")
        written = ha.client.put("t", table(5000), tiling=(3, 1))  # acknowledged: the writer asked what became of it
        assert proxy.answers_lost == 1
        # readable at once, by this writer and by anyone else
        assert written.to_arrow().equals(table(5000))
        with ha.connect() as reader:
            assert reader.open("t").to_arrow().equals(table(5000))
