"""How a process proves itself to a cluster: one object for the token and TLS material.

A :class:`flightpart.client.Client` hands its :class:`Access` to every connection it makes. A pickled one
carries the token and the CA, never the private key: unpickled, it takes the client certificate from this
process's registry, else from ``$FLIGHTPART_TLS_CERT`` / ``$FLIGHTPART_TLS_KEY``.
"""

from __future__ import annotations

import os
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

TOKEN_ENV = "FLIGHTPART_TOKEN"
TOKEN_FILE_ENV = "FLIGHTPART_TOKEN_FILE"
SECRET_ENV = "FLIGHTPART_SECRET"
TLS_CA_ENV = "FLIGHTPART_TLS_CA"
TLS_CERT_ENV = "FLIGHTPART_TLS_CERT"
TLS_KEY_ENV = "FLIGHTPART_TLS_KEY"

_certificates: dict[str, tuple[bytes, bytes]] = {}
_certificates_lock = threading.Lock()


@dataclass(frozen=True)
class Access:
    """A token and TLS settings: root certificates to trust, and a client certificate for mutual TLS."""

    token: str | None = None
    tls_root_certs: bytes | None = None
    cert_chain: bytes | None = field(default=None, repr=False)
    private_key: bytes | None = field(default=None, repr=False)
    cert_id: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.cert_chain is None) != (self.private_key is None):
            raise ValueError("cert_chain and private_key go together: give both or neither")
        if self.cert_chain is not None and self.cert_id is None:
            cert_id = uuid.uuid4().hex
            object.__setattr__(self, "cert_id", cert_id)
            with _certificates_lock:
                _certificates[cert_id] = (self.cert_chain, self.private_key)  # type: ignore[assignment]

    @classmethod
    def from_environment(cls, *, token: str | None = None, tls_root_certs: bytes | None = None,
                         cert_chain: bytes | None = None, private_key: bytes | None = None) -> "Access":
        """Explicit values, else ``$FLIGHTPART_TOKEN``, ``$FLIGHTPART_TLS_CA`` and the client certificate variables."""
        token = token or os.environ.get(TOKEN_ENV) or None
        if token is None and os.environ.get(TOKEN_FILE_ENV):
            token = read_secret_file(os.environ[TOKEN_FILE_ENV]).decode()
        if tls_root_certs is None and os.environ.get(TLS_CA_ENV):
            tls_root_certs = Path(os.environ[TLS_CA_ENV]).read_bytes()
        if cert_chain is None and private_key is None and tls_root_certs is not None:
            cert_chain, private_key = environment_certificate()
        return cls(token, tls_root_certs, cert_chain, private_key)

    @property
    def tls(self) -> bool:
        return self.tls_root_certs is not None

    def client_kwargs(self) -> dict:
        """Keyword arguments of ``pyarrow.flight.FlightClient`` for these settings."""
        pairs = (("tls_root_certs", self.tls_root_certs), ("cert_chain", self.cert_chain),
                 ("private_key", self.private_key))
        return {k: v for k, v in pairs if v}

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"authorization", f"Bearer {self.token}".encode())] if self.token else []

    def __reduce__(self):
        return (_restore, (self.token, self.tls_root_certs, self.cert_id))


def _restore(token: str | None, tls_root_certs: bytes | None, cert_id: str | None) -> Access:
    """An unpickled Access: the client certificate from this process's registry or environment."""
    with _certificates_lock:
        known = _certificates.get(cert_id) if cert_id else None
    if known is not None:
        return Access(token, tls_root_certs, known[0], known[1], cert_id)
    cert, key = environment_certificate() if tls_root_certs is not None else (None, None)
    return Access(token, tls_root_certs, cert, key)


def environment_certificate() -> tuple[bytes | None, bytes | None]:
    """This process's client certificate and key for mutual TLS, from the environment."""
    cert, key = os.environ.get(TLS_CERT_ENV), os.environ.get(TLS_KEY_ENV)
    if not cert or not key:
        return None, None
    return Path(cert).read_bytes(), Path(key).read_bytes()


class CredentialFileError(ValueError):
    """A credential file that is missing, empty, or readable by other users."""


class EmptyCredentialFile(CredentialFileError):
    """A credential file with nothing but blanks in it."""


def read_secret_file(path: str | os.PathLike) -> bytes:
    """The first line of a credential file, refused (as ssh does) when other users may read it."""
    path = Path(path)
    try:
        st = path.stat()
        text = path.read_text()
    except OSError as exc:
        raise CredentialFileError(f"{path}: cannot read the credential file ({exc.strerror})") from None
    if st.st_mode & 0o077:
        raise CredentialFileError(f"{path}: permissions {st.st_mode & 0o777:04o} are too open: other users could read "
                                  f"this credential; run `chmod 600 {path}`")
    lines = text.strip().splitlines()
    value = lines[0].strip() if lines else ""
    if not value:
        raise EmptyCredentialFile(f"{path}: the credential file is empty")
    return value.encode()
