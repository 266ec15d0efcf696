"""Lying Arrow IPC record batches, made by rewriting a valid batch's bytes (for tests that attack nodes).

pyarrow refuses to build such batches through its API, but a peer on the
network can send any bytes; these helpers make the same bytes and read them
back with only the cheap checks pyarrow's IPC reader does, so a test can
send them with a plain Flight client.
"""

from __future__ import annotations

import random
import struct

import numpy as np
import pyarrow as pa

CONTINUATION = b"\xff\xff\xff\xff"


def batch_messages(batch: pa.RecordBatch) -> tuple[bytes, bytes]:
    """(metadata, body) of a batch's IPC message."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    messages = pa.ipc.MessageReader.open_stream(sink.getvalue())
    messages.read_next_message()  # the schema
    message = messages.read_next_message()
    return message.metadata.to_pybytes(), message.body.to_pybytes()


def rebuild(schema: pa.Schema, metadata: bytes, body: bytes) -> pa.RecordBatch:
    """A record batch from raw message bytes, with only the checks the IPC reader does (raises if even those fail)."""
    framed = CONTINUATION + struct.pack("<i", len(metadata)) + metadata + body
    return pa.ipc.read_record_batch(pa.ipc.read_message(pa.py_buffer(framed)), schema)


def lying_row_count(rows: int = 1_000_000) -> pa.RecordBatch:
    """A batch that claims ``rows`` rows over a body of 80 bytes."""
    batch = pa.record_batch({"a": np.arange(10, dtype=np.int64)})
    metadata, body = batch_messages(batch)
    metadata = metadata.replace(struct.pack("<q", 10), struct.pack("<q", rows))
    return rebuild(batch.schema, metadata, body)


def bad_string_offsets() -> pa.RecordBatch:
    """Strings whose middle offset points far past the data (the last one is in range, so cheap checks pass)."""
    offsets = pa.py_buffer(np.array([0, 100_000, 5], dtype=np.int32).tobytes())
    strings = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"hello")])
    return pa.RecordBatch.from_arrays([strings], names=["s"])


SAMPLE = pa.record_batch({
    "i": np.arange(64, dtype=np.int64),
    "s": pa.array([f"v{k % 7}" * (k % 5) for k in range(64)]),
    "l": pa.array([[k] * (k % 4) for k in range(64)]),
})


def mutations(seed: int, count: int) -> list[tuple[str, pa.RecordBatch]]:
    """Up to ``count`` mutated batches that pyarrow's IPC reader still accepts: bit flips and rewritten integers."""
    rng = random.Random(seed)
    metadata, body = batch_messages(SAMPLE)
    out: list[tuple[str, pa.RecordBatch]] = []
    attempts = 0
    while len(out) < count and attempts < count * 50:
        attempts += 1
        meta, data = bytearray(metadata), bytearray(body)
        kind = rng.choice(["flip-body", "flip-meta", "int-meta", "int-body"])
        target = data if kind.endswith("body") else meta
        if kind.startswith("flip"):
            for _ in range(rng.randint(1, 8)):
                k = rng.randrange(len(target))
                target[k] ^= 1 << rng.randrange(8)
        else:
            k = rng.randrange(0, max(1, len(target) - 8)) & ~3
            value = rng.choice([0, 1, 7, 63, 64, 65, 1 << 20, (1 << 31) - 1, 1 << 40, (1 << 62) - 1, -1])
            width = rng.choice([4, 8])
            target[k:k + width] = value.to_bytes(8, "little", signed=True)[:width]
        try:
            batch = rebuild(SAMPLE.schema, bytes(meta), bytes(data))
        except Exception:
            continue  # refused by the reader's own checks: not interesting to send
        out.append((kind, batch))
    return out
