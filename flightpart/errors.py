"""The exceptions flightpart raises, each with a stable code.

Catch ``FlightpartError`` for anything of ours, or a subclass; each also derives from the builtin a Python user
would expect (``ValueError``, ``LookupError``, ``ConnectionError``, ``PermissionError``). Servers send an error as
its ``code`` and ``field`` (:func:`flightpart.wire.encode_error`); clients map the code back through
:data:`BY_CODE`, never by reading the message.
"""

from __future__ import annotations

import re

QUOTED_CHARS = 200
"""Characters of one unbroken run (a name, a literal, a type URL a client sent) an error's message keeps."""
MESSAGE_CHARS = 1024
"""Characters an error's message keeps in all: its start and its end (which says what to do)."""
_LONG_RUN = re.compile(r"\S{" + str(QUOTED_CHARS + 1) + ",}")


def bounded(message: str) -> str:
    """``message`` as an error carries it: each run of more than :data:`QUOTED_CHARS` non-blank characters cut to that
    many and an ellipsis, then its middle left out past :data:`MESSAGE_CHARS`, so no error echoes back more than a
    small part of what a client sent. Idempotent."""
    message = _LONG_RUN.sub(lambda run: run.group()[:QUOTED_CHARS] + "…", message)
    if len(message) <= MESSAGE_CHARS:
        return message
    gap = f" … ({len(message):,} characters; the middle left out) … "
    tail = MESSAGE_CHARS // 4
    return message[:MESSAGE_CHARS - tail - len(gap)] + gap + message[len(message) - tail:]


class FlightpartError(Exception):
    """Base class of every error flightpart raises on purpose. ``field`` names the part of a request it is about (e.g.
    ``ticket.version``) or is None; message and field are kept :func:`bounded`."""

    code = "ERROR"
    retryable = False

    def __init__(self, message: str = "", *, field: str | None = None):
        super().__init__(bounded(message) if isinstance(message, str) else message)
        self.field = field[:QUOTED_CHARS] + "…" if isinstance(field, str) and len(field) > QUOTED_CHARS else field

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class PartitionedError(FlightpartError, ValueError):
    """A ``__partitioned__`` (or ``__distarray__``) dict breaks the spec; the message names the offending field."""

    code = "INVALID_PARTITIONED"


class RequestRejected(FlightpartError, ValueError):
    """A request does not follow the wire format; the message and ``field`` say how."""

    code = "INVALID_REQUEST"


class InvalidName(RequestRejected):
    """A dataset name outside ``[A-Za-z0-9][A-Za-z0-9_.-]{0,127}``."""

    code = "INVALID_NAME"


class InvalidFilter(RequestRejected):
    """A filter that cannot be translated exactly, refused rather than evaluated to a different answer; the message
    names the part and what works."""

    code = "INVALID_FILTER"


class InvalidExpression(RequestRejected):
    """A computed column that cannot be evaluated exactly as DuckDB would, refused rather than computed differently."""

    code = "INVALID_EXPRESSION"


class SchemaMismatch(FlightpartError, ValueError):
    """Data sent for a partition does not fit the dataset's schema or shape."""

    code = "SCHEMA_MISMATCH"


class LimitExceeded(RequestRejected):
    """A request asks for more than a server's configured limit (partition bytes, body size)."""

    code = "LIMIT_EXCEEDED"


class VersionConflict(FlightpartError, ValueError):
    """A write into a version that is already committed (versions are immutable)."""

    code = "VERSION_CONFLICT"


class VersionExpired(FlightpartError, TimeoutError):
    """A write into a version aborted while being written (its put outlived ``--pending-ttl``, or was abandoned).
    Nothing of it is kept; write the data again as a new version."""

    code = "VERSION_EXPIRED"


class QueryTimeout(FlightpartError, TimeoutError):
    """A query ran longer than the catalog lets one run and was stopped; it changed nothing."""

    code = "QUERY_TIMEOUT"


class StorageFull(FlightpartError, OSError):
    """A node's disk has no room for the partition; it keeps serving what it holds."""

    code = "STORAGE_FULL"


class ForeignCluster(FlightpartError, PermissionError):
    """An order from a catalog of another cluster (or a node of another cluster registering)."""

    code = "FOREIGN_CLUSTER"


class NodeConflict(FlightpartError, ValueError):
    """A node id that another live process already serves (e.g. a copied data directory)."""

    code = "NODE_CONFLICT"


class DatasetNotFound(FlightpartError, LookupError):
    """No committed dataset (or version) of that name exists in the catalog."""

    code = "DATASET_NOT_FOUND"


class PartitionMissing(FlightpartError, LookupError):
    """A node does not hold the partition asked for; another replica may."""

    code = "PARTITION_MISSING"
    retryable = True


class PartitionDamaged(PartitionMissing):
    """A node's copy of the partition failed its checksum and was moved aside; another replica may serve it. A
    :class:`PartitionMissing` to a reader; its own code tells an operator the disk lost it."""

    code = "PARTITION_DAMAGED"
    retryable = True


class StorageUnwritable(FlightpartError, OSError):
    """A node's data disk refused a write (read-only, I/O error); nothing of the refused put is kept."""

    code = "STORAGE_UNWRITABLE"


class NodeUnavailable(FlightpartError, ConnectionError):
    """No replica of a partition could be reached, or no node is alive."""

    code = "UNAVAILABLE"
    retryable = True


class OutcomeUnknown(NodeUnavailable):
    """A commit got no answer while the client waited: the version is published whole or not at all; look with
    ``versions`` once the catalog is back."""

    code = "OUTCOME_UNKNOWN"


class ServerBusy(NodeUnavailable):
    """A server is at its limit of open streams; retry shortly (another replica first)."""

    code = "BUSY"


class ServerStarting(ServerBusy):
    """A daemon is still starting (its state is not built yet); retry shortly."""

    code = "STARTING"


class NotLeader(NodeUnavailable):
    """A catalog that does not lead refused a call; nothing was done. ``field`` is the leader's address when known."""

    code = "NOT_LEADER"


class StateUnavailable(NodeUnavailable):
    """The catalog's state database does not answer: opens work from what it read last; writes are refused with this
    code and can be retried once it is back."""

    code = "STATE_UNAVAILABLE"


class StaleEpoch(FlightpartError, PermissionError):
    """A node refused an order whose epoch is lower than the highest it has seen (its catalog no longer leads); nothing
    was changed."""

    code = "STALE_EPOCH"


class Unauthenticated(FlightpartError, PermissionError):
    """A call without a valid credential for the cluster."""

    code = "UNAUTHENTICATED"


class Forbidden(FlightpartError, PermissionError):
    """A valid credential whose role (or capability) does not allow the call."""

    code = "FORBIDDEN"


class UserNotFound(FlightpartError, LookupError):
    """A user (or a group's member) the catalog does not know."""

    code = "USER_NOT_FOUND"


class ServerError(FlightpartError, RuntimeError):
    """A server failed on a request it should have handled; its log has the details. Retryable: another replica may
    serve it."""

    code = "INTERNAL"
    retryable = True


class ClientClosed(FlightpartError, RuntimeError):
    """A method of a closed :class:`flightpart.client.Client` was called."""

    code = "CLIENT_CLOSED"


class CannotStart(FlightpartError, RuntimeError):
    """A daemon could not start (port taken, an address not this machine's, told to join itself)."""

    code = "CANNOT_START"


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


BY_CODE: dict[str, type[FlightpartError]] = {
    cls.code: cls for cls in [FlightpartError, *_all_subclasses(FlightpartError)]
}
"""Every error code and the class a client raises for it."""


def error_for(code: str, message: str, field: str | None = None) -> FlightpartError:
    """The exception for a code received from a server (:class:`ServerError` for a code we do not know)."""
    cls = BY_CODE.get(code, ServerError)
    return cls(message, field=field)


__all__ = [cls.__name__ for cls in BY_CODE.values()] + ["BY_CODE", "error_for"]
