"""Bearer JWTs from an identity provider: every rule of :mod:`flightpart.server.identity` attacked without a daemon,
with the key set in a file or served over HTTP on 127.0.0.1."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from flightpart.errors import Unauthenticated
from flightpart.server import identity
from flightpart.server.identity import Identity, IdentitySettings, JwtVerifier, looks_like_jwt

NOW = 1_700_000_000
ISSUER = "https://idp.example.com/"
AUDIENCE = "flightpart"


@pytest.fixture(scope="module")
def keys() -> dict[str, Any]:
    """Private keys by kid: two RSA keys (so one can forge with the other's kid), EC P-256 and P-384, and Ed25519."""
    return {"rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "rsa2": rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "ec": ec.generate_private_key(ec.SECP256R1()),
            "ec384": ec.generate_private_key(ec.SECP384R1()),
            "ed": Ed25519PrivateKey.generate()}


def jwk(private_key: Any, kid: str | None, **extra: Any) -> dict[str, Any]:
    """The public JWK of a private key, with ``kid`` and any other members (``alg``, ``use``)."""
    public = private_key.public_key()
    if isinstance(public, rsa.RSAPublicKey):
        data = RSAAlgorithm.to_jwk(public, as_dict=True)
    elif isinstance(public, ec.EllipticCurvePublicKey):
        data = ECAlgorithm.to_jwk(public, as_dict=True)
    else:
        data = OKPAlgorithm.to_jwk(public, as_dict=True)
    if kid is not None:
        data["kid"] = kid
    return {**data, **extra}


def jwks(*entries: dict[str, Any]) -> bytes:
    return json.dumps({"keys": list(entries)}).encode()


def sign(private_key: Any, alg: str = "RS256", kid: str | None = "rsa", **claims: Any) -> str:
    """A token signed with ``private_key``; claims default to a good one for ``alice`` (None: left out)."""
    payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": NOW + 600, "iat": NOW - 5, **claims}
    payload = {name: value for name, value in payload.items() if value is not None}
    return jwt.encode(payload, private_key, algorithm=alg, headers={"kid": kid} if kid is not None else None)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def handmade(header: dict[str, Any], payload: dict[str, Any], signature: bytes = b"") -> str:
    """A token built by hand (what an attacker sends), signed or not."""
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(payload).encode())}.{b64(signature)}"


@pytest.fixture
def key_file(tmp_path: Path, keys: dict[str, Any]) -> Path:
    path = tmp_path / "jwks.json"
    path.write_bytes(jwks(jwk(keys["rsa"], "rsa"), jwk(keys["ec"], "ec"), jwk(keys["ed"], "ed")))
    return path


def verifier_for(source: Path | str, **settings: Any) -> JwtVerifier:
    verifier = JwtVerifier(IdentitySettings(jwks=str(source), issuer=ISSUER, audience=AUDIENCE, **settings))
    verifier.check()
    return verifier


def refused(verifier: JwtVerifier, token: str, now: float = NOW) -> str:
    """The one-line message a caller sees when ``token`` is refused."""
    with pytest.raises(Unauthenticated) as info:
        verifier.verify(token, now)
    message = str(info.value)
    assert "\n" not in message and message.startswith("JWT refused: ")
    return message


# what is accepted


@pytest.mark.parametrize(("kid", "alg"), [("rsa", "RS256"), ("rsa", "RS512"), ("rsa", "PS256"), ("rsa", "PS384"),
                                          ("ec", "ES256"), ("ed", "EdDSA")])
def test_a_good_token_gives_its_user_groups_role_and_expiry(key_file, keys, kid, alg):
    verifier = verifier_for(key_file, role_claim="role")
    token = sign(keys[kid], alg, kid, groups=["analysts", "ops"], role="writer")
    assert verifier.verify(token, NOW) == Identity("alice", ("analysts", "ops"), "writer", NOW + 600)


def test_claim_names_are_configurable_and_a_role_is_reader_unless_a_role_claim_says_otherwise(key_file, keys):
    custom = verifier_for(key_file, user_claim="preferred_username", groups_claim="roles", role_claim="fp_role")
    token = sign(keys["rsa"], preferred_username="bob", roles="team-a", fp_role="admin", role="reader")
    assert custom.verify(token, NOW) == Identity("bob", ("team-a",), "admin", NOW + 600)
    assert custom.verify(sign(keys["rsa"], preferred_username="bob"), NOW).role == "reader"
    assert verifier_for(key_file).verify(sign(keys["rsa"], role="admin"), NOW).role == "reader"


def test_groups_that_are_not_flightpart_names_are_dropped_and_at_most_64_are_kept(key_file, keys):
    verifier = verifier_for(key_file)
    groups = ["ok", "", "has space", "../up", "x" * 65, 7, None, {"a": 1}, "ok", "fine.group-1"]
    assert verifier.verify(sign(keys["rsa"], groups=groups), NOW).groups == ("ok", "fine.group-1")
    many = [f"g{i}" for i in range(100)]
    assert verifier.verify(sign(keys["rsa"], groups=many), NOW).groups == tuple(many[:64])
    assert verifier.verify(sign(keys["rsa"], groups={"not": "a list"}), NOW).groups == ()
    assert verifier.verify(sign(keys["rsa"]), NOW).groups == ()


def test_times_are_judged_with_leeway_against_the_callers_clock_not_the_machines(key_file, keys):
    verifier = verifier_for(key_file)
    token = sign(keys["rsa"], exp=NOW - 10, iat=NOW - 100)
    assert verifier.verify(token, NOW).expiry == NOW - 10
    assert "expired" in refused(verifier, sign(keys["rsa"], exp=NOW - 10, iat=NOW - 99), NOW + 30)
    assert verifier.verify(sign(keys["rsa"], nbf=NOW + 20), NOW).user == "alice"


def test_a_single_key_serves_a_token_without_kid_and_an_aud_list_containing_the_audience(tmp_path, keys):
    path = tmp_path / "one.json"
    path.write_bytes(jwks(jwk(keys["ed"], None)))
    verifier = verifier_for(path)
    assert verifier.verify(sign(keys["ed"], "EdDSA", None, aud=["other", AUDIENCE]), NOW).user == "alice"


# what is refused


def test_a_forged_signature_is_refused(key_file, keys):
    assert "bad signature" in refused(verifier_for(key_file), sign(keys["rsa2"], kid="rsa"))


def test_a_token_whose_payload_was_changed_after_signing_is_refused(key_file, keys):
    header, _, signature = sign(keys["rsa"]).split(".")
    payload = b64(json.dumps({"iss": ISSUER, "aud": AUDIENCE, "sub": "admin", "exp": NOW + 600}).encode())
    assert "bad signature" in refused(verifier_for(key_file), f"{header}.{payload}.{signature}")


def test_an_expired_token_is_refused_even_when_verified_before(key_file, keys):
    verifier = verifier_for(key_file)
    assert "expired" in refused(verifier, sign(keys["rsa"], exp=NOW - 100))
    token = sign(keys["rsa"], exp=NOW + 60)
    assert verifier.verify(token, NOW).user == "alice"
    assert verifier.verify(token, NOW + 60).user == "alice"  # remembered, and within leeway
    assert "expired" in refused(verifier, token, NOW + 91)
    with pytest.raises(Unauthenticated, match="not yet valid"):
        verifier.verify(token, NOW - 100)  # a remembered token is judged again, issued-at included


@pytest.mark.parametrize("claim", ["nbf", "iat"])
def test_a_token_not_yet_valid_is_refused(key_file, keys, claim):
    message = refused(verifier_for(key_file), sign(keys["rsa"], **{claim: NOW + 600, "exp": NOW + 900}))
    assert "not yet valid" in message


@pytest.mark.parametrize("value", ["soon", True, [NOW + 60]])
def test_a_missing_or_malformed_expiry_is_refused(key_file, keys, value):
    verifier = verifier_for(key_file)
    assert "missing exp claim" in refused(verifier, sign(keys["rsa"], exp=None))
    assert "malformed exp claim" in refused(verifier, sign(keys["rsa"], exp=value))


def test_a_wrong_or_missing_issuer_is_refused(key_file, keys):
    verifier = verifier_for(key_file)
    message = refused(verifier, sign(keys["rsa"], iss="https://evil.example.com/"))
    assert "wrong issuer" in message and "evil.example.com" in message and ISSUER in message
    assert "missing iss claim" in refused(verifier, sign(keys["rsa"], iss=None))


@pytest.mark.parametrize("aud", ["other-service", ["a", "b"], "flightpart-dev"])
def test_a_wrong_or_missing_audience_is_refused(key_file, keys, aud):
    verifier = verifier_for(key_file)
    assert "wrong audience" in refused(verifier, sign(keys["rsa"], aud=aud))
    assert "missing aud claim" in refused(verifier, sign(keys["rsa"], aud=None))


def test_an_unsigned_token_alg_none_is_refused_for_its_algorithm(key_file):
    payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": NOW + 600}
    for token in (jwt.encode(payload, None, algorithm="none"), handmade({"alg": "none", "kid": "rsa"}, payload),
                  handmade({"alg": "None"}, payload), handmade({"kid": "rsa"}, payload, b"x")):
        assert looks_like_jwt(token)
        message = refused(verifier_for(key_file), token)
        assert "not allowed" in message and "never none or HS*" in message


@pytest.mark.parametrize(("alg", "digest"), [("HS256", hashlib.sha256), ("HS384", hashlib.sha384),
                                             ("HS512", hashlib.sha512)])
def test_an_hmac_token_keyed_with_the_public_key_is_refused(key_file, keys, alg, digest):
    """The algorithm-confusion attack: the public key (which anyone has) used as an HMAC secret."""
    pem = keys["rsa"].public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    header = b64(json.dumps({"alg": alg, "typ": "JWT", "kid": "rsa"}).encode())
    payload = b64(json.dumps({"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "exp": NOW + 600}).encode())
    signature = hmac.new(pem, f"{header}.{payload}".encode(), digest).digest()
    message = refused(verifier_for(key_file), f"{header}.{payload}.{b64(signature)}")
    assert f"algorithm '{alg}' not allowed" in message


def test_an_unknown_kid_or_a_missing_kid_among_several_keys_is_refused(key_file, keys):
    verifier = verifier_for(key_file)
    assert "unknown key id 'nope'" in refused(verifier, sign(keys["rsa"], kid="nope"))
    assert "no key id" in refused(verifier, sign(keys["rsa"], kid=None))


def test_a_key_is_used_only_for_its_own_algorithm_and_kind(tmp_path, keys):
    path = tmp_path / "jwks.json"
    path.write_bytes(jwks(jwk(keys["rsa"], "rsa", alg="RS512"), jwk(keys["rsa2"], "rsa2"), jwk(keys["ec"], "ec"),
                          jwk(keys["ed"], "ed")))
    verifier = verifier_for(path)
    assert verifier.verify(sign(keys["rsa"], "RS512"), NOW).user == "alice"
    assert "which is for 'RS512'" in refused(verifier, sign(keys["rsa"], "RS256"))
    assert "an RSA key" in refused(verifier, sign(keys["ec"], "ES256", kid="rsa2"))
    assert "an EC secp256r1 key" in refused(verifier, sign(keys["ec384"], "ES384", kid="ec"))
    assert "an Ed25519 key" in refused(verifier, sign(keys["rsa"], "PS256", kid="ed"))


def test_a_key_whose_use_is_not_sig_is_not_used(tmp_path, keys):
    path = tmp_path / "jwks.json"
    path.write_bytes(jwks(jwk(keys["rsa"], "rsa", use="enc"), jwk(keys["ec"], "ec", use="sig")))
    verifier = verifier_for(path)
    assert "unknown key id 'rsa'" in refused(verifier, sign(keys["rsa"]))
    assert verifier.verify(sign(keys["ec"], "ES256", "ec"), NOW).user == "alice"


@pytest.mark.parametrize("claims", [{"sub": None}, {"sub": None, "email": "alice"}])
def test_a_missing_user_claim_is_refused(key_file, keys, claims):
    assert "missing user claim 'sub'" in refused(verifier_for(key_file), sign(keys["rsa"], **claims))


@pytest.mark.parametrize("user", ["alice@example.com", "../etc", "-alice", "", "a" * 65, "al ice", "élise", 42,
                                  ["alice"]])
def test_a_user_claim_that_is_not_a_flightpart_name_is_refused(key_file, keys, user):
    message = refused(verifier_for(key_file), sign(keys["rsa"], sub=user))
    assert "user claim 'sub' is not a valid flightpart name" in message


@pytest.mark.parametrize("role", ["node", "superuser", "Admin", 1, ["admin"]])
def test_a_role_claim_outside_reader_writer_admin_is_refused(key_file, keys, role):
    message = refused(verifier_for(key_file, role_claim="role"), sign(keys["rsa"], role=role))
    assert "role claim 'role'" in message and "not one of reader, writer, admin" in message


@pytest.mark.parametrize("token", ["", "abc", "a.b.c", "eyJ.eyJ.", "a" * 20000, "x.y.z.w", "\udc80.é.ü",
                                   handmade({"alg": ["RS256"]}, {}), handmade({"alg": "RS256", "kid": 5}, {}),
                                   b64(b"[1]") + "." + b64(b"{}") + ".", b64(b'{"alg":"RS256","kid":"rsa"}') + ".!!.x",
                                   handmade({"alg": "RS256", "kid": "rsa"}, {"sub": "alice"}, b"\0" * 256)])
def test_garbage_is_refused_as_unauthenticated_never_another_error(key_file, token):
    refused(verifier_for(key_file), token)


def test_looks_like_jwt_is_a_cheap_shape_check(keys):
    assert looks_like_jwt(sign(keys["rsa"]))
    for text in ("fp3:reader:alice:0:" + "A" * 86, "abc", "a.b", "a.b.c.d", "a b.c.d", "a.b.c\n", ".b.c"):
        assert not looks_like_jwt(text), text


# the key set


def test_a_rewritten_key_file_is_picked_up_and_tokens_of_dropped_keys_are_forgotten(key_file, keys):
    verifier = verifier_for(key_file)
    old = sign(keys["rsa"])
    assert verifier.verify(old, NOW).user == "alice"
    staged = key_file.with_suffix(".new")
    staged.write_bytes(jwks(jwk(keys["rsa2"], "rsa2")))
    os.replace(staged, key_file)  # how rotation tools write: a new file renamed over the old
    assert verifier.verify(sign(keys["rsa2"], kid="rsa2"), NOW).user == "alice"
    assert "unknown key id 'rsa'" in refused(verifier, old)  # even though it was verified before
    key_file.write_bytes(jwks(jwk(keys["rsa2"], "rsa"), jwk(keys["ec"], "ec2")))  # in place, same size or not
    stat = key_file.stat()
    os.utime(key_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
    assert verifier.verify(sign(keys["rsa2"], kid="rsa"), NOW).user == "alice"
    assert verifier.verify(sign(keys["ec"], "ES256", kid="ec2"), NOW).user == "alice"


def test_an_unreadable_key_file_refuses_tokens_saying_so(key_file, keys):
    verifier = verifier_for(key_file)
    key_file.write_text("{ not json")
    assert "key set unreadable (not JSON)" in refused(verifier, sign(keys["rsa"]))
    key_file.unlink()
    assert "key set unreadable" in refused(verifier, sign(keys["rsa"]))


@pytest.mark.parametrize(("content", "reason"), [
    (b"{ not json", "not JSON"),
    (b"\xff\xfe\x00garbage", "not JSON"),
    (b'{"keys": [' + b'{"kty": "oct", "k": "AAAA"},' * 70000 + b"{}]}", "larger than 1048576 bytes"),
    (b"[]", '"keys" list'),
    (b'{"keys": {"kty": "RSA"}}', '"keys" list'),
    (b'{"keys": []}', "no usable signing key"),
    (b'{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "hs"}]}', "no usable signing key"),
    (b'{"keys": [{"kty": "RSA", "kid": "rsa", "n": "AQAB"}]}', "no usable signing key"),
])
def test_check_names_the_file_and_what_is_wrong_with_it(tmp_path, content, reason):
    path = tmp_path / "jwks.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        JwtVerifier(IdentitySettings(jwks=str(path), issuer=ISSUER, audience=AUDIENCE)).check()
    assert str(path) in str(info.value) and reason in str(info.value)


def test_check_refuses_a_missing_file_a_set_holding_private_keys_and_empty_settings(tmp_path, keys):
    missing = tmp_path / "absent.json"
    with pytest.raises(ValueError, match="absent.json: No such file"):
        JwtVerifier(IdentitySettings(jwks=str(missing), issuer=ISSUER, audience=AUDIENCE)).check()
    private = tmp_path / "private.json"
    private.write_text(json.dumps({"keys": [RSAAlgorithm.to_jwk(keys["rsa"], as_dict=True)]}))
    with pytest.raises(ValueError, match="private key"):
        JwtVerifier(IdentitySettings(jwks=str(private), issuer=ISSUER, audience=AUDIENCE)).check()
    with pytest.raises(ValueError, match="audience is empty"):
        JwtVerifier(IdentitySettings(jwks=str(private), issuer=ISSUER, audience="")).check()


class Provider:
    """A JWKS served over HTTP on 127.0.0.1, counting the requests it answers."""

    def __init__(self, body: bytes, status: int = 200):
        self.body, self.status, self.requests = body, status, 0
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                provider.requests += 1
                self.send_response(provider.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(provider.body)))
                self.end_headers()
                self.wfile.write(provider.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def provider(keys) -> Iterator[Provider]:
    served = Provider(jwks(jwk(keys["rsa"], "rsa")))
    yield served
    served.close()


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """The monotonic clock the verifier paces its fetches by: set ``clock[0]`` to move it."""
    now = [1000.0]
    monkeypatch.setattr(identity, "_monotonic", lambda: now[0])
    return now


def test_a_url_key_set_is_fetched_once_and_again_for_a_new_kid_when_allowed(provider, clock, keys):
    verifier = verifier_for(provider.url)
    assert provider.requests == 1
    for _ in range(5):
        assert verifier.verify(sign(keys["rsa"]), NOW).user == "alice"
    assert provider.requests == 1
    provider.body = jwks(jwk(keys["rsa"], "rsa"), jwk(keys["ec"], "ec"))  # the provider publishes a new key
    clock[0] += 31
    assert verifier.verify(sign(keys["ec"], "ES256", "ec"), NOW).user == "alice"
    assert provider.requests == 2


def test_a_flood_of_made_up_kids_makes_at_most_one_fetch_per_refetch_seconds(provider, clock, keys):
    verifier = verifier_for(provider.url)
    assert provider.requests == 1
    made_up = [sign(keys["rsa2"], kid=f"made-up-{i}") for i in range(40)]
    answers: list[str] = []

    def flood() -> None:
        def attack(tokens: list[str]) -> None:
            for token in tokens:
                try:
                    verifier.verify(token, NOW)
                    answers.append("accepted")
                except Unauthenticated as error:
                    answers.append("unknown key id" if "unknown key id 'made-up-" in str(error) else str(error))

        threads = [threading.Thread(target=attack, args=(made_up[i::8] * 5,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    for advance, fetched in [(10, 1), (21, 2), (10, 2), (19, 2), (2, 3), (100, 4)]:
        clock[0] += advance
        flood()
        assert provider.requests == fetched, (advance, fetched)
    assert set(answers) == {"unknown key id"} and len(answers) == 6 * 200
    assert verifier.verify(sign(keys["rsa"]), NOW).user == "alice"


def test_a_url_key_set_drops_keys_the_provider_dropped_and_survives_the_provider_failing(provider, clock, keys):
    verifier = verifier_for(provider.url)
    token = sign(keys["rsa"])
    assert verifier.verify(token, NOW).user == "alice"
    provider.status, provider.body = 500, b"oops"
    clock[0] += identity.STALE_SECONDS + 1
    assert verifier.verify(token, NOW).user == "alice"  # a failed refresh keeps the keys known
    assert provider.requests == 2
    provider.status, provider.body = 200, jwks(jwk(keys["rsa2"], "rsa2"))
    clock[0] += 31
    assert "unknown key id 'rsa'" in refused(verifier, token)
    assert verifier.verify(sign(keys["rsa2"], kid="rsa2"), NOW).user == "alice"
    assert provider.requests == 3


def test_check_names_the_url_and_what_is_wrong_and_verify_says_the_key_set_is_unreadable(provider, clock, keys):
    provider.body = b"<html>not json</html>"
    settings = IdentitySettings(jwks=provider.url, issuer=ISSUER, audience=AUDIENCE)
    with pytest.raises(ValueError, match="not JSON") as info:
        JwtVerifier(settings).check()
    assert provider.url in str(info.value)
    provider.status = 404
    with pytest.raises(ValueError, match="HTTP 404"):
        JwtVerifier(settings).check()
    verifier = JwtVerifier(settings)
    assert "key set unreadable (HTTP 404" in refused(verifier, sign(keys["rsa"]))
    assert "key set unreadable (HTTP 404" in refused(verifier, sign(keys["rsa"]))
    assert provider.requests == 3  # the second refusal waited for refetch_seconds instead of asking again
    closed = f"http://127.0.0.1:{_free_port()}/jwks.json"
    with pytest.raises(ValueError, match="cannot be fetched"):
        JwtVerifier(IdentitySettings(jwks=closed, issuer=ISSUER, audience=AUDIENCE), fetch_timeout=2).check()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# many callers at once


def test_many_threads_verifying_at_once_see_the_same_answers(key_file, keys, monkeypatch):
    monkeypatch.setattr(identity, "CACHED_TOKENS", 8)
    verifier = verifier_for(key_file, role_claim="role")
    good = [sign(keys["rsa"], sub=f"user{i}", role="writer") for i in range(20)]
    bad = [sign(keys["rsa2"], sub=f"user{i}") for i in range(5)]
    failures: list[str] = []

    def caller(offset: int) -> None:
        for round_ in range(10):
            for i, token in enumerate(good):
                if verifier.verify(token, NOW + round_) != Identity(f"user{i}", (), "writer", NOW + 600):
                    failures.append(f"user{i}")
            for token in bad[offset % 5:]:
                try:
                    verifier.verify(token, NOW)
                    failures.append("forged token accepted")
                except Unauthenticated:
                    pass

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert verifier.cached_tokens() <= 8
