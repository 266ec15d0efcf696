"""Users' passwords: kept only as a slow salted hash, checked in constant time.

A stored hash reads ``scrypt$<log2 N>$<r>$<p>$<salt>$<hash>`` (salt and hash in URL-safe base64), so a cost raised
later still checks the hashes made before. scrypt with N = 2^15, r = 8 (32 MiB and about 0.15 s a check here) makes
every guess of a stolen database as dear as a sign-in; OpenSSL's scrypt (:func:`hashlib.scrypt`) does the work.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets

SCHEME = "scrypt"
LOG2_N, R, P = 15, 8, 1
"""The cost of new hashes (each check pays the cost its hash was made with)."""
SALT_BYTES, HASH_BYTES = 16, 32
MIN_LENGTH, MAX_LENGTH = 8, 1024
"""A password's length in characters: shorter ones fall to a search, longer ones only cost the hashing."""
_COMMON = frozenset({"password", "passw0rd", "password1", "12345678", "123456789", "1234567890", "qwertyuiop",
                     "iloveyou", "letmein1", "changeme", "sunshine", "football", "baseball", "abc12345", "admin123",
                     "welcome1", "trustno1", "11111111", "00000000", "qwerty123", "flightpart"})


class WeakPassword(ValueError):
    """A new password too short, too long or one everyone tries."""


def check_new_password(password: str) -> None:
    """:class:`WeakPassword` (saying why) unless ``password`` may be set: 8 to 1024 characters, not a common one."""
    if len(password) < MIN_LENGTH:
        raise WeakPassword(f"a password needs at least {MIN_LENGTH} characters (this one has {len(password)})")
    if len(password) > MAX_LENGTH:
        raise WeakPassword(f"a password has at most {MAX_LENGTH} characters")
    if password.lower() in _COMMON or len(set(password)) == 1:
        raise WeakPassword("this password is one everyone tries first: choose another")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _scrypt(password: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    n = 1 << log2_n
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=2 * 128 * n * r * p + (1 << 20),
                          dklen=HASH_BYTES)


def hash_password(password: str) -> str:
    """The stored form of ``password`` (a fresh salt each time)."""
    salt = secrets.token_bytes(SALT_BYTES)
    return f"{SCHEME}${LOG2_N}${R}${P}${_b64(salt)}${_b64(_scrypt(password, salt, LOG2_N, R, P))}"


def password_matches(stored: str, password: str) -> bool:
    """Whether ``password`` is the one ``stored`` was made from; False for a stored form this release cannot read."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != SCHEME:
        return False
    try:
        log2_n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, expected = _unb64(parts[4]), _unb64(parts[5])
    except ValueError:
        return False
    if not (10 <= log2_n <= 20 and 1 <= r <= 32 and 1 <= p <= 4) or len(password) > MAX_LENGTH:
        return False
    return hmac.compare_digest(_scrypt(password, salt, log2_n, r, p), expected)


@functools.lru_cache(maxsize=1)
def unknown_user_hash() -> str:
    """A hash no password matches, checked for a name that is no user: a refusal takes as long either way, so
    timing does not tell which names are users."""
    return hash_password(secrets.token_urlsafe(24))
