"""The cluster secret's rules without a daemon: what is refused as weak, what signs, and the clock expiry is judged
by."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pyarrow.flight as flight
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flightpart import tokens
from flightpart.errors import CannotStart
from flightpart.server.auth import CLOCK_MARGIN, CLOCK_SAMPLES, GuardFactory, wall_clock
from flightpart.server.node.server import node_name

WEAK = ["", "x", "   ", "flightpart", "FLIGHTPART", "Flightpart\n", "password", "changeme", "s3cr3t!", "abc123",
        "a" * 64, "ab" * 40, "flightpart" * 6, "abcdefghijklmnopqrstuvwxyz", "0123456789" * 4, "deadbeef" * 4,
        "cluster-secret-for-the-sharing-tests", "correct horse battery staple", "Correct-Horse-Battery-Staple-Again"]


def b64(data: bytes) -> str:
    """URL-safe base64 without padding: how a token writes its signature."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.mark.parametrize("value", WEAK)
def test_a_weak_secret_is_refused_saying_why_and_how_to_make_a_good_one(value):
    with pytest.raises(tokens.WeakSecret) as info:
        tokens.check_secret(value.encode())
    message = str(info.value)
    assert "too weak" in message and "flightpart secret" in message and "128 bits" in message


def test_a_made_secret_always_passes_and_random_ones_of_enough_bytes_do_too():
    import secrets

    made = {tokens.new_secret() for _ in range(2000)}
    assert len(made) == 2000 and all(len(s) == 43 for s in made)
    for value in made:
        tokens.check_secret(value.encode())
    for _ in range(200):
        tokens.check_secret(secrets.token_hex(32).encode())
        tokens.check_secret(secrets.token_urlsafe(24).encode())


def test_the_signing_key_is_scrypts_of_the_secret_derived_once_per_process():
    secret = tokens.new_secret().encode()
    tokens.signing_key.cache_clear()
    for k in range(50):
        token = tokens.role_token(secret, "reader", f"r{k}")
        credential = tokens.verify_token(secret, token, 0.0)
        assert credential is not None and (credential.role, credential.name) == ("reader", f"r{k}")
    assert tokens.signing_key.cache_info().misses == 1  # one derivation however many tokens
    seed = hashlib.scrypt(secret, salt=tokens.KDF_SALT, n=tokens.KDF_N, r=tokens.KDF_R, p=tokens.KDF_P,
                          maxmem=1 << 26, dklen=32)
    assert tokens.verify_key(secret).raw == tokens.VerifyKey(
        Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()).raw
    cheap = hmac.new(secret, b"flightpart ed25519 signing key", hashlib.sha256).digest()
    assert tokens.verify_key(secret).raw != Ed25519PrivateKey.from_private_bytes(cheap).public_key().public_bytes_raw()


def test_tokens_and_verify_keys_of_the_earlier_format_are_refused_with_a_hint():
    secret = tokens.new_secret().encode()
    token = tokens.role_token(secret, "admin", "ann")
    assert token.startswith("fp3:admin:ann:0:")
    old = "fp2" + token[3:]
    assert tokens.verify_token(secret, old, 0.0) is None and tokens.outdated_format(old) == "fp2"
    assert tokens.outdated_format(token) is None and tokens.outdated_format("fp2") is None
    with pytest.raises(ValueError, match="flightpart verify-key"):
        tokens.VerifyKey.parse("fpk1:" + tokens.verify_key(secret).text().partition(":")[2])
    guard = GuardFactory(secret)
    with pytest.raises(flight.FlightUnauthenticatedError, match="fp2 token, signed with an earlier release's key"):
        guard.authenticate({"authorization": [f"Bearer {old}"]})
    old_node = "fp2" + tokens.role_token(secret, "node", "n1")[3:]  # a node's own token file from before
    with pytest.raises(CannotStart,
                       match="fp2 token, signed with an earlier release's key.*flightpart token --role node"):
        node_name(tokens.verify_key(secret), old_node)
    assert node_name(tokens.verify_key(secret), tokens.role_token(secret, "node", "n1")) == "n1"


def test_a_manifest_sealed_by_an_earlier_release_is_still_trusted_with_the_secret_and_no_new_one_is_signed_so():
    secret = tokens.new_secret().encode()
    manifest = {"dataset": "sales", "version": 3, "partitions": [[0, 0]]}
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    earlier = b64(Ed25519PrivateKey.from_private_bytes(
        hmac.new(secret, b"flightpart ed25519 signing key", hashlib.sha256).digest())
        .sign(b"flightpart manifest\0" + text.encode()))
    assert tokens.manifest_signed(secret, manifest, earlier)
    assert tokens.manifest_signature(secret, manifest) != earlier
    assert tokens.manifest_signed(tokens.verify_key(secret), manifest, tokens.manifest_signature(secret, manifest))
    assert not tokens.manifest_signed(tokens.new_secret().encode(), manifest, earlier)


def test_expiry_is_judged_by_the_catalogs_clock_once_a_heartbeat_told_it():
    secret = tokens.new_secret().encode()
    now = wall_clock()
    in_date = {"authorization": [f"Bearer {tokens.capability(secret, 'sales', 1, int(now) + 600)}"]}
    lapsed = {"authorization": [f"Bearer {tokens.capability(secret, 'sales', 2, int(now - CLOCK_MARGIN) - 300)}"]}

    behind = GuardFactory(secret)  # a node's guard; its clock an hour behind the catalog's
    assert behind.authenticate(in_date)[0].scope == ("sales", 1)  # by its own clock, ten minutes to go
    behind.heard_catalog_clock(now, now + 0.002, now + 3600)
    assert behind.clock_skew == pytest.approx(-3600, abs=0.01) and behind.now() > now + 3599
    with pytest.raises(flight.FlightUnauthenticatedError, match="expired"):
        behind.authenticate(in_date)
    behind.heard_catalog_clock(now + 5, now, now + 9999)  # an answer before its question is no reading
    behind.heard_catalog_clock(now, now + 4, now + 3604)  # a beat that waited 4 s: the quicker answer's skew stays
    assert behind.clock_skew == pytest.approx(-3600, abs=0.01)
    for k in range(CLOCK_SAMPLES):  # the clock stepped: followed within as many answers as are kept
        behind.heard_catalog_clock(now + 1 + k, now + 1.001 + k, now + 1 + k + 60)
    assert behind.clock_skew == pytest.approx(-60, abs=0.01)

    ahead = GuardFactory(secret)  # its clock ten minutes ahead of the catalog's
    with pytest.raises(flight.FlightUnauthenticatedError):
        ahead.authenticate(lapsed)  # by its own clock, expired five minutes past the margin
    ahead.heard_catalog_clock(now, now + 0.002, now - 600)
    assert ahead.authenticate(lapsed)[0].scope == ("sales", 2)
