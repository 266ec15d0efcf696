"""Signing in to a catalog: a user's name and password, or an identity provider's token, exchanged for a session
token by Flight's basic-token handshake; the session token then goes to the catalog and to every node.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pyarrow.flight as flight

from flightpart.errors import FlightpartError, Unauthenticated

from .access import Access
from .errors import translate

JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


class _Bearer(flight.ClientAuthHandler):
    """A handshake that sends nothing of its own: its call's headers carry the token, and the catalog answers with a
    session token in its headers."""

    def authenticate(self, outgoing: flight.ClientAuthSender, incoming: flight.ClientAuthReader) -> None:
        pass

    def get_token(self) -> str:
        return ""


class _Heard(flight.ClientMiddlewareFactory):
    """Keeps the headers of the answers its client receives."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[tuple[str, str]] = []

    def start_call(self, info: flight.CallInfo) -> flight.ClientMiddleware:
        return _Hearing(self)


class _Hearing(flight.ClientMiddleware):
    def __init__(self, factory: _Heard):
        super().__init__()
        self.factory = factory

    def received_headers(self, headers: dict) -> None:
        for key, values in headers.items():
            for value in values:
                self.factory.headers.append((str(key), value.decode() if isinstance(value, bytes) else str(value)))


def _first_answer(uris: list[str], access: Access, call: Callable[[flight.FlightClient, _Heard], str]) -> str:
    failure: FlightpartError | None = None
    for uri in uris:
        heard = _Heard()
        client = flight.FlightClient(uri, middleware=[heard], **access.client_kwargs())
        try:
            return call(client, heard)
        except (flight.FlightError, OSError) as exc:
            failure = translate(exc)
            if isinstance(failure, Unauthenticated):
                raise failure from None
        finally:
            client.close()
    assert failure is not None
    raise failure


def signed_in(uris: list[str], access: Access, user: str, password: str) -> Access:
    """``access`` carrying the session token a catalog of ``uris`` gives ``user`` for ``password``
    (:class:`~flightpart.errors.Unauthenticated` for a wrong pair, or a name locked after failures)."""

    def sign_in(client: flight.FlightClient, heard: _Heard) -> str:
        name, value = client.authenticate_basic_token(user, password)
        text = value.decode() if isinstance(value, bytes) else str(value)
        return text.removeprefix("Bearer ")

    return dataclasses.replace(access, token=_first_answer(uris, access, sign_in))


def exchanged(uris: list[str], access: Access) -> Access:
    """``access`` with an identity provider's token (a JWT) exchanged for a session token, which nodes also take; any
    other token unchanged."""
    token = access.token
    if token is None or not JWT.fullmatch(token):
        return access

    def exchange(client: flight.FlightClient, heard: _Heard) -> str:
        options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
        client.authenticate(_Bearer(), options=options)
        for key, value in heard.headers:
            if key.lower() == "authorization" and value.startswith("Bearer "):
                return value.removeprefix("Bearer ")
        raise Unauthenticated("the catalog gave no session for this token (is it started with --jwks?)",
                              field="authorization")

    return dataclasses.replace(access, token=_first_answer(uris, access, exchange))
