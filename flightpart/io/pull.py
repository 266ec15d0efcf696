"""Reading one partition (or a slice of it) from the first replica that serves it, for ``get`` and for nodes that
assemble partitions from others, so both fail over, leave frozen servers and back off from busy ones alike."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import Forbidden, NodeUnavailable, RequestRejected, ServerBusy, ServerError, Unauthenticated
from flightpart.query.catalog_columns import CatalogColumns
from flightpart.query.soundness import unsound
from flightpart.wire import GetNodeInfo, PartHeader, PartRun, Replica, Ticket, error_message

from .compression import RATES
from .connections import ConnectionPool
from .errors import translate
from .transfer import BUSY_PATIENCE, TRAFFIC, chunks, read_whole
from .wakes import thread_wakes, visible
from .workers import run_in_worker

IDLE_TIMEOUT = 2.0
"""Seconds a stream may send nothing before the next replica is asked (or, on the last replica, the node is
asked whether it is alive: a busy node that answers is waited for, a frozen one is left)."""
PROBE_TIMEOUT = 5.0
"""Seconds the last replica of a stalled stream has to answer ``node-info`` to show it is alive, only busy."""
CLOCK_HINT = ("the token or its capability expired, or the nodes' clocks disagree with the catalog's by more "
              "than the margin (see docs/operations/security.md, 'Clocks'); open the dataset again with a valid token")
STREAM_DEADLINE = 3600.0
"""Deadline of one read stream: what ends a call stuck on a frozen server."""
STALL_PATIENCE = 300.0
"""Seconds the last replica's stream may send nothing while its node answers ``node-info`` (a busy node, computing a
filter or an aggregate over a large partition before its first batch) before the reader gives up on it: a node that
answers but whose stream never moves (wedged, or lying about being busy) holds a reader five minutes, not until the
stream's deadline."""

MIN_READ_RATE = 1 << 20
"""Bytes a second below which a stream of whole partitions from a replica that is not the last is left for the next
one (past :data:`READ_GRACE`): a node that trickles, a message within each idle timeout, had held a reader until the
stream's deadline, an hour, per replica. 8 Mbit/s is far below any link a cluster runs on, so only a failing or
hostile node is left; the last replica is read at whatever pace it keeps."""
READ_GRACE = 30.0
"""Seconds a stream is given before its pace is held to :data:`MIN_READ_RATE` (a node opening its files, a queue)."""


SMALL_READ_BYTES = 1 << 20
"""The most a stream read in the caller's thread is expected to carry (:func:`is_quick`). Larger reads keep their
reused worker: the caller may be a fresh thread (a pool of a multi-partition read), whose own malloc arena would
fault a large read's buffers in anew (the whole-dataset read of 3 x 315 MB measured 20 % slower so)."""
LONE_READ_BYTES = 32 << 20
"""The most a lone stream (the one partition a call reads: ``get`` of one handle, a Dask or Ray task's read, a
streamed read's piece) is expected to carry to be read in the thread that made the call, where its links are measured
to carry it in an eighth of the idle timeout. That thread is the caller's own, or a stream's prefetch thread, which
lives for the stream; not a multi-partition read's fresh pool thread (see :data:`SMALL_READ_BYTES`). Handing a 16 MiB
read to the worker and watching it had cost 0.5 ms of its 7 ms (cold caches: a thread woken, a watchdog's loop), a
tenth of the gap to raw Flight's read."""


EMPTY_MESSAGES = 100_000
"""Messages without rows a bounded stream may carry (:func:`read_bounded`): a node's filter sends at most one empty
batch per stored batch, and a shared stream a metadata message per partition; a node sending them without end is
left, as one sending rows past the bound is."""


WAKES_VISIBLE = visible()
"""Whether a stream can be read whole and watched by its thread's wakes (see :func:`stream`)."""


class Stalled(Exception):
    """A stream that sent nothing for the idle timeout (node silent) or :data:`STALL_PATIENCE`, or too ``slow``ly."""

    def __init__(self, message: str, *, slow: bool = False):
        super().__init__(message)
        self.slow = slow  # the node answers, only slowly: its connection, which other streams share, is kept


class Unsound(Exception):
    """A stream unsafe to read, or whose rows or columns are not the catalog's: its replica is faulty."""


BYTES_SLACK = 16 << 20
"""What a stream of whole partitions may carry past a quarter more than their stored bytes (:class:`RowBound`):
buffers padded per batch, framing, a last batch in flight."""
ROW_NUMBER_BYTES = 8
"""Bytes a row may carry past its partition's: a row-number column a ticket asks for (int64)."""


@dataclass(frozen=True)
class RowBound:
    """The most a stream may carry (decision 0004); it is left at its first batch past the bound.

    ``exact``: exactly ``rows`` rows, else at most. ``bytes``: a quarter more than the values, 8 a row and
    :data:`BYTES_SLACK` (None: no bound). ``sized``: whole partitions, so a stream far slower than
    :data:`MIN_READ_RATE` is left.
    """

    rows: int
    exact: bool = True
    bytes: int | None = None
    sized: bool = False

    @classmethod
    def of(cls, expected_rows: int | None, most_rows: int | None, expected_bytes: int = 0,
           most_bytes: int = 0) -> RowBound | None:
        """The bound of a stream of ``expected_rows`` (or at most ``most_rows``) rows holding ``expected_bytes`` stored,
        or at most ``most_bytes`` of values (0: not known)."""
        rows = expected_rows if expected_rows is not None else most_rows
        values = expected_bytes if expected_bytes > 0 else most_bytes
        bound = None if values <= 0 or rows is None else values + values // 4 + ROW_NUMBER_BYTES * rows + BYTES_SLACK
        if expected_rows is not None:
            return cls(expected_rows, bytes=bound, sized=bound is not None and expected_bytes > 0)
        if most_rows is not None:
            return cls(most_rows, exact=False, bytes=bound, sized=bound is not None and expected_bytes > 0)
        return None

    def too_large(self) -> Unsound:
        held = "the catalog says they hold" if self.sized else "the values it could keep of them hold"
        return Unsound(f"more than the {self.bytes:,} bytes its partitions may carry (a quarter more than {held}, "
                       "8 a row and 16 MiB); the stream was left there")

    def passed(self) -> Unsound:
        if self.rows == 1 and not self.exact:  # an aggregate without keys: one row, whatever the partition holds
            return Unsound("more than one row, the most its ticket can give; the stream was left there")
        said = "the catalog says" if self.exact else "the catalog says the partition holds"
        return Unsound(f"more than the {self.rows:,} rows {said}; the stream was left there")


@dataclass(frozen=True)
class Expected:
    """What a node's answer may hold, as the catalog says: exactly ``rows`` rows, or at most ``most_rows`` (None: not
    known); ``bytes`` stored, or at most ``most_bytes`` of values (0: not known); ``columns`` labelled as the
    catalog's. A stream past the bound is left (:class:`RowBound`); one that differs is :class:`Unsound`."""

    rows: int | None = None
    most_rows: int | None = None
    bytes: int = 0
    most_bytes: int = 0
    columns: CatalogColumns | None = None

    def bound(self) -> RowBound | None:
        return RowBound.of(self.rows, self.most_rows, self.bytes, self.most_bytes)


@dataclass(frozen=True)
class ReadOptions:
    """How a read goes: ``idle_timeout`` before the next replica is asked, the ``compression`` asked for (``auto``:
    as the link's measured rate says), the addresses ``here`` that count as this host, the ``deadline``
    (``time.monotonic()``; None: none) past which nothing runs, and ``quick_bytes`` (:func:`is_quick`)."""

    idle_timeout: float = IDLE_TIMEOUT
    compression: str = "auto"
    here: frozenset[str] = frozenset()
    deadline: float | None = None
    quick_bytes: int = SMALL_READ_BYTES


def read_replicas(pool: ConnectionPool, ticket: Ticket, replicas: Sequence[Replica], what: str,
                  expected: Expected = Expected(), how: ReadOptions = ReadOptions(), *,
                  marks: list[tuple[int, bytes]] | None = None) -> pa.Table:
    """``ticket`` streamed from the first of ``replicas`` that answers; ``what`` names the partition in errors.

    A replica that is unreachable, stalls, refuses the credential, lacks the partition, fails or sends an
    :class:`Unsound` stream hands over to the next; the last is waited for while its node answers. When all are
    busy, the round is retried with backoff for up to :data:`BUSY_PATIENCE`. Raises the credential refusal when all
    refused it, other refusals at once, ServerError when none served. Nothing runs past ``how.deadline``, so a
    node's pull never outlives its order. ``expected`` bounds and checks the stream; ``how`` picks the codec and
    chooses a quick read (:func:`is_quick`); ``marks`` collects the batches' metadata.
    """
    deadline = how.deadline
    failures: list[str] = []
    lied = False
    give_up = time.monotonic() + BUSY_PATIENCE if deadline is None else min(time.monotonic() + BUSY_PATIENCE, deadline)
    delay = 0.05
    while True:
        busy = False
        refusals: list[Unauthenticated | Forbidden] = []
        for k, (uri, ip, _pid) in enumerate(replicas):
            if deadline is not None and time.monotonic() >= deadline:
                failures.append(f"{uri}: not asked, the deadline passed")
                continue
            try:
                if marks is not None:
                    marks.clear()  # only the answering replica's
                codec = RATES.codec_for(how.compression, uri, ip, how.here)
                asked = ticket if codec == ticket.compression else replace(ticket, compression=codec)
                return _measured(pool, uri, asked, expected, how, patient=k == len(replicas) - 1, marks=marks,
                                 quick=marks is None and is_quick(expected.bytes, uri, how.idle_timeout,
                                                                  how.quick_bytes))
            except Stalled as exc:
                if not exc.slow:
                    pool.discard(uri)
                failures.append(f"{uri}: {exc}")
            except Unsound as exc:
                lied = True
                failures.append(f"{uri}: sent rows that cannot be used ({exc})")
            except (pa.ArrowException, ConnectionError, OSError) as exc:
                error = translate(exc)
                if isinstance(error, (Unauthenticated, Forbidden)):
                    refusals.append(error)
                elif not error.retryable:
                    raise error from exc
                elif isinstance(error, ServerBusy):
                    busy = True
                elif isinstance(error, NodeUnavailable):
                    pool.discard(uri)
                failures.append(f"{uri}: {error_message(exc)}")
        if refusals and len(refusals) == len(replicas):
            raise _refusal(what, refusals[0])
        if not busy or time.monotonic() + delay > give_up:
            break
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 1.0)
    if lied:
        raise ServerError(f"{what}: no replica could serve it ({'; '.join(failures[-len(replicas):])})")
    raise NodeUnavailable(f"{what}: no replica could serve it "
                          f"({'; '.join(failures[-len(replicas):]) or 'no replicas are known'})")


def read_several(pool: ConnectionPool, ticket: Ticket, replicas: Sequence[Replica], what: str,
                 expected: Expected = Expected(), how: ReadOptions = ReadOptions()) -> list[pa.Table]:
    """The partitions a ticket with ``more`` names, read in one stream (as :func:`read_replicas`) and sliced back into
    one table each, in the ticket's order."""
    marks: list[tuple[int, bytes]] = []
    table = read_replicas(pool, ticket, replicas, what, expected, how, marks=marks)
    expected = [ticket.part, *(ticket.more or ())]
    sent, starts = where_parts_start(marks)
    if sent != expected or any(b < a for a, b in zip(starts, starts[1:])) or (starts and starts[-1] > table.num_rows):
        raise RequestRejected(f"{what}: the node sent partitions {sent[:5]}..., not the {len(expected)} asked for",
                              field="ticket.more")
    starts.append(table.num_rows)
    return [table.slice(starts[k], starts[k + 1] - starts[k]) for k in range(len(expected))]


def where_parts_start(marks: list[tuple[int, bytes]]) -> tuple[list[tuple[int, int]], list[int]]:
    """The partitions a stream of several carries and each one's first row, from its batch marks; nothing when a mark
    names none."""
    sent: list[tuple[int, int]] = []
    starts: list[int] = []
    try:
        for row, meta in marks:
            if meta.startswith(b'{"part":'):
                sent.append(PartHeader.decode(meta, "part header").part)
                starts.append(row)
                continue
            run = PartRun.decode(meta, "part run")
            run.check()
            for part, rows in zip(run.parts, run.rows):
                sent.append(part)
                starts.append(row)
                row += rows
    except RequestRejected:
        return [], []
    return sent, starts


def _refusal(what: str, first: Unauthenticated | Forbidden) -> Unauthenticated | Forbidden:
    """The error when every replica refused the credential."""
    hint = f": {CLOCK_HINT}" if isinstance(first, Unauthenticated) else ""
    return type(first)(f"{what}: every replica refused the credential ({first.message}){hint}", field=first.field)


def _measured(pool: ConnectionPool, uri: str, ticket: Ticket, expected: Expected, how: ReadOptions, *,
              patient: bool = False, marks: list[tuple[int, bytes]] | None = None, quick: bool = False) -> pa.Table:
    """One stream, timed for the link measurements and checked (:class:`Unsound`)."""
    RATES.started(uri)
    received = 0
    idle_timeout, deadline = how.idle_timeout, how.deadline
    expected_rows, expected_columns = expected.rows, expected.columns
    try:
        encoded = flight.Ticket(ticket.encode())
        bound = expected.bound()
        table = quick_stream(pool, uri, encoded, idle_timeout, deadline, bound) if quick else None
        if table is None:
            table = stream(pool, uri, encoded, idle_timeout, deadline, patient=patient, marks=marks, bound=bound)
        received = received_bytes(table)
        TRAFFIC.add(bytes_received=received)
        why = unsound(table)
        if why is not None:
            raise Unsound(f"arrays that cannot be read safely: {why}")
        if expected_rows is not None and table.num_rows != expected_rows:  # more were refused as they came
            raise Unsound(f"{table.num_rows:,} rows where the catalog says {expected_rows:,}")
        why = expected_columns.mislabelled(table.schema, ticket) if expected_columns is not None else None
        if why is not None:
            raise Unsound(why)
        return table
    finally:
        RATES.finished(uri, received, ticket.compression)


def received_bytes(table: pa.Table) -> int:
    """The bytes of a table read from a stream: the sum of its buffers, each a message's own."""
    return table.get_total_buffer_size()


def is_quick(expected_bytes: int, uri: str, idle_timeout: float, most_bytes: int = SMALL_READ_BYTES) -> bool:
    """Whether a stream of ``expected_bytes`` (0: unknown) from ``uri`` is small and should take an eighth of
    ``idle_timeout`` at the measured link rates (over an unmeasured link: at most :data:`SMALL_READ_BYTES`)."""
    if not 0 < expected_bytes <= max(most_bytes, SMALL_READ_BYTES):
        return False
    seconds = RATES.seconds_for(uri, expected_bytes)
    if seconds is None:
        return expected_bytes <= SMALL_READ_BYTES
    return seconds <= idle_timeout / 8


def quick_stream(pool: ConnectionPool, uri: str, ticket: flight.Ticket, idle_timeout: float,
                 deadline: float | None = None, bound: RowBound | None = None) -> pa.Table | None:
    """A quick stream (:func:`is_quick`) read in this thread with the idle timeout as its deadline (decision 0005);
    None when not done by then, and the caller reads it again watched (:func:`stream`)."""
    limit = idle_timeout if deadline is None else min(idle_timeout, deadline - time.monotonic())
    if limit <= 0:
        return None
    try:
        reader = pool.client(uri).do_get(ticket, options=pool.options(limit))
        return read_whole(reader) if bound is None else read_bounded(reader, bound)
    except flight.FlightTimedOutError:
        return None


def read_bounded(reader: flight.FlightStreamReader, bound: RowBound | None,
                 marks: list[tuple[int, bytes]] | None = None, moved: Any = None) -> pa.Table:
    """A Flight stream read batch by batch, cancelled at its first batch past ``bound`` (raising :class:`Unsound`);
    ``marks`` collects each batch's metadata and first row; ``moved()`` is called per message."""
    batches, rows, empty, taken = [], 0, 0, 0
    first_empty = None  # kept when no batch has rows: it carries a dictionary's values (an empty categorical's)
    most_bytes = bound.bytes if bound is not None else None
    for chunk in chunks(reader):
        if marks is not None and chunk.app_metadata is not None:
            marks.append((rows, chunk.app_metadata.to_pybytes()))
        data = chunk.data  # each access wraps the batch anew: once per message
        if most_bytes is not None:  # from buffer sizes alone (safe on a lying batch), its metadata's too
            meta = chunk.app_metadata
            taken += (data.get_total_buffer_size() if data is not None else 0) + (meta.size if meta is not None else 0)
            if taken > most_bytes:
                reader.cancel()
                raise bound.too_large()  # type: ignore[union-attr]
        count = data.num_rows if data is not None else 0
        if count:
            batches.append(data)
            rows += count
            if bound is not None and rows > bound.rows:
                reader.cancel()
                raise bound.passed()
        else:  # a message without rows (metadata only, or an empty batch): none is kept
            if first_empty is None and data is not None:
                first_empty = data
            empty += 1
            if bound is not None and empty > EMPTY_MESSAGES:
                reader.cancel()
                raise Unsound(f"more than {EMPTY_MESSAGES:,} messages without rows; the stream was left there")
        if moved is not None:
            moved()
    if not batches and first_empty is not None:
        batches.append(first_empty)
    return pa.Table.from_batches(batches, reader.schema)


def stream(pool: ConnectionPool, uri: str, ticket: flight.Ticket, idle_timeout: float, deadline: float | None = None, *,
           patient: bool = False, marks: list[tuple[int, bytes]] | None = None,
           bound: RowBound | None = None) -> pa.Table:
    """One ``do_get`` read in a reused worker thread and left when it sends nothing for ``idle_timeout`` seconds.

    A frozen server blocks a gRPC read without end; the worker holds the call while this thread watches, so the
    caller moves on in bounded time. ``patient`` (no replica left): a silent stream is kept while its node answers
    a cheap call, up to ``deadline`` and :data:`STALL_PATIENCE`; otherwise a ``sized`` stream slower than
    :data:`MIN_READ_RATE` is left. Without ``marks`` or ``bound`` it is read whole and watched by thread wakes
    (:mod:`.wakes`), else by :func:`read_bounded`.
    """
    call_timeout = (STREAM_DEADLINE if deadline is None
                    else max(0.001, min(STREAM_DEADLINE, deadline - time.monotonic())))
    # "last": when the stream last moved or its node last showed it is alive; "moved": when the stream last moved
    progress: dict[str, Any] = {"last": time.monotonic(), "moved": time.monotonic(), "reader": None, "abandoned": False,
                                "thread": None}
    outcome: dict[str, Any] = {}
    done = threading.Event()
    whole = marks is None and bound is None and WAKES_VISIBLE
    paced_until = None if patient or bound is None or bound.bytes is None or not bound.sized else (
        progress["moved"] + READ_GRACE + bound.bytes / MIN_READ_RATE)

    def run() -> None:
        try:
            reader = pool.client(uri).do_get(ticket, options=pool.options(call_timeout))
            progress["reader"] = reader
            if progress["abandoned"]:
                reader.cancel()
                return
            progress["last"] = progress["moved"] = time.monotonic()
            if whole:
                progress["thread"] = threading.get_native_id()
                outcome["table"] = read_whole(reader)
                return
            def moved() -> None:
                progress["last"] = progress["moved"] = time.monotonic()

            outcome["table"] = read_bounded(reader, bound, marks, moved)
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            done.set()

    run_in_worker(run)
    tick = min(0.25, idle_timeout / 4)
    wakes = None
    while not done.wait(tick):
        if progress["thread"] is not None:
            now_wakes = thread_wakes(progress["thread"])
            if now_wakes != wakes:
                wakes = now_wakes
                progress["last"] = progress["moved"] = time.monotonic()
        if paced_until is not None and time.monotonic() > paced_until:
            _abandon(progress)
            raise Stalled(f"sent less than its {bound.bytes:,} bytes in "
                          f"{READ_GRACE + bound.bytes / MIN_READ_RATE:.0f} s, slower than {MIN_READ_RATE >> 20} MiB/s",
                          slow=True)
        if time.monotonic() - progress["last"] > idle_timeout:
            if patient and (deadline is None or time.monotonic() < deadline) \
                    and time.monotonic() - progress["moved"] < STALL_PATIENCE and _answers(pool, uri, deadline):
                progress["last"] = time.monotonic()
                continue
            _abandon(progress)
            still = time.monotonic() - progress["moved"]
            raise Stalled(f"sent nothing for {idle_timeout:g} s and did not answer" if still < STALL_PATIENCE else
                          f"sent nothing for {still:.0f} s, though it answered")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["table"]


def _abandon(progress: dict[str, Any]) -> None:
    """Leave a watched stream: its worker cancels the call it makes or is about to make."""
    progress["abandoned"] = True
    if progress["reader"] is not None:
        progress["reader"].cancel()


def _answers(pool: ConnectionPool, uri: str, deadline: float | None = None) -> bool:
    """Whether ``uri`` answers ``node-info`` within :data:`PROBE_TIMEOUT` and before ``deadline`` (a refusal
    answers)."""
    timeout = PROBE_TIMEOUT if deadline is None else min(PROBE_TIMEOUT, deadline - time.monotonic())
    if timeout <= 0:
        return False
    try:
        pool.action(uri, GetNodeInfo(), timeout=timeout)
        return True
    except (pa.ArrowException, ConnectionError, OSError) as exc:
        return not isinstance(translate(exc), NodeUnavailable)
