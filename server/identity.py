"""Bearer JWTs from an identity provider, accepted as flightpart users.

A catalog configured with :class:`IdentitySettings` trusts the provider's public keys (a JWKS file or URL). A bearer
token that :func:`looks_like_jwt` is checked by :meth:`JwtVerifier.verify`, which gives the :class:`Identity` it
proves or raises :class:`~flightpart.errors.Unauthenticated` with a one-line reason. A token is accepted only if:

- its header ``alg`` is one of :data:`ALGORITHMS` (checked before anything else);
- it is signed by a key of the set: the one whose ``kid`` the header names (a set of one key also serves a token
  without ``kid``); a key whose JWK ``alg`` differs from the header's, or whose ``use`` is not ``sig``, is never used;
- ``exp`` is present and not past, ``nbf`` and ``iat`` (when present) not in the future, all judged against the
  caller's clock with ``leeway`` seconds of grace;
- ``iss`` equals the issuer and ``aud`` contains the audience;
- the user claim is a flightpart name (``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``) and the role claim (when configured and
  present) is reader, writer or admin; absent, the role is reader. Groups that are not flightpart names are dropped,
  and only the first :data:`MAX_GROUPS` are kept.

Why HS256/384/512 are refused: an HMAC is checked with a shared secret, and a key set holds only public keys. A
verifier that let the token's header pick the algorithm would check an ``HS256`` token with the public key as the
HMAC secret, and anyone holding that public key (everyone) could mint tokens: the classic algorithm-confusion attack.
``none`` is refused because it is no signature at all.

The key set is re-read when its file changes (mtime, size or inode), or fetched from its URL: once, again when a
token names an unknown ``kid`` or the set is older than :data:`STALE_SECONDS`, and never more than once per
``refetch_seconds``, so tokens with made-up key ids cannot make the catalog hammer the provider. A refetch that fails
keeps the keys already known. Successful verifications are remembered per token (at most :data:`CACHED_TOKENS`,
forgotten when the key set changes), but expiry is judged again on every call.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import math
import os
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from cryptography.hazmat.primitives.asymmetric.ed448 import Ed448PublicKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from flightpart.errors import Unauthenticated

log = logging.getLogger("flightpart.identity")

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
"""The only header ``alg`` values accepted: signatures a public key checks. Never ``none``, never HS*."""
ROLES = ("reader", "writer", "admin")
"""The roles a token's role claim may name (a ``node`` role is never given by an identity provider)."""
MAX_KEY_SET_BYTES = 1 << 20
MAX_TOKEN_CHARS = 16384
MAX_GROUPS = 64
CACHED_TOKENS = 4096
STALE_SECONDS = 300.0
"""A key set fetched from a URL longer ago than this is fetched again (so keys the provider dropped are dropped)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_JWT_SHAPE = re.compile(r"[A-Za-z0-9_-]+={0,2}\.[A-Za-z0-9_-]+={0,2}\.[A-Za-z0-9_-]*={0,2}")
_CURVES = {"ES256": "secp256r1", "ES384": "secp384r1", "ES512": "secp521r1"}
_READERS = {"RSA": RSAAlgorithm.from_jwk, "EC": ECAlgorithm.from_jwk, "OKP": OKPAlgorithm.from_jwk}
_DECODER = jwt.PyJWT(options={"verify_exp": False, "verify_nbf": False, "verify_iat": False, "verify_sub": False,
                              "verify_jti": False, "require": ["exp"]})
"""Checks signature, ``iss`` and ``aud``; times are judged by :func:`_check_times` against the caller's clock."""
_monotonic = time.monotonic

PublicKey = RSAPublicKey | EllipticCurvePublicKey | Ed25519PublicKey | Ed448PublicKey


LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
"""Hosts a key set may come from over plain http (a test's, or a sidecar's on the same machine)."""


@dataclass(frozen=True)
class IdentitySettings:
    """How the catalog trusts an identity provider's tokens."""

    jwks: str
    """A JWKS file path, or an http(s):// URL of one."""
    issuer: str
    """The ``iss`` every token must carry."""
    audience: str
    """One of the token's ``aud`` values must be this."""
    user_claim: str = "sub"
    """The claim naming the flightpart user."""
    groups_claim: str = "groups"
    """The claim listing the user's groups (a list of strings, or one string); absent: none."""
    role_claim: str | None = None
    """A claim naming the user's role (reader, writer or admin); None or absent: reader."""


@dataclass(frozen=True)
class Identity:
    """Who a verified token says its bearer is."""

    user: str
    groups: tuple[str, ...]
    role: str
    expiry: int
    """The token's ``exp`` (Unix seconds)."""
    issued: float = field(default=0.0, compare=False)
    """The token's ``iat`` (0 without one): a revocation voids the tokens issued before it (not part of who)."""


def looks_like_jwt(token: str) -> bool:
    """Whether ``token`` has a JWT's shape: three base64url segments separated by dots (the last may be empty, so an
    unsigned token is refused by :meth:`JwtVerifier.verify` for its algorithm). Nothing is decoded."""
    return isinstance(token, str) and _JWT_SHAPE.fullmatch(token) is not None


class KeySetError(ValueError):
    """A key set that cannot be used; ``source`` is its file or URL, ``reason`` what is wrong."""

    def __init__(self, source: str, reason: str):
        super().__init__(f"JWKS {source}: {reason}")
        self.source = source
        self.reason = reason


@dataclass(frozen=True)
class _Key:
    kid: str | None
    alg: str | None
    key: PublicKey


@dataclass(frozen=True)
class _Verified:
    identity: Identity
    nbf: float | None
    iat: float | None
    generation: int


class JwtVerifier:
    """Verifies JWTs against one provider's key set; safe to call from many threads at once."""

    def __init__(self, settings: IdentitySettings, *, fetch_timeout: float = 5.0, refetch_seconds: float = 30.0):
        self.settings = settings
        self.fetch_timeout = fetch_timeout
        self.refetch_seconds = refetch_seconds
        self._url = settings.jwks.startswith(("http://", "https://"))
        self._lock = threading.Lock()  # guards the fields below
        self._fetch_lock = threading.Lock()  # one fetch at a time
        self._keys: tuple[_Key, ...] | None = None
        self._error: KeySetError | None = None  # why there are no keys
        self._generation = 0  # counts key set changes
        self._stamp: tuple[int, int, int] | None = None  # the file's (mtime, size, inode) when read
        self._fetched_at: float | None = None  # monotonic time of the last fetch attempt
        self._loaded_at = 0.0  # monotonic time of the last successful fetch
        self._verified: dict[bytes, _Verified] = {}

    def check(self) -> None:
        """Loads the key set once; raises ValueError (a :class:`KeySetError`) naming the file or URL and what is
        wrong with it, or what is wrong with the settings."""
        for name in ("jwks", "issuer", "audience", "user_claim"):
            if not getattr(self.settings, name):
                raise ValueError(f"identity settings: {name} is empty")
        if self.settings.jwks.startswith("http://") and urlsplit(self.settings.jwks).hostname not in LOOPBACK:
            raise ValueError(f"JWKS {self.settings.jwks}: a key set from a plain http:// address can be replaced on "
                             "the way; give an https:// one (http:// only on this machine's loopback)")
        if self._url:
            with self._lock:
                self._fetched_at = _monotonic()
            with self._fetch_lock:
                error = self._fetch()
            if error is not None:
                raise error
        else:
            self._file_keys()

    def cached_tokens(self) -> int:
        """How many verified tokens are remembered (at most :data:`CACHED_TOKENS`)."""
        with self._lock:
            return len(self._verified)

    def verify(self, token: str, now: float, leeway: float = 30.0) -> Identity:
        """The identity a JWT proves, judged at Unix time ``now``; raises Unauthenticated with a one-line reason."""
        try:
            return self._verify(token, now, leeway)
        except Unauthenticated:
            raise
        except Exception as error:  # a refusal, never a traceback
            log.warning("JWT verification failed unexpectedly", exc_info=True)
            raise _refused(f"invalid token ({type(error).__name__})") from None

    def _verify(self, token: str, now: float, leeway: float) -> Identity:
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or not token.isascii():
            raise _refused(f"not a JWT (more than {MAX_TOKEN_CHARS} characters, or not ASCII)")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as error:
            raise _refused(f"malformed token ({error})") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise _refused(f"algorithm {_quote(alg)} not allowed (only {', '.join(ALGORITHMS)}; "
                           "never none or HS*)")
        kid = header.get("kid")
        digest = hashlib.sha256(token.encode()).digest()
        keys, generation = self._key_set(kid, missing=False)
        with self._lock:
            known = self._verified.get(digest)
        if known is not None and known.generation == generation:
            _check_times(known.identity.expiry, known.nbf, known.iat, now, leeway)
            return known.identity
        if kid is not None and not any(key.kid == kid for key in keys):
            keys, generation = self._key_set(kid, missing=True)
        key = _choose(keys, kid, alg)
        claims = self._decode(token, key, alg)
        exp, nbf, iat = (_time_claim(claims, name) for name in ("exp", "nbf", "iat"))
        if exp is None:
            raise _refused("missing exp claim")
        _check_times(exp, nbf, iat, now, leeway)
        identity = Identity(self._user(claims), self._groups(claims), self._role(claims), int(exp), float(iat or 0.0))
        with self._lock:
            if len(self._verified) >= CACHED_TOKENS:
                del self._verified[next(iter(self._verified))]
            self._verified[digest] = _Verified(identity, nbf, iat, generation)
        return identity

    def _decode(self, token: str, key: _Key, alg: str) -> dict[str, Any]:
        settings = self.settings
        try:
            return _DECODER.decode(token, key.key, algorithms=[alg], issuer=settings.issuer,
                                   audience=settings.audience)
        except jwt.InvalidSignatureError:
            raise _refused("bad signature") from None
        except jwt.MissingRequiredClaimError as error:
            raise _refused(f"missing {error.claim} claim") from None
        except jwt.InvalidIssuerError:
            raise _refused(f"wrong issuer {_quote(_unverified(token).get('iss'))} "
                           f"(expected {_quote(settings.issuer)})") from None
        except jwt.InvalidAudienceError:
            raise _refused(f"wrong audience {_quote(_unverified(token).get('aud'))} "
                           f"(expected {_quote(settings.audience)})") from None
        except jwt.InvalidAlgorithmError as error:
            raise _refused(f"algorithm not allowed ({error})") from None
        except jwt.PyJWTError as error:
            raise _refused(f"malformed token ({error})") from None

    def _user(self, claims: dict[str, Any]) -> str:
        name = self.settings.user_claim
        user = claims.get(name)
        if user is None:
            raise _refused(f"missing user claim {name!r}")
        if not isinstance(user, str) or not _NAME.fullmatch(user):
            raise _refused(f"user claim {name!r} is not a valid flightpart name: {_quote(user)} (1 to 64 letters, "
                           "digits, '_', '.' or '-', starting with a letter or digit)")
        return user

    def _groups(self, claims: dict[str, Any]) -> tuple[str, ...]:
        value = claims.get(self.settings.groups_claim)
        names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        valid = (name for name in names if isinstance(name, str) and _NAME.fullmatch(name))
        return tuple(dict.fromkeys(valid))[:MAX_GROUPS]

    def _role(self, claims: dict[str, Any]) -> str:
        name = self.settings.role_claim
        role = None if name is None else claims.get(name)
        if role is None:
            return "reader"
        if role not in ROLES:
            raise _refused(f"role claim {name!r} is {_quote(role)}, not one of {', '.join(ROLES)}")
        return str(role)

    def _key_set(self, kid: str | None, *, missing: bool) -> tuple[tuple[_Key, ...], int]:
        """The keys and their generation. ``missing``: the token's ``kid`` is not among the keys (a URL set is
        fetched again for it, if ``refetch_seconds`` have passed since the last fetch)."""
        try:
            return self._url_keys(kid, missing) if self._url else self._file_keys()
        except KeySetError as error:
            raise _refused(f"key set unreadable ({error.reason})") from None

    def _url_keys(self, kid: str | None, missing: bool) -> tuple[tuple[_Key, ...], int]:
        now = _monotonic()
        with self._lock:
            wanted = self._keys is None or missing or now - self._loaded_at >= STALE_SECONDS
            allowed = self._fetched_at is None or now - self._fetched_at >= self.refetch_seconds
            fetch = wanted and allowed
            if fetch:
                self._fetched_at = now
            waiting = not fetch and self._keys is None
        if fetch:
            if missing:
                log.info("JWKS %s: fetching again for unknown key id %s", self.settings.jwks, _quote(kid))
            with self._fetch_lock:
                self._fetch()
        elif waiting:  # a first fetch may be under way in another thread
            with self._fetch_lock:
                pass
        with self._lock:
            if self._keys is None:
                raise self._error or KeySetError(self.settings.jwks, "not fetched yet")
            return self._keys, self._generation

    def _fetch(self) -> KeySetError | None:
        """Fetches the key set; on failure keeps the keys known before (if any) and returns why."""
        source = self.settings.jwks
        try:
            keys = _parse_key_set(_download(source, self.fetch_timeout), source)
        except KeySetError as error:
            with self._lock:
                kept = self._keys is not None
                if not kept:
                    self._error = error
            log.warning("%s%s", error, " (keeping the keys fetched before)" if kept else "")
            return error
        with self._lock:
            self._keys, self._error = keys, None
            self._generation += 1
            self._loaded_at = _monotonic()
        log.info("JWKS %s: fetched %d keys", source, len(keys))
        return None

    def _file_keys(self) -> tuple[tuple[_Key, ...], int]:
        source = self.settings.jwks
        try:
            status = os.stat(source)
        except OSError as error:
            raise KeySetError(source, error.strerror or "cannot be read") from None
        stamp = (status.st_mtime_ns, status.st_size, status.st_ino)
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp
                self._generation += 1
                try:
                    self._keys, self._error = _parse_key_set(_read_file(source, status.st_size), source), None
                    log.info("JWKS %s: read %d keys", source, len(self._keys))
                except KeySetError as error:
                    self._keys, self._error = None, error
                    log.warning("%s", error)
            if self._keys is None:
                raise self._error or KeySetError(source, "cannot be read")
            return self._keys, self._generation


def _choose(keys: tuple[_Key, ...], kid: str | None, alg: str) -> _Key:
    """The key that checks a token with this header ``kid`` and ``alg``, or a refusal saying why there is none."""
    candidates: tuple[_Key, ...]
    if kid is None:
        if len(keys) != 1:
            raise _refused(f"token has no key id (kid) and the key set has {len(keys)} keys")
        candidates = keys
    else:
        candidates = tuple(key for key in keys if key.kid == kid)
        if not candidates:
            raise _refused(f"unknown key id {_quote(kid)}")
    for key in candidates:
        if key.alg in (None, alg) and _fits(key.key, alg):
            return key
    key = candidates[0]
    if key.alg not in (None, alg):
        raise _refused(f"algorithm {alg} does not match key {_quote(key.kid)}, which is for {_quote(key.alg)}")
    raise _refused(f"algorithm {alg} does not match key {_quote(key.kid)}, {_describe(key.key)}")


def _fits(key: PublicKey, alg: str) -> bool:
    if alg.startswith(("RS", "PS")):
        return isinstance(key, RSAPublicKey)
    if alg == "EdDSA":
        return isinstance(key, Ed25519PublicKey | Ed448PublicKey)
    return isinstance(key, EllipticCurvePublicKey) and key.curve.name == _CURVES.get(alg)


def _describe(key: PublicKey) -> str:
    if isinstance(key, RSAPublicKey):
        return "an RSA key"
    if isinstance(key, EllipticCurvePublicKey):
        return f"an EC {key.curve.name} key"
    return f"an {'Ed25519' if isinstance(key, Ed25519PublicKey) else 'Ed448'} key"


def _time_claim(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _refused(f"malformed {name} claim (not a number of seconds)")
    return float(value)


def _check_times(exp: float, nbf: float | None, iat: float | None, now: float, leeway: float) -> None:
    if exp <= now - leeway:
        raise _refused(f"expired at {int(exp)} (now {int(now)}, leeway {leeway:g}s)")
    if nbf is not None and nbf > now + leeway:
        raise _refused(f"not yet valid: nbf {int(nbf)} is in the future (now {int(now)}, leeway {leeway:g}s)")
    if iat is not None and iat > now + leeway:
        raise _refused(f"not yet valid: issued at {int(iat)}, in the future (now {int(now)}, leeway {leeway:g}s)")


def _parse_key_set(data: bytes, source: str) -> tuple[_Key, ...]:
    if len(data) > MAX_KEY_SET_BYTES:
        raise KeySetError(source, f"larger than {MAX_KEY_SET_BYTES} bytes")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        raise KeySetError(source, "not JSON") from None
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise KeySetError(source, 'not a key set (a JSON object with a "keys" list)')
    if any(isinstance(jwk, dict) and "d" in jwk for jwk in document["keys"]):
        raise KeySetError(source, 'holds a private key (a "d" member): publish only public keys')
    keys = tuple(key for key in map(_key, document["keys"]) if key is not None)
    if not keys:
        raise KeySetError(source, "no usable signing key (RSA, EC P-256/P-384/P-521, Ed25519 or Ed448 with "
                                  'use "sig" or no use)')
    return keys


def _key(jwk: object) -> _Key | None:
    """One JWK as a public signing key, or None if it is not one (another use, kty or curve, or malformed)."""
    if not isinstance(jwk, dict) or jwk.get("use", "sig") != "sig":
        return None
    kty, kid, alg = jwk.get("kty"), jwk.get("kid"), jwk.get("alg")
    if not isinstance(kty, str) or kty not in _READERS or not isinstance(kid, str | None) \
            or not isinstance(alg, str | None):
        return None
    try:
        key = _READERS[kty](jwk)
    except (jwt.PyJWTError, ValueError, TypeError, KeyError):
        return None
    return _Key(kid, alg, key) if isinstance(key, PublicKey) else None


def _read_file(path: str, size: int) -> bytes:
    if size > MAX_KEY_SET_BYTES:
        raise KeySetError(path, f"larger than {MAX_KEY_SET_BYTES} bytes")
    try:
        with open(path, "rb") as file:
            return file.read(MAX_KEY_SET_BYTES + 1)
    except OSError as error:
        raise KeySetError(path, error.strerror or "cannot be read") from None


def _download(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return bytes(answer.read(MAX_KEY_SET_BYTES + 1))
    except urllib.error.HTTPError as error:
        error.close()
        raise KeySetError(url, f"HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as error:
        reason = error.reason if isinstance(error, urllib.error.URLError) else error
        raise KeySetError(url, f"cannot be fetched ({reason})") from None


def _unverified(token: str) -> dict[str, Any]:
    """A token's claims once its signature is known to be good (for naming a wrong claim in a refusal)."""
    try:
        return dict(jwt.decode(token, options={"verify_signature": False}))
    except jwt.PyJWTError:
        return {}


def _quote(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _refused(reason: str) -> Unauthenticated:
    return Unauthenticated(f"JWT refused: {reason}", field="authorization")
