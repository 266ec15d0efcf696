"""A daemon's credentials and who it lets in: the cluster secret, a node's own token, the verify key, TLS.

:class:`Security` is the value both daemons are started with (its fields are
options of ``flightpart serve`` and ``flightpart catalog``); it reads the
secret and keys when asked, refuses a weak secret, and refuses to start a
daemon open to anyone beyond loopback unless the operator says ``--insecure``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flightpart.errors import CannotStart
from flightpart.io.access import SECRET_ENV, TOKEN_ENV, Access, EmptyCredentialFile, read_secret_file
from flightpart.settings import setting

if TYPE_CHECKING:  # imported where used: the CLI builds this value before any daemon starts
    from flightpart.io.connections import ConnectionPool
    from flightpart.tokens import Keys


@dataclass(frozen=True)
class Security:
    """A daemon's credentials: the cluster secret's file (or a node's own token and the verify key), its own TLS
    certificate, and the CAs it trusts.

    The secret comes from ``--secret-file`` (a file only its owner may read)
    or ``$FLIGHTPART_SECRET``, never from the command line. The catalog
    needs it (it mints capabilities and signs manifests); a node needs only
    ``--node-token-file`` (its own node token, which names it) and
    ``--verify-key-file`` (to check callers' tokens without being able to
    mint one), so a node taken over cannot act as a writer, an admin or
    another node. Without any the cluster is open: every caller has every right.
    An open daemon binds loopback only unless ``insecure`` says the
    operator means it (:meth:`check_exposure`).
    """

    secret_file: str | None = setting(
        None, "--secret-file", "File (mode 600) whose first line is the cluster secret (or $FLIGHTPART_SECRET); "
        "role tokens and read capabilities derive from it. Without one the cluster is open.",
        aliases=("--token-file",), path="file")
    tls_cert: str | None = setting(None, "--tls-cert", "PEM certificate to serve TLS.", path="file")
    tls_key: str | None = setting(None, "--tls-key", "PEM private key of --tls-cert.", path="file")
    tls_client_ca: str | None = setting(None, "--tls-client-ca",
                                        "Require client certificates signed by this CA (mutual TLS).", path="file")
    tls_ca: str | None = setting(None, "--tls-ca",
                                 "CA that signs the other daemons' certificates (or $FLIGHTPART_TLS_CA).",
                                 path="file", envvar="FLIGHTPART_TLS_CA")
    insecure: bool = setting(False, "--insecure", "Without a secret, bind beyond loopback anyway: an open daemon "
                             "that anyone who reaches it may read, write and delete through. Without this flag an "
                             "open daemon binds loopback only.")
    node_token_file: str | None = None  # a node's options, not the catalog's: set from NodeSettings.credentials
    verify_key_file: str | None = None

    def check_exposure(self, host: str, what: str) -> None:
        """Refuse to start a daemon that would be open to whoever reaches it without the operator saying so.

        Like Redis' protected mode: with no secret, only loopback; beyond it,
        ``--insecure``. ``$FLIGHTPART_TOKEN`` in a daemon's environment with
        no secret means someone believes this cluster checks tokens: it
        would not, so the daemon says so instead of running open silently.
        """
        if self.secret() is not None:
            return
        if os.environ.get(TOKEN_ENV):
            raise CannotStart(f"the {what} has no cluster secret but ${TOKEN_ENV} is set: a daemon does not check "
                              "tokens without the secret they derive from. Next: give the secret with --secret-file "
                              f"or ${SECRET_ENV} (then make tokens with `flightpart token`), or unset {TOKEN_ENV} to "
                              "run an open cluster")
        if not self.insecure and not is_loopback(host):
            raise CannotStart(f"the {what} has no cluster secret, so it would let anyone who reaches {host or '*'} "
                              "read, write and delete every dataset. Next: give a secret with --secret-file or "
                              f"${SECRET_ENV}, bind loopback (--host 127.0.0.1), or say --insecure on a network you "
                              "trust")

    def auth_mode(self) -> str:
        """How callers are checked, for the start-up line: ``secret`` or ``open``."""
        return "open" if self.secret() is None else "secret"

    def tls_mode(self) -> str:
        """``off``, ``on`` or ``mutual`` (client certificates required), for the start-up line."""
        if not self.tls_cert:
            return "off"
        return "mutual" if self.tls_client_ca else "on"

    def server_options(self) -> dict:
        """Keyword arguments of a flightpart server: what it verifies tokens with and its TLS settings."""
        from .auth import tls_server_options

        return {**tls_server_options(self.tls_cert, self.tls_key, self.tls_client_ca), "secret": self.keys()}

    def keys(self) -> Keys | None:
        """The cluster secret when this daemon holds it, else the verify key (a node's), else None (an open cluster)."""
        from flightpart.tokens import VerifyKey

        secret = self.secret()
        if secret is not None or not self.verify_key_file:
            return secret
        try:
            return VerifyKey.parse(Path(self.verify_key_file).read_text())
        except (OSError, ValueError) as exc:
            raise CannotStart(f"--verify-key-file {self.verify_key_file}: {exc}") from None

    def node_token(self) -> str | None:
        """This node's own token (``--node-token-file``, mode 600), or None."""
        if not self.node_token_file:
            return None
        if not (self.verify_key_file or self.secret_file or os.environ.get(SECRET_ENV)):
            raise CannotStart("--node-token-file needs --verify-key-file (print it with `flightpart verify-key`) "
                              "to check the tokens of those who call this node")
        return read_secret_file(self.node_token_file).decode()

    def catalog_secret(self) -> bytes | None:
        """The secret a catalog works with; a catalog given only a verify key cannot mint capabilities nor sign."""
        if self.secret() is None and (self.verify_key_file or self.node_token_file):
            raise CannotStart("a catalog needs the cluster secret (--secret-file or $FLIGHTPART_SECRET): "
                              "--node-token-file and --verify-key-file are for nodes that run without a catalog inside")
        return self.secret()

    def secret(self) -> bytes | None:
        """The cluster secret (``--secret-file``, else ``$FLIGHTPART_SECRET``), or None; ``CANNOT_START`` for one that
        could be guessed (:func:`~flightpart.tokens.check_secret`), naming where it came from and how to make a good
        one."""
        from flightpart.tokens import WeakSecret, check_secret

        if self.secret_file:
            source = f"--secret-file {self.secret_file}"
            try:
                value = read_secret_file(self.secret_file)
            except EmptyCredentialFile:
                value = b""  # refused below as blank, with how to make a good one
        else:
            # never $FLIGHTPART_TOKEN: a client's credential, not the cluster's secret
            text = os.environ.get(SECRET_ENV)
            if not text:
                return None
            value, source = text.encode(), f"${SECRET_ENV}"
        try:
            check_secret(value)
        except WeakSecret as exc:
            raise CannotStart(f"{source}: {exc}", field="secret") from None
        return value

    def pool(self) -> ConnectionPool:
        """Connections to the other daemons, presenting this daemon's own certificate under mutual TLS."""
        from flightpart.io.connections import ConnectionPool

        ca = Path(self.tls_ca).read_bytes() if self.tls_ca else None
        own = ((Path(self.tls_cert).read_bytes(), Path(self.tls_key).read_bytes())
               if self.tls_cert and self.tls_key and ca else (None, None))
        return ConnectionPool(Access(None, ca, own[0], own[1]))




def is_loopback(host: str) -> bool:
    """True when ``host`` names this machine's loopback only (127.0.0.0/8, ::1, a name that resolves there only)."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(found) and all(ipaddress.ip_address(address.split("%")[0]).is_loopback for address in found)
