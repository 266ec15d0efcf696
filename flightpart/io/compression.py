"""Compression on the wire: asked for per read by the reader, granted per stream by the node.

Stored partitions stay uncompressed so they can be memory-mapped; only a
stream may be compressed, with Arrow IPC body compression (any Arrow reader
decompresses it). Compressing costs CPU on both ends, so it pays only where
the link is slower than the codec: on this project's machine ZSTD packs
about 0.4 GB/s per core, so a 1 Gbit/s link (0.125 GB/s) gains and a
10 Gbit/s one loses. Hence two decisions:

* the reader (:class:`LinkRates`, mode ``"auto"``) asks for ZSTD from a node
  only when the last uncompressed stream it measured from that node ran
  slower than :data:`SLOW_LINK`, never for loopback or this host (those are
  memory copies or maps), and measures the link again uncompressed every
  :data:`PROBE_EVERY` streams;
* the node (:func:`write_options`) compresses only when a sample of the data
  shrinks to :data:`WORTH` of its size or less (random floats do not).
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Collection

import pyarrow as pa
import pyarrow.ipc as ipc

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
    with ipc.new_stream(sink, table.schema, options=ipc.IpcWriteOptions(compression=codec, use_threads=False)) as writer:
        writer.write_table(table)
    return sink.tell()


def sample_ratio(table: pa.Table, codec: str) -> float:
    """Compressed over uncompressed IPC size of about :data:`SAMPLE_BYTES` of ``table``'s first rows."""
    rows = max(1, min(table.num_rows, SAMPLE_BYTES * table.num_rows // max(table.nbytes, 1)))
    sample = table.slice(0, rows)
    return _ipc_size(sample, codec) / max(_ipc_size(sample, None), 1)


def write_options(table: pa.Table, codec: str | None) -> ipc.IpcWriteOptions | None:
    """IPC options for streaming ``table`` to a reader that accepts ``codec``: compressed only where it is worth it."""
    if codec is None or table.nbytes < MIN_STREAM_BYTES or table.num_columns == 0:
        return None
    if sample_ratio(table, codec) > WORTH:
        return None
    return ipc.IpcWriteOptions(compression=codec)


def is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return ip == "localhost"


class LinkRates:
    """What this process measured of each node's link, and the codec it asks that node for.

    Only uncompressed streams measure a link (a compressed one would measure
    the codec); a link measured slow gets compressed streams, with an
    uncompressed probe every :data:`PROBE_EVERY` streams to notice a link
    that became fast.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rate: dict[str, float] = {}
        self._since_probe: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}

    def codec_for(self, mode: str, uri: str, ip: str, here: Collection[str]) -> str | None:
        """The codec to ask ``uri`` (at ``ip``) for under ``mode``, for a reader on the host with addresses ``here``."""
        if mode == "off" or is_loopback(ip) or ip in here:
            return None
        if mode != "auto":
            return mode
        with self._lock:
            rate = self._rate.get(uri)
            if rate is None or rate >= SLOW_LINK:
                return None
            count = self._since_probe.get(uri, 0) + 1
            self._since_probe[uri] = count % PROBE_EVERY
            return None if count == PROBE_EVERY else AUTO_CODEC

    def started(self, uri: str) -> int:
        """A stream from ``uri`` begins; returns how many (this one included) are in flight from it."""
        with self._lock:
            self._in_flight[uri] = count = self._in_flight.get(uri, 0) + 1
            return count

    def finished(self, uri: str, nbytes: int, seconds: float, codec: str | None, sharing: int = 1) -> None:
        """A stream from ``uri`` delivered ``nbytes`` in ``seconds`` (or failed: ``nbytes`` 0).

        Uncompressed streams of some size measure the link; ``sharing``
        streams in flight at once shared it, so the link carried that many
        times this one's rate.
        """
        with self._lock:
            self._in_flight[uri] = max(self._in_flight.get(uri, 1) - 1, 0)
            if codec is None and nbytes >= MIN_MEASURED and seconds > 0:
                self._rate[uri] = nbytes * max(sharing, 1) / seconds

    def rate(self, uri: str) -> float | None:
        """The last measured rate of ``uri``'s link in bytes per second (None: not measured)."""
        with self._lock:
            return self._rate.get(uri)

    def forget(self) -> None:
        with self._lock:
            self._rate.clear()
            self._since_probe.clear()


RATES = LinkRates()
"""This process's measurements, shared by every client, ``get`` and node pull in it."""
