"""Roles, capabilities and signatures: who may mint a credential, and who may only check one.

A cluster has one secret, held by its catalog and its operator (the
``flightpart token`` command). An Ed25519 signing key is derived from it;
everything a daemon must trust is signed with that key:

    fp2:<role>:<name>:<expiry>:<sig>            a role token (reader, writer, admin, node)
    fp2:cap:<dataset>@<version>:<expiry>:<sig>  a read capability for one version
    fp2:put:<dataset>@<version>#<i>_<j>><node>:<expiry>:<sig>  one copy of one partition to one node
    fp2:begun:<dataset>@<version>><writer>:<expiry>:<sig>  a writer's leave to write a version it began
    a sealed manifest's ``signature``            "this catalog committed this version with these holders"

<expiry> is a Unix time (0: never); <sig> is the Ed25519 signature (URL-safe
base64, 86 characters) of the rest. Nodes get the public half only (a
:class:`VerifyKey`): they check any token without being able to mint one,
so a node's own credential (a ``node`` token naming it) cannot be turned
into a writer's, an admin's or another node's. The cluster secret itself is
also accepted as the owner's token, by the daemons that hold it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ROLES = ("reader", "writer", "admin", "node")
TOKEN_PREFIX = "fp2"
CAPABILITY = "cap"
PUT_GRANT = "put"
"""The kind of a token that writes one partition to one node (:func:`put_grant`): what the catalog gives a node it
orders to copy a replica, since a node token writes to no node."""
VERSION_GRANT = "begun"
"""The kind of a token that lets one writer put to one version it began (:func:`version_grant`): the catalog gives it
with the version number; a node takes a writer's put, assemble or relink order only with it."""
GRANT_HEADER = "x-flightpart-grant"
"""The call header a writer's put and orders carry a :func:`version_grant` in (the bearer token stays its own)."""
CATALOG_NODE = "catalog"
"""The name in the node token a catalog calls nodes with; only it may order a node to drop, seal or copy."""
VERIFY_KEY_PREFIX = "fpk1"
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_TOKEN_CONTEXT = b"flightpart token\0"
_MANIFEST_CONTEXT = b"flightpart manifest\0"


@dataclass(frozen=True)
class VerifyKey:
    """The public half of a cluster's signing key: checks tokens and manifests, mints nothing."""

    raw: bytes

    def text(self) -> str:
        """The form kept in a verify-key file (``fpk1:`` and the 32 bytes in URL-safe base64)."""
        return f"{VERIFY_KEY_PREFIX}:{_b64(self.raw)}"

    @classmethod
    def parse(cls, text: str) -> VerifyKey:
        prefix, _, body = text.strip().partition(":")
        try:
            raw = _unb64(body)
        except ValueError:
            raw = b""
        if prefix != VERIFY_KEY_PREFIX or len(raw) != 32:
            raise ValueError("not a flightpart verify key (expected fpk1:<32 bytes in base64>; "
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


@functools.lru_cache(maxsize=8)
def signing_key(secret: bytes) -> Ed25519PrivateKey:
    """The cluster's signing key, derived from its secret (so the secret stays the one thing an operator keeps)."""
    return Ed25519PrivateKey.from_private_bytes(hmac.new(secret, b"flightpart ed25519 signing key", hashlib.sha256).digest())


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
    """A role token's body (``fp2:<role>:<name>:<expiry>``, public) and its signature's bytes (a secret between the
    token's holder and the cluster secret's); None for anything else."""
    body, _, signature = token.rpartition(":")
    if body.count(":") != 3 or not body.startswith(TOKEN_PREFIX + ":"):
        return None
    try:
        raw = _unb64(signature)
    except ValueError:
        return None
    return (body, raw) if len(raw) == 64 else None


def is_node_token_body(body: str, node_id: str, now: float, margin: float = 0.0) -> bool:
    """Whether ``body`` (a role token without its signature) is a node token naming ``node_id`` that has not expired
    (``margin``: seconds still accepted after its expiry, as :func:`verify_token` allows)."""
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
    """The signature of a token's ``body`` as this cluster mints it: Ed25519 signs deterministically, so the holder
    of the secret recomputes any token's signature from its public body, and can use it as a key shared with the
    token's holder alone (the heartbeat datagrams are signed with it; it never crosses the wire)."""
    return signing_key(secret).sign(_TOKEN_CONTEXT + body.encode())


def put_grant(secret: bytes, dataset: str, version: int, part: tuple[int, int], node_id: str, expiry: int) -> str:
    """A bearer token that puts partition ``part`` of ``dataset`` v``version`` to node ``node_id``, and nothing else,
    until ``expiry``: the catalog gives it with a copy-to order to the node that sends the copy."""
    from .wire import check_name  # the one rule for names; the wire does not import tokens

    if not _LABEL.fullmatch(node_id):
        raise ValueError(f"node id {node_id!r}: use 1 to 64 letters, digits, '_', '.' and '-'")
    body = (f"{TOKEN_PREFIX}:{PUT_GRANT}:{check_name(dataset)}@{int(version)}#{int(part[0])}_{int(part[1])}>{node_id}:"
            f"{int(expiry)}")
    return f"{body}:{_sign(secret, _TOKEN_CONTEXT, body)}"


def version_grant(secret: bytes, dataset: str, version: int, writer: str, expiry: int) -> str:
    """A token that lets the writer named ``writer`` put to ``dataset`` v``version``, which it began, until ``expiry``.

    A writer's token alone had put files to any node for versions nobody began: they broke another writer's put of
    that number, and one at the last version number used up its name. It is no bearer token: a node reads it from
    :data:`GRANT_HEADER`, next to the writer's own."""
    from .wire import check_name  # the one rule for names; the wire does not import tokens

    if not _LABEL.fullmatch(writer):
        raise ValueError(f"writer {writer!r}: use 1 to 64 letters, digits, '_', '.' and '-'")
    body = f"{TOKEN_PREFIX}:{VERSION_GRANT}:{check_name(dataset)}@{int(version)}>{writer}:{int(expiry)}"
    return f"{body}:{_sign(secret, _TOKEN_CONTEXT, body)}"


def signed_capability(secret: bytes, dataset: str, version: int, expiry: int) -> str:
    """A bearer token that reads one dataset version and nothing else, until ``expiry``.

    ``dataset`` must be a checked name: :func:`capability` checks it (names are the wire's rule)."""
    body = f"{TOKEN_PREFIX}:{CAPABILITY}:{dataset}@{int(version)}:{int(expiry)}"
    return f"{body}:{_sign(secret, _TOKEN_CONTEXT, body)}"


@dataclass(frozen=True)
class Credential:
    """What a verified bearer token grants."""

    role: str                       # a role, "cap", or "owner" (the cluster secret itself)
    name: str                       # who: a user's or node's name, or "dataset@version" for a capability
    expiry: int = 0

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
    """The credential a bearer token carries, or None if it is not one this cluster signed or it has expired.

    ``secret``: the cluster secret, or only its :class:`VerifyKey` (then the secret itself is no token). A
    signature is checked once per token and remembered (a reader presents the same token on every call).
    ``margin``: seconds a token is still accepted after its expiry, so a verifier whose clock runs ahead of
    the one that minted it by less than that does not refuse it early (the price: one served that much late)."""
    if isinstance(secret, bytes) and hmac.compare_digest(token.encode(), secret):
        return Credential("owner", "owner")
    credential = _signed_credential(_public(secret), token)
    if credential is None or (credential.expiry and credential.expiry + margin < now):
        return None
    return credential


@functools.lru_cache(maxsize=4096)
def _signed_credential(key: VerifyKey, token: str) -> Credential | None:
    parts = token.split(":")
    if len(parts) != 5 or parts[0] != TOKEN_PREFIX:
        return None
    _prefix, role, name, expiry, signature = parts
    if (role not in ROLES and role not in (CAPABILITY, PUT_GRANT, VERSION_GRANT)) or not (expiry.isascii() and expiry.isdigit()):
        return None
    if not _valid(key, _TOKEN_CONTEXT, ":".join(parts[:4]), signature):
        return None
    return Credential(role, name, int(expiry))


def manifest_signature(secret: bytes, manifest_json: dict) -> str:
    """The catalog's signature of a sealed manifest (its JSON form without the signature)."""
    return _sign(secret, _MANIFEST_CONTEXT, _canonical(manifest_json))


def manifest_signed(keys: Keys, manifest_json: dict, signature: str | None) -> bool:
    """Whether the catalog of this cluster signed this manifest (its JSON form without the signature)."""
    return signature is not None and _valid(_public(keys), _MANIFEST_CONTEXT, _canonical(manifest_json), signature)


def _canonical(body: dict) -> str:
    return json.dumps({k: v for k, v in body.items() if k != "signature"}, sort_keys=True, separators=(",", ":"))


def capability(secret: bytes, dataset: str, version: int, expiry: int) -> str:
    """A bearer token that reads one dataset version and nothing else, until ``expiry``."""
    from .wire import check_name  # the one rule for names; the wire does not import tokens

    return signed_capability(secret, check_name(dataset), version, expiry)
