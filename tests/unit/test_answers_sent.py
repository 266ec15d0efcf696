"""Answers on their way to Flight SQL clients (flightpart.sql.sending): dictionary columns (DuckDB's ENUM) reach
the client across many batches, and an answer let go for another ends UNAVAILABLE with its code, dictionaries or
not, served by a real pyarrow Flight server."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flightpart.sql.sending import AnswersSent
from tests.helpers import code_of

ROWS = 60_000


def answer(kind: str) -> pa.Table:
    """An answer of several chunks; ``kind`` says what its second column is."""
    chunks = []
    for c in range(3):
        k = pa.array(range(c * ROWS // 3, (c + 1) * ROWS // 3))
        if kind == "plain":
            e = pa.array([f"v{v % 7}" for v in k.to_pylist()])
        elif kind == "dictionary":  # each chunk its own dictionary, in another order
            values = [f"v{(v + c) % 7}" for v in range(7)]
            e = pa.DictionaryArray.from_arrays(pa.array([values.index(f"v{v % 7}") for v in k.to_pylist()], pa.int8()),
                                               pa.array(values))
        else:  # a list of dictionary values: a dictionary below the top level
            inner = pa.array([f"v{v % 7}" for v in k.to_pylist()]).dictionary_encode()
            e = pa.ListArray.from_arrays(pa.array(range(len(k) + 1), pa.int32()), inner)
        chunks.append(pa.table({"k": k, "e": e}))
    return pa.concat_tables(chunks)


def expected(table: pa.Table) -> list:
    return [str(v) for v in table.column("e").to_pylist()]


@pytest.fixture(scope="module")
def served():
    answers = AnswersSent(batch_bytes=16 << 10)

    class Answers(flight.FlightServerBase):
        def do_get(self, context, ticket):
            return answers.stream(answer(ticket.ticket.decode()))

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
    reader = client.do_get(flight.Ticket(kind.encode()))
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
    reader = client.do_get(flight.Ticket(kind.encode()))
    first = reader.read_chunk().data
    assert first.num_rows < ROWS
    answers.idle_seconds = 0.0
    try:
        assert answers.make_room(1, budget=0) == 0  # let go: nothing of it counted any longer
    finally:
        answers.idle_seconds = 60.0
    with pytest.raises(flight.FlightUnavailableError, match="its reader took nothing") as ended:
        while True:
            reader.read_chunk()
    assert code_of(ended.value) == "UNAVAILABLE"
