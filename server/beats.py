"""Heartbeats in datagrams: the cheap path for every node's beat (decision 0020).

Only a registered node's plain beat travels this way, and only as a shortcut: the catalog answers "taken" when it
leads and knows the node, "not taken" otherwise, and nothing to a datagram it cannot check. What is not taken the
node sends again over Flight at once, whose answer is the authority; a lost datagram costs a Flight call, never
a beat.

With a cluster secret both directions are signed: HMAC-SHA256 keyed with the signature part of the node's token
(Ed25519 is deterministic, so the catalog recomputes it from the token's public body, all a datagram carries).
The body carries the node's clock in milliseconds, taken only past every beat taken from it
(``CatalogState.heartbeat``); the reply echoes it, so a replayed reply matches no beat.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from flightpart.tokens import is_node_token_body, split_token, token_signature
from flightpart.wire import Heartbeat

from .auth import CLOCK_MARGIN, wall_clock

log = logging.getLogger("flightpart.beats")

UDP_ENV = "FLIGHTPART_UDP_HEARTBEATS"
MAGIC = b"fpbeat1\n"
_MAC_BYTES = 32
_UNSIGNED = bytes(_MAC_BYTES)
MAX_DATAGRAM = 2048
"""A beat is ~200 bytes; anything longer is not one."""
ANSWER_SECONDS = 1.0
"""The longest a node waits for a datagram's answer before it sends the beat over Flight."""


def udp_heartbeats_enabled() -> bool:
    """Off when ``FLIGHTPART_UDP_HEARTBEATS`` says so (off, 0, no, false)."""
    return os.environ.get(UDP_ENV, "on").strip().lower() not in ("off", "0", "no", "false")


def _mac(key: bytes, raw: bytes) -> bytes:
    return hmac.new(key, raw, hashlib.sha256).digest()


def pack(body: dict, key: bytes | None) -> bytes:
    """A datagram: the magic, the body's MAC (zeros when unsigned), the body as compact JSON."""
    raw = json.dumps(body, separators=(",", ":")).encode()
    return MAGIC + (_mac(key, raw) if key is not None else _UNSIGNED) + raw


def unpack(datagram: bytes) -> tuple[bytes, bytes, Any] | None:
    """(MAC, raw body, decoded body) of a datagram, None for what is not one."""
    if len(datagram) > MAX_DATAGRAM or not datagram.startswith(MAGIC):
        return None
    start = len(MAGIC) + _MAC_BYTES
    raw = datagram[start:]
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return None
    return datagram[len(MAGIC):start], raw, body


def signed_by(mac: bytes, raw: bytes, key: bytes | None) -> bool:
    """Whether ``mac`` is the body's under ``key`` (None: the body must come unsigned)."""
    return hmac.compare_digest(mac, _mac(key, raw) if key is not None else _UNSIGNED)


def catalog_address(uri: str, signed: bool) -> tuple[str, int] | None:
    """Host and port a catalog listens for beats on (its Flight port, over UDP); None when beats must go over
    Flight: a Unix socket, or TLS without a token to sign them with."""
    parts = urlsplit(uri)
    if parts.scheme not in ("grpc", "grpc+tcp", "grpc+tls") or (parts.scheme == "grpc+tls" and not signed):
        return None
    try:
        port = parts.port
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname and port else None


class BeatSender:
    """A node's side: heartbeats to one catalog in datagrams, each waiting at most ``timeout`` for its answer."""

    def __init__(self, uri: str, token: str | None, timeout: float) -> None:
        self.uri = uri
        self.timeout = timeout
        self.heard: tuple[float, float, float] | None = None
        """From the last answer that took a beat: when the beat was sent and answered by this node's clock, and the
        catalog's clock in between (seconds); see :meth:`~flightpart.server.auth.GuardFactory.heard_catalog_clock`."""
        split = split_token(token) if token is not None else None
        self._token_body, self._key = split if split is not None else (None, None)
        address = catalog_address(uri, self._key is not None)
        if address is None:
            raise ValueError(f"heartbeats to {uri} go over Flight")
        family, kind, proto, _name, self._address = socket.getaddrinfo(*address, type=socket.SOCK_DGRAM)[0]
        # not connected: a catalog bound to every address of a host with several may answer from another one; an
        # answer is known by its MAC (signed), its node and its clock, not by where it came from
        self._sock = socket.socket(family, kind, proto)

    def beat(self, beat: Heartbeat) -> bool | None:
        """True: the catalog took the beat. False: it asks for it over Flight. None: no answer in time."""
        body: dict = {"node_id": beat.node_id, "free_bytes": beat.free_bytes, "low_space": beat.low_space,
                      "clock_ms": beat.clock_ms}
        if self._token_body is not None:
            body["token"] = self._token_body
        body["nonce"] = nonce = secrets.randbits(62)  # echoed: an answer sprayed from elsewhere matches no beat
        deadline = time.monotonic() + self.timeout
        try:
            self._sock.sendto(pack(body, self._key), self._address)
            while (left := deadline - time.monotonic()) > 0:
                self._sock.settimeout(left)
                reply = unpack(self._sock.recv(MAX_DATAGRAM))  # a late answer to an earlier beat is read and passed
                if reply is None or not signed_by(reply[0], reply[1], self._key):
                    continue
                answer = reply[2]
                if (type(answer) is dict and answer.get("node_id") == beat.node_id and answer.get("nonce") == nonce
                        and answer.get("clock_ms") == beat.clock_ms and type(answer.get("taken")) is bool):
                    catalog = answer.get("catalog_ms")
                    if answer["taken"] and type(catalog) is int and beat.clock_ms is not None:
                        self.heard = (beat.clock_ms / 1000, wall_clock(), catalog / 1000)
                    return answer["taken"]
        except OSError:  # timed out, or the network said no
            return None
        return None

    def close(self) -> None:
        """Its socket is closed (a node that stops, or follows another catalog)."""
        self._sock.close()


QUIET_SECONDS = 60
"""After three datagrams in a row go unanswered, beats go over Flight only for this long."""


class DatagramBeats:
    """A node's heartbeats in datagrams to whichever catalog leads; a catalog answering no datagram three times
    running gets beats over Flight only for :data:`QUIET_SECONDS`."""

    def __init__(self, token: str | None, timeout: float) -> None:
        self.token = token
        self.timeout = timeout
        self._sender: BeatSender | None = None
        self._misses = 0
        self._quiet_until = 0.0

    def beat(self, uri: str | None, beat: Heartbeat) -> bool:
        """Whether the catalog at ``uri`` took ``beat``; False: send it over Flight."""
        if uri is None or not udp_heartbeats_enabled() or time.monotonic() < self._quiet_until:
            return False
        if self._sender is None or self._sender.uri != uri:
            self.close()
            try:
                self._sender = BeatSender(uri, self.token, self.timeout)
            except (ValueError, OSError) as exc:
                log.debug("heartbeats over Flight only: %s", exc)
                self._quiet_until = time.monotonic() + QUIET_SECONDS
                return False
        self._sender.heard = None
        taken = self._sender.beat(beat)
        if taken is not None:
            self._misses = 0
            return taken
        self._misses += 1
        if self._misses >= 3:
            log.info("the catalog %s answered no heartbeat over UDP three times running: sending them over Flight "
                     "for %d s", uri, QUIET_SECONDS)
            self._quiet_until = time.monotonic() + QUIET_SECONDS
            self._misses = 0
            self.close()
        return False

    @property
    def heard(self) -> tuple[float, float, float] | None:
        """The catalog's clock as the answer to the last beat told it (see :attr:`BeatSender.heard`), or None."""
        return self._sender.heard if self._sender is not None else None

    def close(self) -> None:
        """Its socket is closed; the next beat makes one again."""
        if self._sender is not None:
            self._sender.close()
            self._sender = None


class BeatListener:
    """A catalog's side: one thread answering datagrams on ``(host, port)``; ``take`` notes a plain beat (True) or
    declines it (False: the node must send it over Flight)."""

    def __init__(self, host: str, port: int, secret: bytes | None, knows: Callable[[str], bool],
                 take: Callable[[Heartbeat], bool]) -> None:
        self.secret = secret
        self.knows = knows
        self.take = take
        self.taken = 0
        self.declined = 0
        self.ignored = 0  # not a beat, not from a node the catalog knows, or not signed as its node's
        self._complained = 0.0
        self._keys: dict[str, tuple[str, bytes]] = {}  # per node, the token body last checked and its key
        family, kind, proto, _name, sockaddr = socket.getaddrinfo(host or None, port, type=socket.SOCK_DGRAM,
                                                                  flags=socket.AI_PASSIVE)[0]
        self._sock = socket.socket(family, kind, proto)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # a burst of beats waits, not lost
            self._sock.bind(sockaddr)
        except OSError:
            self._sock.close()
            raise
        self._thread = threading.Thread(target=self._serve, name="flightpart-udp-heartbeats", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                datagram, peer = self._sock.recvfrom(MAX_DATAGRAM + 1)
            except OSError:
                return  # closed
            if peer is None:
                return  # shut down (close() wakes the read so)
            try:
                reply = self.answer(datagram)
                if reply is not None:
                    self._sock.sendto(reply, peer)
            except OSError as exc:
                log.debug("a heartbeat's answer to %s was not sent: %s", peer, exc)
            except Exception:  # a fault here must not stop liveness: the beat goes unanswered, and over Flight
                self.ignored += 1
                if time.monotonic() - self._complained > 60:  # whoever sends such datagrams does not fill the log
                    self._complained = time.monotonic()
                    log.exception("a heartbeat datagram from %s could not be handled (logged once a minute)", peer)

    def answer(self, datagram: bytes) -> bytes | None:
        """The reply to one datagram, None when it deserves none (not a signed beat of a known node)."""
        unpacked = unpack(datagram)
        if unpacked is None or type(unpacked[2]) is not dict:
            self.ignored += 1
            return None
        mac, raw, body = unpacked
        token, nonce = body.pop("token", None), body.pop("nonce", None)
        beat = Heartbeat.from_plain(body)
        # an unknown id is refused before any key is made: made-up ids cost a set lookup and keep nothing
        if beat is None or beat.clock_ms is None or type(nonce) is not int or not self.knows(beat.node_id):
            self.ignored += 1
            return None
        key = self._key(token, beat.node_id) if self.secret is not None else None
        if (self.secret is not None and key is None) or not signed_by(mac, raw, key):
            self.ignored += 1
            return None
        if key is not None:
            self._keys[beat.node_id] = (token, key)  # checked: this node's key, not recomputed on its next beat
        taken = self.take(beat)
        if taken:
            self.taken += 1
        else:
            self.declined += 1
        answer = {"node_id": beat.node_id, "clock_ms": beat.clock_ms, "nonce": nonce, "taken": taken}
        if taken:  # the catalog's clock, by which the node judges expiry (an earlier release's node reads past it)
            answer["catalog_ms"] = int(wall_clock() * 1000)
        return pack(answer, key)

    def _key(self, token: Any, node_id: str) -> bytes | None:
        """The key a beat of ``node_id`` carrying ``token`` must be signed with; None without a valid token of it."""
        if type(token) is not str or not is_node_token_body(token, node_id, wall_clock(), CLOCK_MARGIN):
            return None
        known = self._keys.get(node_id)
        if known is not None and known[0] == token:
            return known[1]
        return token_signature(self.secret, token)  # type: ignore[arg-type]  # only called with a secret

    @property
    def port(self) -> int:
        """The port it listens on (the Flight port's number; the OS's choice when asked for 0)."""
        return self._sock.getsockname()[1]

    def close(self) -> None:
        """Stop listening and free the port."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(timeout=5)
        self._sock.close()

    def counts(self) -> dict[str, int]:
        """Its counters, for the catalog's stats and metrics."""
        return {"udp_heartbeats_taken": self.taken, "udp_heartbeats_declined": self.declined,
                "udp_datagrams_ignored": self.ignored}
