"""Answers on their way to Flight SQL clients (flightpart.sql.sending): dictionary columns (DuckDB's ENUM) reach
the client across many batches, and an answer let go for another ends UNAVAILABLE with its code, dictionaries or
not, served by a real pyarrow Flight server."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flightpart.sql.sending import AnswersSent
from tests.helpers import code_of

ROWS = 60_000
LARGE = 8_000_000
"""Rows of an answer larger (some 70 MB) than what a stream's flow-control windows and socket buffers take at once
(~15 MB): the catalog still holds most of it when it is let go."""


def answer(kind: str, rows: int = ROWS) -> pa.Table:
    """An answer of three chunks; ``kind`` says what its second column is."""
    chunks = []
    for c in range(3):
        k = np.arange(c * rows // 3, (c + 1) * rows // 3)
        values = [f"v{(v + c) % 7}" for v in range(7)]  # each chunk its own dictionary, in another order
        indices = pa.array(((k % 7) - c) % 7, pa.int8())
        e: pa.Array = pa.DictionaryArray.from_arrays(indices, pa.array(values))
        if kind == "plain":
            e = e.dictionary_decode()
        elif kind == "nested dictionary":  # a list of dictionary values: a dictionary below the top level
            e = pa.ListArray.from_arrays(pa.array(np.arange(len(k) + 1), pa.int32()), e)
        chunks.append(pa.table({"k": k, "e": e}))
    return pa.concat_tables(chunks)


def expected(table: pa.Table) -> list:
    return [str(v) for v in table.column("e").to_pylist()]


@pytest.fixture(scope="module")
def served():
    answers = AnswersSent(batch_bytes=16 << 10)

    class Answers(flight.FlightServerBase):
        def do_get(self, context, ticket):
            kind, rows = ticket.ticket.decode().split(":")
            return answers.stream(answer(kind, int(rows)))

    server = Answers("grpc://127.0.0.1:0")
    client = flight.connect(f"grpc://127.0.0.1:{server.port}")
    try:
        yield answers, client
    finally:
        client.close()
        server.shutdown()


@pytest.mark.parametrize("kind", ["plain", "dictionary", "nested dictionary"])
def test_an_answer_reaches_the_client_whole_over_many_batches(served, kind):
    answers, client = served
    reader = client.do_get(flight.Ticket(f"{kind}:{ROWS}".encode()))
    got = reader.read_all()
    table = answer(kind)
    assert got.num_rows == ROWS and got.column("k").to_pylist() == list(range(ROWS))
    assert expected(got) == expected(table) and got.schema.field("e").type == table.schema.field("e").type
    assert answers.held_bytes() == 0


@pytest.mark.parametrize("kind", ["plain", "dictionary"])
def test_an_answer_let_go_for_another_ends_unavailable_with_its_code(served, kind):
    """A dictionary answer went through Arrow's writer of a reader, which sent the let-go as UNKNOWN with a
    traceback and no code; it now ends as any answer does."""
    answers, client = served
    reader = client.do_get(flight.Ticket(f"{kind}:{LARGE}".encode()))
    first = reader.read_chunk().data
    assert first.num_rows < LARGE and answers.held_bytes() > 64_000_000
    answers.idle_seconds = -1.0  # idle now, even if the server took a piece since (it stamps that piece's time)
    try:
        assert answers.make_room(1, budget=0) == 0  # let go: nothing of it counted any longer
    finally:
        answers.idle_seconds = 60.0
    with pytest.raises(flight.FlightUnavailableError, match="its reader took nothing") as ended:
        while True:
            reader.read_chunk()
    assert code_of(ended.value) == "UNAVAILABLE"
