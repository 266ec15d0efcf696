"""Roles, capabilities and signatures: who may mint a credential, and who may only check one.

A cluster has one secret, held by its catalog and its operator (``flightpart token``). An Ed25519 signing key
is derived from it by scrypt (:func:`signing_key`, once per process), and everything a daemon must trust is
signed with that key:

    fp3:<role>:<name>:<expiry>:<sig>            a role token (reader, writer, admin, node)
    fp3:cap:<dataset>@<version>[~<holder>~<issued>]:<expiry>:<sig>  a read capability for one version
    fp3:put:<dataset>@<version>#<i>_<j>><node>:<expiry>:<sig>  one copy of one partition to one node
    fp3:begun:<dataset>@<version>><writer>:<expiry>:<sig>  a writer's leave to write a version it began
    fp3:user:<name>~<role>~<issued>:<expiry>:<sig>  a user's session, given at sign-in (<issued>: Unix milliseconds)
    fp3:idp:<name>~<role>~<issued>~<groups>:<expiry>:<sig>  a session of a user an identity provider vouched for
    a sealed manifest's ``signature``            "this catalog committed this version with these holders"

<expiry> is a Unix time (0: never); <sig> is the Ed25519 signature (URL-safe base64, 86 characters) of the rest.
Nodes hold only the public half (:class:`VerifyKey`): they check any token but mint none, so a node's own token
cannot become another's. The daemons holding the secret also accept it as the owner's token.

Why a stolen token does not give the secret away: everything that leaves the catalog is made with the derived
key only, so testing one guess costs one scrypt derivation, and a secret must carry at least
:data:`SECRET_MIN_BITS` bits (:func:`check_secret`), so there is no short list of guesses.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import math
import re
import secrets
import string
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .grants import IDP_HOLDER_PREFIX, TOKEN_HOLDER_PREFIX

ROLES = ("reader", "writer", "admin", "node")
TOKEN_PREFIX = "fp3"
"""The version of the token format: it changes whenever the signing key is derived differently."""
OUTDATED_TOKEN_PREFIXES = ("fp1", "fp2")
"""Token formats of earlier releases (other keys), refused as ``UNAUTHENTICATED`` with a hint to mint again."""
CAPABILITY = "cap"
PUT_GRANT = "put"
"""The kind of a token that writes one partition to one node (:func:`put_grant`): what the catalog gives a node it
orders to copy a replica, since a node token writes to no node."""
USER_SESSION = "user"
"""The kind of a user's session token (:func:`session_token`): the user's name, role and when it was issued."""
IDP_SESSION = "idp"
"""The kind of a session of a user an identity provider vouched for: also the groups it named."""
USER_ROLES = ("reader", "writer", "admin")
"""The roles a user may have (a node's is no user's)."""
VERSION_GRANT = "begun"
"""The kind of a token that lets one writer put to one version it began (:func:`version_grant`): the catalog gives it
with the version number; a node takes a writer's put, assemble or relink order only with it."""
GRANT_HEADER = "x-flightpart-grant"
"""The call header a writer's put and orders carry a :func:`version_grant` in (the bearer token stays its own)."""
CATALOG_NODE = "catalog"
"""The name in the node token a catalog calls nodes with; only it may order a node to drop, seal or copy."""
VERIFY_KEY_PREFIX = "fpk2"
OUTDATED_VERIFY_KEY_PREFIXES = ("fpk1",)
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_TOKEN_CONTEXT = b"flightpart token\0"
_MANIFEST_CONTEXT = b"flightpart manifest\0"


@dataclass(frozen=True)
class VerifyKey:
    """The public half of a cluster's signing key: checks tokens and manifests, mints nothing."""

    raw: bytes

    def text(self) -> str:
        """The form kept in a verify-key file (``fpk2:`` and the 32 bytes in URL-safe base64)."""
        return f"{VERIFY_KEY_PREFIX}:{_b64(self.raw)}"

    @classmethod
    def parse(cls, text: str) -> VerifyKey:
        prefix, _, body = text.strip().partition(":")
        try:
            raw = _unb64(body)
        except ValueError:
            raw = b""
        if prefix in OUTDATED_VERIFY_KEY_PREFIXES:
            raise ValueError(f"a {prefix} verify key, of an earlier release's signing key: print the cluster's "
                             "current one with `flightpart verify-key`")
        if prefix != VERIFY_KEY_PREFIX or len(raw) != 32:
            raise ValueError(f"not a flightpart verify key (expected {VERIFY_KEY_PREFIX}:<32 bytes in base64>; "
                             "print one with `flightpart verify-key`)")
        return cls(raw)


Keys = bytes | VerifyKey
"""What a daemon verifies with: the cluster secret (mints and verifies) or the verify key (verifies only)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    if not text.isascii() or not re.fullmatch(r"[A-Za-z0-9_-]*", text):
        raise ValueError("not URL-safe base64")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


SECRET_MIN_BITS = 128
"""The least a cluster secret must carry, as :func:`secret_bits` estimates it: beyond any search of guesses."""
SECRET_COMMAND = "flightpart secret --out FILE"
"""How an operator makes a good secret (named by every refusal of a weak one)."""
_WEAK_SECRETS = frozenset({
    "flightpart", "flight-part", "flight_part", "secret", "cluster-secret", "cluster_secret", "clustersecret",
    "flightpart-secret", "password", "passw0rd", "changeme", "change-me", "change_me", "default", "admin", "root",
    "test", "testing", "token", "letmein", "qwerty", "123456", "12345678", "123456789", "0123456789", "abc123",
    "correct horse battery staple", "correct-horse-battery-staple"})
"""Secrets everyone tries first, refused whatever their estimate (compared lower-cased, once repetition is removed)."""
_WORD_BITS = math.log2(7776)
"""What one word of a passphrase carries (a diceware list's words): a passphrase's letters are far from random."""
_WORD_SPLIT = re.compile(r"[\s\-_.,;:+/]+")


class WeakSecret(ValueError):
    """A cluster secret that can be guessed: too short, too regular, or one everyone tries."""


def new_secret() -> str:
    """A fresh cluster secret: 32 random bytes in URL-safe base64 (256 bits), always accepted by
    :func:`check_secret`."""
    while True:
        value = secrets.token_urlsafe(32)
        if secret_bits(value.encode()) >= SECRET_MIN_BITS:
            return value


def _period(text: str) -> str:
    """The shortest unit ``text`` repeats (itself when it repeats none): ``abcabcab`` is ``abc``."""
    for size in range(1, len(text) // 2 + 1):
        unit = text[:size]
        if (unit * (len(text) // size + 1))[:len(text)] == text:
            return unit
    return text


def _pool(text: str) -> int:
    """How many characters each of ``text``'s could have been, from the classes it uses."""
    if text and all(c in string.hexdigits for c in text) and (text.lower() == text or text.upper() == text):
        return 16 if any(c not in string.digits for c in text) else 10
    pool = 0
    for members, size in ((string.ascii_lowercase, 26), (string.ascii_uppercase, 26), (string.digits, 10),
                          (string.punctuation + " ", 33)):
        if any(c in members for c in text):
            pool += size
    if any(not c.isascii() or not c.isprintable() for c in text):
        pool += 128
    return max(pool, 1)


def _surprising(text: str) -> int:
    """How many characters of ``text`` its previous ones do not foretell (repeats and runs like ``abcd`` count
    nothing)."""
    count = 0
    for i, c in enumerate(text):
        if i and c == text[i - 1]:
            continue
        if (i >= 2 and ord(c) - ord(text[i - 1]) == ord(text[i - 1]) - ord(text[i - 2])
                and abs(ord(c) - ord(text[i - 1])) == 1):
            continue
        count += 1
    return count


def secret_bits(secret: bytes) -> float:
    """An estimate, erring low, of the bits a secret carries: its shortest repeated unit, runs counted once, times log2
    of its character classes' size; a passphrase counts by words; a secret everyone tries counts 0. It misses some
    regularities but refuses what an operator types without thinking."""
    text = secret.decode("utf-8", "replace").strip()
    unit = _period(text)
    if not text or text.lower() in _WEAK_SECRETS or unit.lower() in _WEAK_SECRETS:
        return 0.0
    bits = _surprising(unit) * math.log2(_pool(unit))
    words = [w for w in _WORD_SPLIT.split(unit) if w]
    if words and all(w.isalpha() and len(w) <= 12 and (w.islower() or w.istitle() or w.isupper()) for w in words):
        bits = min(bits, len(words) * _WORD_BITS)
    return bits


def check_secret(secret: bytes) -> None:
    """:class:`WeakSecret` (saying why, and how to make a good one) unless ``secret`` carries :data:`SECRET_MIN_BITS`
    bits by :func:`secret_bits`: from a guessable secret, one token lets anyone mint the rest."""
    bits = secret_bits(secret)
    if bits >= SECRET_MIN_BITS:
        return
    text = secret.decode("utf-8", "replace").strip()
    if not text:
        why = "it is empty or blank"
    elif bits == 0:
        why = "it is a value everyone tries first"
    else:
        size = f"{len(secret)} byte" + ("s" if len(secret) != 1 else "")
        why = f"{size} carrying about {bits:.0f} bits by length, character classes and repeats"
    raise WeakSecret(f"the cluster secret is too weak to sign with: {why}; at least {SECRET_MIN_BITS} bits are needed, "
                     "or one token would let anyone guess it offline and mint the rest. Next: make a strong one with "
                     f"`{SECRET_COMMAND}` (32 random bytes, mode 600) and give it with --secret-file FILE "
                     "(then mint tokens again with `flightpart token`)")


KDF_SALT = b"flightpart ed25519 signing key v3"
"""scrypt's salt: fixed per format version (the secret is the cluster's own, so no table is shared between clusters
with different secrets; one with a weak secret is refused at start)."""
KDF_N, KDF_R, KDF_P = 1 << 14, 8, 1
"""scrypt's cost: 16 MiB of memory (128 * N * r bytes) and 2^14 rounds per derivation, paid once per process by a
daemon, and by an attacker for every guess of the secret tested against anything the key made."""


def derived_seed(secret: bytes) -> bytes:
    """The 32-byte Ed25519 seed of the cluster's signing key: scrypt of the secret with :data:`KDF_SALT`,
    :data:`KDF_N`, :data:`KDF_R`, :data:`KDF_P`. Slow on purpose; use :func:`signing_key`."""
    return hashlib.scrypt(secret, salt=KDF_SALT, n=KDF_N, r=KDF_R, p=KDF_P, maxmem=4 * 128 * KDF_N * KDF_R, dklen=32)


@functools.lru_cache(maxsize=8)
def signing_key(secret: bytes) -> Ed25519PrivateKey:
    """The cluster's signing key, derived from its secret (:func:`derived_seed`) once per process and kept."""
    return Ed25519PrivateKey.from_private_bytes(derived_seed(secret))


@functools.lru_cache(maxsize=8)
def _outdated_key(secret: bytes) -> Ed25519PrivateKey:
    """The signing key of earlier releases (an HMAC of the secret): only to check manifests they sealed."""
    return Ed25519PrivateKey.from_private_bytes(hmac.new(secret, b"flightpart ed25519 signing key",
                                                         hashlib.sha256).digest())


@functools.lru_cache(maxsize=8)
def verify_key(secret: bytes) -> VerifyKey:
    """The public half of the cluster's signing key: what a node needs to check callers."""
    return VerifyKey(signing_key(secret).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def _public(keys: Keys) -> VerifyKey:
    return keys if isinstance(keys, VerifyKey) else verify_key(keys)


def _sign(secret: bytes, context: bytes, text: str) -> str:
    if isinstance(secret, VerifyKey):
        raise PermissionError("a verify key cannot sign: only the holder of the cluster secret mints credentials")
    return _b64(signing_key(secret).sign(context + text.encode()))


@functools.lru_cache(maxsize=64)
def _public_key(raw: bytes) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(raw)


def _valid(key: VerifyKey, context: bytes, text: str, signature: str) -> bool:
    try:
        _public_key(key.raw).verify(_unb64(signature), context + text.encode())
    except (InvalidSignature, ValueError):
        return False
    return True


def role_token(secret: bytes, role: str, name: str, expiry: int = 0) -> str:
    """A bearer token granting ``role`` to ``name`` (a user, or a node's name) until ``expiry`` (0: never)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if not _LABEL.fullmatch(name):
        raise ValueError(f"name {name!r}: use 1 to 64 letters, digits, '_', '.' and '-'")
    body = f"{TOKEN_PREFIX}:{role}:{name}:{int(expiry)}"
    return f"{body}:{_sign(secret, _TOKEN_CONTEXT, body)}"


def split_token(token: str) -> tuple[str, bytes] | None:
    """A role token's public body (``fp3:<role>:<name>:<expiry>``) and its signature's bytes; None for anything else."""
    body, _, signature = token.rpartition(":")
    if body.count(":") != 3 or not body.startswith(TOKEN_PREFIX + ":"):
        return None
    try:
        raw = _unb64(signature)
    except ValueError:
        return None
    return (body, raw) if len(raw) == 64 else None


def is_node_token_body(body: str, node_id: str, now: float, margin: float = 0.0) -> bool:
    """Whether ``body`` (a role token without signature) is an unexpired node token naming ``node_id`` (``margin`` as
    :func:`verify_token`)."""
    if len(body) > 200 or not body.isascii():
        return False
    parts = body.split(":")
    if (len(parts) != 4 or parts[0] != TOKEN_PREFIX or parts[1] != "node" or parts[2] != node_id
            or not (parts[3].isdigit() and len(parts[3]) <= 20)):
        return False
    expiry = int(parts[3])
    return not expiry or expiry + margin >= now


@functools.lru_cache(maxsize=8192)
def token_signature(secret: bytes, body: str) -> bytes:
    """The signature of a token's ``body`` as this cluster mints it. Ed25519 is deterministic, so the secret's holder
    can recompute it and use it as a key shared with the token's holder alone (heartbeat datagrams' MAC); it never
    crosses the wire."""
    return signing_key(secret).sign(_TOKEN_CONTEXT + body.encode())


def put_grant(secret: bytes, dataset: str, version: int, part: tuple[int, int], node_id: str, expiry: int) -> str:
    """A bearer token that puts partition ``part`` of ``dataset`` v``version`` to node ``node_id``, and nothing else,
    until ``expiry`` (given with a copy-to order)."""
    from .wire import check_name  # the one rule for names; the wire does not import tokens

    if not _LABEL.fullmatch(node_id):
        raise ValueError(f"node id {node_id!r}: use 1 to 64 letters, digits, '_', '.' and '-'")
    body = (f"{TOKEN_PREFIX}:{PUT_GRANT}:{check_name(dataset)}@{int(version)}#{int(part[0])}_{int(part[1])}>{node_id}:"
            f"{int(expiry)}")
    return f"{body}:{_sign(secret, _TOKEN_CONTEXT, body)}"


def version_grant(secret: bytes, dataset: str, version: int, writer: str, expiry: int) -> str:
    """A token that lets the writer named ``writer`` put to ``dataset`` v``version``, which it began, until ``expiry``
    (decision 0015). Not a bearer token: a node reads it from :data:`GRANT_HEADER` beside the writer's own."""
    from .wire import check_name  # the one rule for names; the wire does not import tokens

    if not _LABEL.fullmatch(writer):
        raise ValueError(f"writer {writer!r}: use 1 to 64 letters, digits, '_', '.' and '-'")
    body = f"{TOKEN_PREFIX}:{VERSION_GRANT}:{check_name(dataset)}@{int(version)}>{writer}:{int(expiry)}"
    return f"{body}:{_sign(secret, _TOKEN_CONTEXT, body)}"


def signed_capability(secret: bytes, dataset: str, version: int, expiry: int, holder: str = "",
                      issued: float = 0.0) -> str:
    """A bearer token that reads one dataset version and nothing else, until ``expiry``; ``dataset`` must be a checked
    name (:func:`capability` checks it). ``holder``: whom it was given to (a user, or a role token's
    :attr:`Credential.holder`) and ``issued`` when, so a withdrawal voids it on every node
    (:mod:`flightpart.grants`)."""
    scope = f"{dataset}@{int(version)}" + (f"~{holder}~{int(issued * 1000)}" if holder else "")
    body = f"{TOKEN_PREFIX}:{CAPABILITY}:{scope}:{int(expiry)}"
    return f"{body}:{_sign(secret, _TOKEN_CONTEXT, body)}"


def session_token(secret: bytes, user: str, role: str, issued: float, expiry: int,
                  groups: tuple[str, ...] | None = None) -> str:
    """A bearer token for ``user`` signed in with ``role`` at ``issued`` (Unix seconds) until ``expiry``. With
    ``groups`` it is an identity provider's user (:data:`IDP_SESSION`), whose groups the token carries; without, the
    catalog looks the user's groups up."""
    if role not in USER_ROLES:
        raise ValueError(f"a user's role is one of {', '.join(USER_ROLES)}, got {role!r}")
    for name in (user, *(groups or ())):
        if not _LABEL.fullmatch(name):
            raise ValueError(f"name {name!r}: use 1 to 64 letters, digits, '_', '.' and '-'")
    kind = USER_SESSION if groups is None else IDP_SESSION
    name = f"{user}~{role}~{int(issued * 1000)}" + ("" if groups is None else "~" + ",".join(groups))
    body = f"{TOKEN_PREFIX}:{kind}:{name}:{int(expiry)}"
    return f"{body}:{_sign(secret, _TOKEN_CONTEXT, body)}"


@dataclass(frozen=True)
class Credential:
    """What a verified bearer token grants."""

    role: str                       # a role, "cap", or "owner" (the cluster secret itself)
    name: str                       # who: a user's or node's name, or "dataset@version" for a capability
    expiry: int = 0
    holder: str = ""                # whom a withdrawal names: a user, "!<user>" of an identity provider, a role
                                    # token's "#<signature>", "" for none
    issued: float = 0.0             # when a session or a holder's capability was issued (Unix seconds)
    user: bool = False              # a user's session: their grants narrow what the role allows
    groups: tuple[str, ...] | None = None  # an identity provider's user's groups (None: the catalog knows them)

    @property
    def scope(self) -> tuple[str, int] | None:
        """(dataset, version) a capability is limited to; None for roles."""
        if self.role != CAPABILITY:
            return None
        dataset, _, version = self.name.rpartition("@")
        return dataset, int(version)

    @property
    def put_scope(self) -> tuple[str, int, tuple[int, int], str] | None:
        """(dataset, version, part, node id) a put grant is limited to (:func:`put_grant`); None for anything else."""
        if self.role != PUT_GRANT:
            return None
        rest, _, node_id = self.name.rpartition(">")
        rest, _, part = rest.rpartition("#")
        dataset, _, version = rest.rpartition("@")
        i, _, j = part.partition("_")
        return dataset, int(version), (int(i), int(j)), node_id


    @property
    def begun_scope(self) -> tuple[str, int, str] | None:
        """(dataset, version, writer) a version grant is limited to (:func:`version_grant`); None for anything else."""
        if self.role != VERSION_GRANT:
            return None
        rest, _, writer = self.name.rpartition(">")
        dataset, _, version = rest.rpartition("@")
        return dataset, int(version), writer


def verify_token(secret: Keys, token: str, now: float, margin: float = 0.0) -> Credential | None:
    """The credential a bearer token carries, or None if this cluster did not sign it or it has expired.

    ``secret``: the cluster secret, or only its :class:`VerifyKey` (then the secret is no token). Signatures are
    checked once per token and remembered. ``margin``: seconds a token is still accepted past its expiry, so a
    verifier whose clock runs ahead by less does not refuse it early.
    """
    if isinstance(secret, bytes) and hmac.compare_digest(token.encode(), secret):
        return Credential("owner", "owner")
    credential = _signed_credential(_public(secret), token)
    if credential is None or (credential.expiry and credential.expiry + margin < now):
        return None
    return credential


def outdated_format(token: str) -> str | None:
    """The prefix of a token in an earlier release's format (``fp2``), None for any other; refused with a hint to mint
    it again."""
    prefix = token.partition(":")[0]
    return prefix if prefix in OUTDATED_TOKEN_PREFIXES and prefix != token else None


@functools.lru_cache(maxsize=4096)
def _signed_credential(key: VerifyKey, token: str) -> Credential | None:
    parts = token.split(":")
    if len(parts) != 5 or parts[0] != TOKEN_PREFIX:
        return None
    _prefix, role, name, expiry, signature = parts
    if ((role not in ROLES and role not in (CAPABILITY, PUT_GRANT, VERSION_GRANT, USER_SESSION, IDP_SESSION))
            or not (expiry.isascii() and expiry.isdigit())):
        return None
    if not _valid(key, _TOKEN_CONTEXT, ":".join(parts[:4]), signature):
        return None
    if role in (USER_SESSION, IDP_SESSION):
        return _session(role, name, int(expiry))
    if role == CAPABILITY and "~" in name:
        scope, holder, issued = (name.split("~") + ["", ""])[:3]
        if not issued.isdigit() or len(issued) > 18:
            return None
        return Credential(role, scope, int(expiry), holder=holder, issued=int(issued) / 1000)
    holder = TOKEN_HOLDER_PREFIX + signature[:16] if role in ROLES else ""
    return Credential(role, name, int(expiry), holder=holder)


def _session(kind: str, name: str, expiry: int) -> Credential | None:
    """A session token's credential: the user's name and role, their groups when an identity provider named them."""
    fields = name.split("~")
    if len(fields) != (3 if kind == USER_SESSION else 4) or fields[1] not in USER_ROLES or not fields[2].isdigit():
        return None
    groups = tuple(g for g in fields[3].split(",") if g) if kind == IDP_SESSION else None
    holder = fields[0] if groups is None else IDP_HOLDER_PREFIX + fields[0]
    return Credential(fields[1], fields[0], expiry, holder=holder, issued=int(fields[2]) / 1000, user=True,
                      groups=groups)


def manifest_signature(secret: bytes, manifest_json: dict) -> str:
    """The catalog's signature of a sealed manifest (its JSON form without the signature)."""
    return _sign(secret, _MANIFEST_CONTEXT, _canonical(manifest_json))


def manifest_signed(keys: Keys, manifest_json: dict, signature: str | None) -> bool:
    """Whether this cluster's catalog signed this manifest (its JSON form without the signature). With the secret, a
    manifest sealed by an earlier release's key counts too, since nodes keep them and a rebuilding catalog must
    trust them."""
    if signature is None:
        return False
    text = _canonical(manifest_json)
    if _valid(_public(keys), _MANIFEST_CONTEXT, text, signature):
        return True
    if not isinstance(keys, bytes):
        return False
    outdated = VerifyKey(_outdated_key(keys).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
    return _valid(outdated, _MANIFEST_CONTEXT, text, signature)


def _canonical(body: dict) -> str:
    return json.dumps({k: v for k, v in body.items() if k != "signature"}, sort_keys=True, separators=(",", ":"))


def capability(secret: bytes, dataset: str, version: int, expiry: int, holder: str = "", issued: float = 0.0) -> str:
    """A bearer token that reads one dataset version and nothing else, until ``expiry`` (``holder`` and ``issued``:
    :func:`signed_capability`)."""
    from .wire import check_name  # the one rule for names; the wire does not import tokens

    return signed_capability(secret, check_name(dataset), version, expiry, holder, issued)
