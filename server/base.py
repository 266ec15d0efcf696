"""What both daemons share: the Flight server with guard, action table and error boundary.

Every RPC runs inside :func:`boundary`, so a client always receives a Flight error whose message is one line
and whose ``extra_info`` carries the stable code (:func:`flightpart.wire.encode_error`). Anything unexpected is
logged with its traceback and reaches the client only as ``INTERNAL``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import (
    DatasetNotFound,
    FlightpartError,
    LimitExceeded,
    NodeUnavailable,
    RequestRejected,
    ServerBusy,
    ServerError,
    ServerStarting,
    Unauthenticated,
)
from flightpart.io.errors import translate
from flightpart.wire import Message, encode_error, error_message, error_with_code

from .auth import GuardFactory, authorize, credential_of, guard_of
from .telemetry import Call, Telemetry, begin, end


class Untraced(type):
    """The type of an exception whose traceback pyarrow leaves out of the status it sends: the type refuses to
    give its ``__module__`` (see :mod:`flightpart.sql.statuses`)."""

    @property
    def __module__(cls) -> str:  # type: ignore[override]
        raise AttributeError("flightpart sends this error without a traceback")


InvalidArgument: Any = Untraced("flightpart", (pa.ArrowInvalid,), {"__doc__": "INVALID_ARGUMENT, no traceback."})
NotFound: Any = Untraced("flightpart", (pa.ArrowKeyError,), {"__doc__": "NOT_FOUND, no traceback."})
UntracedUnknown: Any = Untraced("flightpart", (Exception,), {"__doc__": "UNKNOWN, no traceback (GetSchema's errors)."})


def schema_error(exc: FlightpartError) -> Exception:
    """What ``GetSchema`` raises for an error of ours: pyarrow sends no ``extra_info`` there, so NOT_FOUND,
    INVALID_ARGUMENT or UNKNOWN, without a traceback and with the code ending the message
    (:func:`~flightpart.wire.error_with_code`)."""
    if isinstance(exc, DatasetNotFound):
        return NotFound(error_with_code(exc))
    if isinstance(exc, RequestRejected) and not isinstance(exc, LimitExceeded):
        return InvalidArgument(error_with_code(exc))
    return UntracedUnknown(error_with_code(exc))


def flight_error(exc: FlightpartError) -> flight.FlightError:
    """The Flight error a client receives for one of ours: status by kind, code in ``extra_info``."""
    if isinstance(exc, Unauthenticated):
        cls = flight.FlightUnauthenticatedError
    elif isinstance(exc, (ServerBusy, NodeUnavailable)):
        cls = flight.FlightUnavailableError
    elif isinstance(exc, ServerError):
        cls = flight.FlightInternalError
    else:
        cls = flight.FlightServerError
    return cls(exc.message, extra_info=encode_error(exc))


class boundary:
    """Turn whatever a handler raises into a Flight error with a code; time the call in ``telemetry`` and count
    refusals by code. ``sent_as``: the error a client receives for one of ours; ``counted``: told of every
    exception first. ``with`` gives the :class:`~.telemetry.Call`. A class, not a generator: every RPC enters one."""

    __slots__ = ("log", "what", "telemetry", "context", "sent_as", "counted", "call", "previous")

    def __init__(self, log: logging.Logger, what: str, telemetry: Telemetry, context: Any,
                 sent_as: Callable[[FlightpartError], Exception] = flight_error,
                 counted: Callable[[BaseException], None] | None = None) -> None:
        self.log = log
        self.what = what
        self.telemetry = telemetry
        self.context = context
        self.sent_as = sent_as
        self.counted = counted

    def __enter__(self) -> Call:
        self.call, self.previous = begin(self.what, self.context)
        return self.call

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        call = self.call
        try:
            if exc is not None:
                if self.counted is not None:
                    try:
                        self.counted(exc)
                    except Exception:  # counting must not change what the client receives for the error itself
                        self.log.exception("%s: counting its error failed", self.what)
                sent = self._sent(exc)
                if sent is not None:
                    raise sent from None
        finally:
            end(self.previous)
            guard = self.context.get_middleware("guard") if self.context is not None else None
            if guard is not None and guard.stream and call.outcome == "ok":
                guard.finish_with(self.telemetry, call)  # a stream: timed until it is complete
            else:
                self.telemetry.finish(call)
        return False

    def _sent(self, exc: BaseException) -> Exception | None:
        """What the client receives for ``exc`` (None: it goes on as it is, e.g. KeyboardInterrupt)."""
        what, call = self.what, self.call
        if isinstance(exc, FlightpartError):
            self.log.info("%s refused: %s %s", what, exc.code, exc.message)
            call.outcome = exc.code
            self.telemetry.refused(exc.code.lower())
            return self.sent_as(exc)
        if isinstance(exc, (flight.FlightError, ConnectionError)):  # a call this server made to a peer
            peer = translate(exc)
            self.log.warning("%s: a peer refused or did not answer: %s %s", what, peer.code, peer.message)
            if isinstance(peer, (NodeUnavailable, ServerError)):
                peer = NodeUnavailable(f"{what}: a peer did not answer ({error_message(exc)})")
            call.outcome = f"peer {peer.code}"
            return self.sent_as(peer)
        if isinstance(exc, Exception):
            self.log.error("%s failed", what, exc_info=exc)
            call.outcome = "INTERNAL"
            return self.sent_as(ServerError(f"{what} failed on the server; its log has the details"))
        return None


RPC_METHODS = ("do_action", "do_get", "do_put", "do_exchange", "list_flights", "get_flight_info", "get_schema",
               "list_actions")
"""The methods gRPC calls on a Flight server: each waits until the server is built
(:meth:`ServiceBase.__init_subclass__`)."""


def when_ready(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (an RPC) run once its server is built; it waits up to :attr:`ServiceBase.startup_grace` seconds,
    then is refused with ``STARTING`` (retryable)."""

    @functools.wraps(method)
    def guarded(self: ServiceBase, context: Any, *args: Any) -> Any:
        built = self.__dict__.get("_built")
        if built is None or not (built.is_set() or built.wait(self.startup_grace)):
            # the subclass's attributes may not exist yet: nothing of it may run, not even its telemetry
            raise sent(ServerStarting(f"this flightpart {self.role} is still starting; retry in a moment"))
        refused = self.refusal(method.__name__, args)
        if refused is not None:
            self.telemetry.refused(refused.code.lower())
            raise sent(refused)
        return method(self, context, *args)

    def sent(refused: FlightpartError) -> Exception:
        return schema_error(refused) if method.__name__ == "get_schema" else flight_error(refused)

    guarded.__wrapped_rpc__ = True  # type: ignore[attr-defined]
    return guarded


def built_after(init: Callable[..., None]) -> Callable[..., None]:
    """A daemon's ``__init__`` that marks the server built once the outermost ``__init__`` has returned.

    pyarrow serves from inside its own ``__init__``, so until this mark every
    RPC waits (:func:`when_ready`); a server whose construction fails stops.
    """

    @functools.wraps(init)
    def building(self: ServiceBase, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except BaseException:
            if self.__dict__.get("_listening"):  # the port was opened: close it, the object will never be complete
                with contextlib.suppress(Exception):
                    flight.FlightServerBase.shutdown(self)
            raise
        if type(self).__init__ is building:
            self._built.set()

    return building


@dataclass(frozen=True)
class Action:
    """One entry of a daemon's action table: its request message, handler, description and permission."""

    request: type[Message]
    handler: Callable[[Any, Any], Message]
    doc: str
    permission: str = "read"
    changes_state: bool = True


def action_table(*entries: Action) -> dict[str, Action]:
    """A daemon's actions by name, the name read from each request message (spelled nowhere else)."""
    table: dict[str, Action] = {}
    for entry in entries:
        name = entry.request.ACTION
        if not name or entry.request.REPLY is None:
            raise TypeError(f"{entry.request.__name__} names no action or no reply: it cannot be served")
        if name in table:
            raise TypeError(f"two handlers for the action {name!r}")
        table[name] = entry
    return table


class ServiceBase(flight.FlightServerBase):
    """A Flight server with a credential guard, a stream limit and an action table.

    Subclasses fill :attr:`actions` and may override :meth:`after_action`.
    """

    actions: ClassVar[dict[str, Action]] = {}
    role: ClassVar[str] = "daemon"
    streams_timed: ClassVar[bool] = False
    wrong_daemon_hint: ClassVar[str] = ""
    """Added to an unknown action's refusal: what the caller probably meant to reach instead."""
    log: ClassVar[logging.Logger] = logging.getLogger("flightpart")
    startup_grace: ClassVar[float] = 2.0
    """Seconds a call that arrives while the daemon is being built waits before it is refused with ``STARTING``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every daemon class waits to be built before it answers: its RPCs and its ``__init__`` are wrapped."""
        super().__init_subclass__(**kwargs)
        for name in RPC_METHODS:
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "__wrapped_rpc__", False):
                setattr(cls, name, when_ready(method))
        if "__init__" in cls.__dict__:
            cls.__init__ = built_after(cls.__dict__["__init__"])  # type: ignore[misc]

    def __init__(self, host: str, port: int, *, secret: bytes | None = None, max_streams: int | None = None,
                 advertise: str | None = None, stream_idle_timeout: float | None = None, **server_kwargs: Any):
        self._built = threading.Event()  # set when the outermost __init__ returns (built_after); RPCs wait for it
        scheme = "grpc+tls" if server_kwargs.get("tls_certificates") else "grpc"
        self.secret = secret
        self.caller = threading.local()  # the credential of the action being handled, for handlers that check who
        self.telemetry = Telemetry()
        self.guard = GuardFactory(secret, max_streams, self.telemetry, stream_idle_timeout)
        # with nothing to check or count, no middleware: it costs two calls into Python per request
        # (a third of a heartbeat's CPU at 2,000 a second); credential_of() then answers the owner.
        # A node always has it: it times streams until they complete.
        middleware = ({"guard": self.guard} if secret is not None or max_streams is not None or self.streams_timed
                      else {})
        super().__init__(f"{scheme}://{host}:{port}", middleware=middleware, **server_kwargs)
        self._listening = True  # from here a failed construction must close the port (built_after)
        self.uri = f"{scheme}://{advertise or host}:{self.port}"

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [(name, entry.doc) for name, entry in sorted(self.actions.items())]

    def do_action(self, context: Any, action: flight.Action) -> list[flight.Result]:
        with boundary(self.log, f"action {action.type!r:.60}", self.telemetry, context):
            entry = self.actions.get(action.type)
            if entry is None:
                raise RequestRejected(f"unknown action {action.type!r:.60}: {self.uri} is a flightpart {self.role}, "
                                      f"which knows {sorted(self.actions)}" + self.wrong_daemon_hint, field="action")
            authorize(context, entry.permission)
            self.caller.credential = credential_of(context)
            self.caller.guard = guard_of(context)
            body = entry.request.decode(action.body.to_pybytes() if action.body is not None else b"")
            reply = entry.handler(self, body)
            if not isinstance(reply, entry.request.REPLY):  # type: ignore[arg-type]
                raise TypeError(f"the {action.type} handler answered {type(reply).__name__}, not {entry.request.REPLY}")
            if entry.changes_state:
                self.after_action(action.type)
            encoded = reply.encode()  # inside the boundary: a reply that cannot be encoded is INTERNAL, no traceback
        return [flight.Result(pa.py_buffer(encoded))]

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[flight.FlightInfo]:
        with boundary(self.log, "list_flights", self.telemetry, context):
            raise RequestRejected(f"{self.uri} is a flightpart {self.role}: it lists no datasets"
                                  + self.wrong_daemon_hint, field="service")
        yield  # pragma: no cover - a generator, as Flight expects

    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        with boundary(self.log, "get_flight_info", self.telemetry, context):
            raise RequestRejected(f"{self.uri} is a flightpart {self.role}: it describes no datasets"
                                  + self.wrong_daemon_hint, field="service")

    def get_schema(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        with boundary(self.log, "get_schema", self.telemetry, context, schema_error):
            raise RequestRejected(f"{self.uri} is a flightpart {self.role}: it describes no datasets"
                                  + self.wrong_daemon_hint, field="service")

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        with boundary(self.log, "do_get", self.telemetry, context):
            raise RequestRejected(f"{self.uri} is a flightpart {self.role}: it sends no rows; a dataset's rows come "
                                  "from its nodes, at the endpoints of its FlightInfo", field="service")

    def do_put(self, context: Any, descriptor: flight.FlightDescriptor, reader: Any, writer: Any) -> None:
        with boundary(self.log, "do_put", self.telemetry, context):
            raise RequestRejected(f"{self.uri} is a flightpart {self.role}: it stores no rows; put a dataset through "
                                  "a client (fp.connect(catalog).put)", field="service")

    def do_exchange(self, context: Any, descriptor: flight.FlightDescriptor, reader: Any, writer: Any) -> None:
        with boundary(self.log, "do_exchange", self.telemetry, context):
            raise RequestRejected(f"{self.uri} is a flightpart {self.role}: it answers no DoExchange", field="service")

    def refusal(self, rpc: str, args: tuple) -> FlightpartError | None:
        """Why this daemon refuses every call now, before its handler runs (None: it serves)."""
        return None

    def problems(self) -> list[str]:
        """Why this daemon should get no new work (empty: SERVING); each daemon says what it checks."""
        return []

    def healthy(self) -> bool:
        """SERVING for health probes: no problems."""
        return not self.problems()

    def after_action(self, name: str) -> None:
        """Called after an action that may change state (e.g. to drop caches)."""

    @property
    def built(self) -> bool:
        """True once the daemon is fully built and answers calls (until then they wait or get ``STARTING``)."""
        return self._built.is_set()


for _name in RPC_METHODS:  # ServiceBase's own RPCs, like its subclasses' (see __init_subclass__)
    if _name in ServiceBase.__dict__:
        setattr(ServiceBase, _name, when_ready(ServiceBase.__dict__[_name]))
ServiceBase.__init__ = built_after(ServiceBase.__init__)  # type: ignore[method-assign]
