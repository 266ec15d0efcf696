"""What a filter costs to send doubles with each level of its nesting (pyarrow's Substrait writer writes each
argument of a call twice): an OR of 40 terms chained took the memory of the process writing it. Filters are
weighed before they are written (flightpart.query.filters.substrait_bound) and the translators build balanced
trees. Whatever might exhaust memory runs in a child process with a memory limit."""

import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.substrait as substrait
import pytest

from flightpart.errors import PartitionedError
from flightpart.query.filters import MAX_SUBSTRAIT_BOUND, Filter, parse_where, substrait_bound
from flightpart.query.joined import disjunction

SCHEMA = pa.schema([("a", pa.int64()), ("f", pa.float64()), ("s", pa.string())])


def chained(n: int) -> pc.Expression:
    out = pc.field("a") == 0
    for k in range(1, n):
        out = out | (pc.field("a") == k)
    return out


SHAPES = {
    "comparison": pc.field("a") > 3,
    "chain of 10": chained(10),
    "balanced 64": disjunction([pc.field("a") == k for k in range(64)]),
    "is_in 1,000": pc.field("a").isin(list(range(1000))),
    "text is_in": pc.field("s").isin(["x" * 40] * 200),
    "nested": (chained(6) | pc.field("a").isin(list(range(300)))) & ~pc.field("f").is_nan(),
    "arithmetic": (pc.field("a") + 1) * 2 > 7,
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_bound_is_above_what_is_written_and_close_to_it(shape):
    expression = SHAPES[shape]
    written = len(substrait.serialize_expressions([expression], ["filter"], SCHEMA))
    bound = substrait_bound(expression)
    assert written <= bound <= 4 * written + 512, (written, bound)


def run_limited(body: str) -> subprocess.CompletedProcess:
    """``body`` in a child process that may use at most 3 GB of address space."""
    script = "import resource\nresource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)


def test_a_long_chain_built_by_a_user_is_refused_before_it_is_written():
    done = run_limited("""
        import pyarrow as pa, pyarrow.compute as pc
        from flightpart.errors import PartitionedError
        from flightpart.query.filters import Filter
        chain = pc.field("a") == 0
        for k in range(1, 40):
            chain = chain | (pc.field("a") == k)
        try:
            Filter.compile(chain, pa.schema([("a", pa.int64())]))
        except PartitionedError as exc:
            print("refused:", exc)
    """)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "refused:" in done.stdout and "nested too deeply" in done.stdout and "is_in" in done.stdout


def test_text_filters_with_long_chains_are_written_as_balanced_trees():
    for text in (" OR ".join(f"a = {k}" for k in range(40)), " AND ".join(f"a > {k}" for k in range(40)),
                 "f IN (" + ", ".join(f"{k / 2}" for k in range(40)) + ")"):
        expression = parse_where(text, SCHEMA)
        assert substrait_bound(expression) <= MAX_SUBSTRAIT_BOUND
        compiled = Filter.compile(expression, SCHEMA, translated=True)
        table = pa.table({"a": list(range(300)), "f": [k / 2 for k in range(300)], "s": ["x"] * 300})
        assert table.filter(compiled.expression).num_rows == table.filter(expression).num_rows > 0


def test_a_float_in_list_too_large_to_send_is_refused_with_the_way_out():
    text = "f IN (" + ", ".join(f"{k / 2}" for k in range(900)) + ")"
    done = run_limited(f"""
        import pyarrow as pa
        from flightpart.errors import PartitionedError
        from flightpart.query.filters import Filter, parse_where
        schema = pa.schema([("f", pa.float64())])
        try:
            Filter.compile(parse_where({text!r}, schema), schema, translated=True)
        except PartitionedError as exc:
            print("refused:", str(exc)[-200:])
    """)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "refused:" in done.stdout and "is_in" in done.stdout


def test_a_polars_predicate_nested_deeper_than_python_walks_is_left_to_polars():
    import polars as pl

    from flightpart.client.polars_source import to_arrow_expression

    chain = pl.col("a") > 0
    for k in range(3000):
        chain = chain & (pl.col("a") > k)
    assert to_arrow_expression(chain, SCHEMA) is None


def test_a_filter_larger_than_a_ticket_carries_is_refused_when_it_is_made():
    text = "s IN (" + ", ".join(f"'{k:04d}{'x' * 1000}'" for k in range(1000)) + ")"
    with pytest.raises(PartitionedError, match="more than a ticket carries"):
        Filter.compile(parse_where(text, SCHEMA), SCHEMA, translated=True)
    chain = " OR ".join(f"a = {k}" for k in range(100))  # balanced, still some 1.5 MB: the message says what to write
    with pytest.raises(PartitionedError, match=r"as x IN \(1, 2, ...\)"):
        Filter.compile(parse_where(chain, SCHEMA), SCHEMA, translated=True)
    shorter = "s IN (" + ", ".join(f"'{k:04d}{'x' * 100}'" for k in range(1000)) + ")"
    assert len(Filter.compile(parse_where(shorter, SCHEMA), SCHEMA, translated=True).substrait) > 100_000
