"""Compression on the wire: asked for per read by the reader, granted per stream by the node.

Stored partitions stay uncompressed (to be mapped); only streams are compressed, and only where the link is slower
than the codec (decision 0001). The reader (:class:`LinkRates`) asks a node for ZSTD only when both links measured
slower than :data:`SLOW_LINK`, never on this host, and every :data:`PROBE_EVERY` streams goes plain to measure
again; the node (:func:`write_options`) compresses only data whose sample shrinks to :data:`WORTH` or less.
"""

from __future__ import annotations

import functools
import ipaddress
import threading
import time
from collections.abc import Callable, Collection

import pyarrow as pa
import pyarrow.ipc as ipc

from flightpart.frames import size_of
from flightpart.wire import WIRE_CODECS

MODES = ("auto", "off", *WIRE_CODECS)
"""What a reader may choose: the rule below, never, or always one codec (where the node finds it worth it)."""
AUTO_CODEC = "zstd"
"""Measured here against LZ4 on a sales-like table: 0.26 of the size against 0.46, and faster both ways."""
SLOW_LINK = 250e6
"""Bytes per second below which a link is worth compressing for (about 2 Gbit/s)."""
MIN_MEASURED = 8 << 20
"""Streams smaller than this say too little about a link to be measured."""
PROBE_EVERY = 16
"""While compressing for a node, every this-many-th stream goes uncompressed to measure the link again."""
SAMPLE_BYTES = 1 << 20
"""How much of a stream the node compresses to see whether it shrinks."""
MIN_STREAM_BYTES = 256 << 10
"""Smaller streams are sent as they are: compressing them saves less than it costs."""
WORTH = 0.85
"""A stream is compressed only when its sample shrinks to this share of its size or less."""


def check_mode(mode: str | None) -> str:
    """``mode`` as one of :data:`MODES` (None means ``"off"``), or ValueError naming the choices."""
    mode = "off" if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"compression: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


def _ipc_size(table: pa.Table, codec: str | None) -> int:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema,
                        options=ipc.IpcWriteOptions(compression=codec, use_threads=False)) as writer:
        writer.write_table(table)
    return sink.tell()


def sample_ratio(table: pa.Table, codec: str) -> float:
    """Compressed over uncompressed IPC size of about :data:`SAMPLE_BYTES` of ``table``'s first rows."""
    rows = max(1, min(table.num_rows, SAMPLE_BYTES * table.num_rows // max(size_of(table), 1)))
    sample = table.slice(0, rows)
    return _ipc_size(sample, codec) / max(_ipc_size(sample, None), 1)


PLAIN = ipc.IpcWriteOptions()
"""The options of an uncompressed stream, made once: given none, pyarrow makes them afresh for every stream, reading
two environment variables (10 microseconds of a small read)."""


def write_options(table: pa.Table, codec: str | None) -> ipc.IpcWriteOptions | None:
    """IPC options for streaming ``table`` to a reader that accepts ``codec``: compressed only where it is worth it."""
    if codec is None or size_of(table) < MIN_STREAM_BYTES or table.num_columns == 0:
        return None
    if sample_ratio(table, codec) > WORTH:
        return None
    return ipc.IpcWriteOptions(compression=codec)


@functools.lru_cache(maxsize=4096)
def is_loopback(ip: str) -> bool:
    """Whether ``ip`` is a loopback address."""
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return ip == "localhost"


class LinkRates:
    """What this process measured of each node's link (and its own, ``"*"``), and the codec it asks each for.
    A link is measured over a busy period, all its streams together; compressed streams do not measure."""

    ALL = "*"

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._rate: dict[str, float] = {}
        self._since_probe: dict[str, int] = {}
        self._busy: dict[str, list] = {}  # key -> [streams in flight, start, bytes, any compressed]

    def codec_for(self, mode: str, uri: str, ip: str, here: Collection[str]) -> str | None:
        """The codec to ask ``uri`` (at ``ip``) for under ``mode``, for a reader on the host with addresses ``here``."""
        if mode == "off" or is_loopback(ip) or ip in here:
            return None
        if mode != "auto":
            return mode
        with self._lock:
            rates = (self._rate.get(uri), self._rate.get(self.ALL))
            if any(rate is None or rate >= SLOW_LINK for rate in rates):
                return None
            count = self._since_probe.get(uri, 0) + 1
            self._since_probe[uri] = count % PROBE_EVERY
            return None if count == PROBE_EVERY else AUTO_CODEC

    def started(self, uri: str) -> None:
        """A stream from ``uri`` begins."""
        now = self._clock()
        with self._lock:
            for key in (uri, self.ALL):
                busy = self._busy.setdefault(key, [0, now, 0, False])
                if busy[0] == 0:
                    busy[1:] = [now, 0, False]
                busy[0] += 1

    def finished(self, uri: str, nbytes: int, codec: str | None) -> None:
        """A stream from ``uri`` ended having delivered ``nbytes`` (0 if it failed), compressed with ``codec``."""
        now = self._clock()
        with self._lock:
            for key in (uri, self.ALL):
                busy = self._busy.get(key)
                if busy is None or busy[0] == 0:
                    continue
                busy[0] -= 1
                busy[2] += nbytes
                busy[3] = busy[3] or codec is not None
                if busy[0] == 0 and not busy[3] and busy[2] >= MIN_MEASURED and now > busy[1]:
                    self._rate[key] = busy[2] / (now - busy[1])

    def rate(self, uri: str) -> float | None:
        """The last measured rate of ``uri``'s link (``"*"``: this process's) in bytes per second, None if not
        measured."""
        with self._lock:
            return self._rate.get(uri)

    def seconds_for(self, uri: str, nbytes: int) -> float | None:
        """How long ``nbytes`` from ``uri`` should take at the measured rates, sharing both links with the streams in
        flight on each; None while either is unmeasured."""
        with self._lock:
            longest = 0.0
            for key in (uri, self.ALL):
                rate = self._rate.get(key)
                if rate is None:
                    return None
                busy = self._busy.get(key)
                longest = max(longest, nbytes * ((busy[0] if busy else 0) + 1) / rate)
            return longest

    def forget(self) -> None:
        with self._lock:
            self._rate.clear()
            self._since_probe.clear()
            self._busy.clear()


RATES = LinkRates()
"""This process's measurements, shared by every client, ``get`` and node pull in it."""
