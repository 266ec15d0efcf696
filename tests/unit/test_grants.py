"""Grants, revocations, passwords, session tokens and the access tables, without a daemon (SQLite in memory)."""

from __future__ import annotations

import time

import pytest

from flightpart import passwords, tokens
from flightpart.errors import RequestRejected, UserNotFound
from flightpart.grants import ANY, Grant, Revocation, allowed, check_pattern, matches, voided
from flightpart.server.auth import Revoked
from flightpart.server.state import CatalogState

SECRET = tokens.new_secret().encode()


@pytest.mark.parametrize(("pattern", "dataset", "expected"), [
    ("sales", "sales", True), ("sales", "sales_eu", False), ("sales_*", "sales_eu", True), ("sales_*", "sales", False),
    ("sales_??", "sales_eu", True), ("sales_??", "sales_apac", False), ("*", "anything.at-all", True),
    ("Sales", "sales", False), ("sales[eu]", "salese", False), ("a.b", "aXb", False)])
def test_a_pattern_matches_as_a_shell_matches_file_names(pattern, dataset, expected):
    assert matches(pattern, dataset) is expected


@pytest.mark.parametrize("pattern", ["", "a/b", "a b", "x" * 129, "sales[eu]", "../x"])
def test_a_pattern_is_a_datasets_name_characters_with_stars(pattern):
    with pytest.raises(ValueError, match="dataset pattern"):
        check_pattern(pattern)


def test_write_includes_read_and_a_group_grant_reaches_its_members():
    grants = [Grant("read", "sales_*", "sales"), Grant("write", "hr", "bob")]
    alice, bob = frozenset({"alice", "sales"}), frozenset({"bob"})
    assert allowed(grants, alice, "read", "sales_eu") and not allowed(grants, alice, "write", "sales_eu")
    assert not allowed(grants, alice, "read", "hr")
    assert allowed(grants, bob, "read", "hr") and allowed(grants, bob, "write", "hr")
    assert not allowed([], bob, "read", "hr")


def test_a_revocation_voids_only_what_was_issued_before_it_for_what_it_names():
    entry = Revocation("alice", "sales_*", at=100.0, until=200.0)
    assert entry.voids("alice", "sales_eu", issued=99.9)
    assert not entry.voids("alice", "sales_eu", issued=100.0)  # issued after: a grant given again reads
    assert not entry.voids("alice", "hr", issued=50.0)
    assert not entry.voids("bob", "sales_eu", issued=50.0)
    assert not entry.voids("alice", None, issued=50.0)  # a dataset's revocation ends no session
    assert Revocation("alice", ANY, 100.0, 200.0).voids("alice", None, issued=50.0)
    assert voided([entry], "alice", "sales_us", 1.0) and not voided([], "alice", "sales_us", 1.0)


def test_passwords_are_kept_as_salted_scrypt_and_checked():
    stored = passwords.hash_password("correct-password")
    assert stored.startswith("scrypt$15$8$1$") and "correct-password" not in stored
    assert stored != passwords.hash_password("correct-password")  # a fresh salt each time
    assert passwords.password_matches(stored, "correct-password")
    assert not passwords.password_matches(stored, "correct-passworD")
    assert not passwords.password_matches("bcrypt$whatever", "correct-password")
    assert not passwords.password_matches("scrypt$40$8$1$AA$AA", "x")  # a cost out of range is not computed
    assert not passwords.password_matches(passwords.unknown_user_hash(), "")


@pytest.mark.parametrize("weak", ["short", "password", "aaaaaaaaaaaa", "x" * 1025])
def test_weak_passwords_are_refused(weak):
    with pytest.raises(passwords.WeakPassword):
        passwords.check_new_password(weak)


def test_a_session_token_says_who_their_role_and_when_and_nodes_can_check_it():
    now = time.time()
    token = tokens.session_token(SECRET, "alice", "writer", now, int(now) + 60)
    credential = tokens.verify_token(tokens.verify_key(SECRET), token, now)
    assert credential is not None and (credential.role, credential.name, credential.user) == ("writer", "alice", True)
    assert credential.holder == "alice" and abs(credential.issued - now) < 0.002 and credential.groups is None
    idp = tokens.verify_token(SECRET, tokens.session_token(SECRET, "olga", "reader", now, int(now) + 60,
                                                           ("sre", "ops")), now)
    assert idp is not None and idp.groups == ("sre", "ops")
    forged = token.replace("~writer~", "~admin~")
    assert tokens.verify_token(SECRET, forged, now) is None
    for bad in (("al~ice", "reader"), ("alice", "node"), ("alice,bob", "reader")):
        with pytest.raises(ValueError):
            tokens.session_token(SECRET, bad[0], bad[1], now, 0)


def test_a_capability_names_its_holder_and_a_revocation_voids_it():
    now = time.time()
    cap = tokens.capability(SECRET, "sales", 3, int(now) + 60, "alice", now)
    credential = tokens.verify_token(SECRET, cap, now)
    assert credential is not None and credential.scope == ("sales", 3) and credential.holder == "alice"
    revoked = Revoked()
    assert not revoked.voids(credential)
    revoked.set((Revocation("alice", "sales", now + 1, now + 100),))
    assert revoked.voids(credential)
    revoked.set((Revocation("alice", "hr", now + 1, now + 100),))
    assert not revoked.voids(credential)
    role = tokens.verify_token(SECRET, tokens.role_token(SECRET, "reader", "ops"), now)
    assert role is not None and role.holder.startswith("#")
    revoked.set((Revocation(role.holder, ANY, now + 1, now + 100),))
    assert revoked.voids(role)


def test_the_access_tables_keep_users_groups_grants_and_revocations():
    state = CatalogState(":memory:")
    try:
        state.add_user("alice", passwords.hash_password("alice-password"), "reader")
        with pytest.raises(RequestRejected, match="exists already"):
            state.add_user("alice", "x", "reader")
        assert state.set_member("sales", "alice", True, [])
        assert not state.set_member("sales", "alice", True, [])  # already a member: nothing changed
        with pytest.raises(RequestRejected, match="share one set of names"):
            state.add_user("sales", "x", "reader")
        with pytest.raises(UserNotFound):
            state.set_member("sales", "nobody", True, [])
        assert state.set_grant(Grant("read", "sales_*", "sales"), True, [])
        rules = state.access_rules()
        assert rules.principals("alice") == {"alice", "sales"} and rules.grants == (Grant("read", "sales_*", "sales"),)
        before = rules.version
        entry = Revocation("alice", "sales_eu", time.time(), time.time() + 60)
        assert state.set_grant(Grant("read", "sales_*", "sales"), False, [entry])
        rules = state.access_rules()
        assert rules.version > before and rules.grants == () and rules.revocations == (entry,)
        state.remove_user("alice", Revocation("alice", ANY, time.time(), time.time() + 60))
        rules = state.access_rules()
        assert "alice" not in rules.users and "alice" not in rules.groups
        assert state.access_rules().revocations[-1].pattern == ANY
        state.add_revocations([Revocation("old", ANY, 1.0, 2.0)])  # long expired: not kept
        assert all(r.holder != "old" for r in state.access_rules().revocations)
    finally:
        state.close()


def test_every_decision_is_an_audit_line_and_a_counted_metric(caplog):
    import json
    import logging

    from flightpart.server.audit import audit
    from flightpart.server.metrics import exposition, metrics_registry
    from flightpart.server.telemetry import Telemetry

    telemetry = Telemetry()
    alice = tokens.Credential("reader", "alice", holder="alice", user=True)
    with caplog.at_level(logging.INFO, logger="flightpart.audit"):
        audit(telemetry, "open", True, alice, dataset="sales", client="10.0.0.7")
        audit(telemetry, "query", False, alice, dataset="hr", client="10.0.0.7", why="no read grant")
        audit(telemetry, "sign-in", False, None, user="bob", why="wrong user name or password")
    lines = [json.loads(record.getMessage()) for record in caplog.records]
    assert lines[0] == {"audit": "open", "outcome": "allowed", "user": "alice", "dataset": "sales", "version": None,
                        "client": "10.0.0.7"}
    assert lines[1]["outcome"] == "refused" and lines[1]["why"] == "no read grant"
    assert caplog.records[1].levelno == logging.WARNING and lines[2]["user"] == "bob"
    text = exposition(metrics_registry("catalog", dict, telemetry)).decode()
    assert 'flightpart_access_decisions_total{action="open",outcome="allowed",role="catalog"} 1.0' in text
    assert 'flightpart_access_decisions_total{action="query",outcome="refused",role="catalog"} 1.0' in text


def test_reading_the_rules_while_they_change_never_waits_on_itself():
    import threading

    state = CatalogState(":memory:")
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                state.access_rules()
            except BaseException as exc:
                errors.append(exc)

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for thread in readers:
        thread.start()
    try:
        for k in range(200):
            state.add_user(f"u{k}", "x", "reader")
            assert f"u{k}" in state.access_rules().users  # a change is read at once by the catalog that made it
    finally:
        stop.set()
        for thread in readers:
            thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in readers) and errors == []
    state.close()


def test_a_full_table_of_revocations_folds_per_holder_and_never_refuses(monkeypatch):
    from flightpart.server.state import access

    monkeypatch.setattr(access, "MAX_REVOCATIONS", 10)
    state = CatalogState(":memory:")
    now = time.time()
    state.add_revocations([Revocation("alice", f"d{k}", now, now + 60) for k in range(8)])
    assert len(state.access_rules().revocations) == 8
    state.add_revocations([Revocation("bob", f"d{k}", now + 1, now + 90) for k in range(8)])
    folded = sorted((r.holder, r.pattern, r.at) for r in state.access_rules().revocations)
    assert folded == [("alice", ANY, now), ("bob", ANY, now + 1)]
    state.close()


def test_a_provider_user_named_like_a_local_group_or_user_has_no_grant():
    from flightpart.server.state.access import AccessRules, UserRecord

    rules = AccessRules(1, {"alice": UserRecord("alice", "x", "reader", 0, 0)}, {"alice": frozenset({"sales"})},
                        (Grant("read", "*", "sales"),), (), frozenset({"sales"}))
    assert rules.principals("sales", ("ops",)) == frozenset()   # a provider's "sales" is not the group
    assert rules.principals("alice", ()) == frozenset()         # nor the user
    assert rules.principals("olga", ("alice", "ops")) == {"olga", "ops"}  # a user's name is no provider's group
    assert rules.principals("alice") == {"alice", "sales"}
