"""A decimal sum past its type's precision is refused with a code, never handed on as an array Arrow calls invalid
(pyarrow's own ``group_by`` gives a wrong, invalid number without a word); a node's partial holding values that are
not valid Arrow is refused as no node would compute it."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal

import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.query import aggregates as ag

BIG = Decimal("9" * 38)


def _decimals(values, type_=pa.decimal128(38, 0), keys=None) -> pa.Table:
    return pa.table({"k": keys or [1] * len(values), "v": pa.array([Decimal(v) for v in values], type_)})


def test_a_partition_whose_decimal_sum_overflows_is_refused_with_a_code():
    table = _decimals([BIG, BIG])
    assert not _valid(table.group_by("k").aggregate([("v", "sum")]))  # what pyarrow alone gives
    agg = ag.spec([("v", "sum")], ["k"], table.schema)
    with pytest.raises(fp.RequestRejected, match=r"sum of 'v' .*decimal128\(38, 0\)") as caught:
        ag.partial(table, agg)
    assert caught.value.code == "INVALID_REQUEST"


def test_partials_that_fit_but_overflow_together_are_refused():
    table = _decimals([BIG])
    agg = ag.spec([("v", "sum"), ("v", "count")], [], table.schema)
    parts = [ag.partial(table, agg), ag.partial(table, agg)]
    with pytest.raises(fp.RequestRejected, match=r"sum of 'v' .*decimal128\(38, 0\)"):
        ag.combine(parts, agg, table.schema)


def test_a_sum_that_fits_is_exact_for_both_decimal_widths():
    for type_, value, twice in ((pa.decimal128(38, 0), "4" * 37, "8" * 37),
                                (pa.decimal256(76, 10), "1" * 60 + ".5", "2" * 59 + "3.0")):
        table = _decimals([value, value], type_)
        agg = ag.spec([("v", "sum")], [], table.schema)
        got = ag.combine([ag.partial(table.slice(0, 1), agg), ag.partial(table.slice(1), agg)], agg, table.schema)
        assert got.column("v_sum").to_pylist() == [Decimal(twice)]
        assert _valid(got)


LIES = {
    "a decimal past its precision": """
wrapped = pa.table({"k": [1, 1], "v": pa.array([BIG, BIG], pa.decimal128(38, 0))}).group_by("k").aggregate(
    [("v", "sum")]).column("v_sum").chunk(0)
lying = truth.set_column(1, truth.field(1), pa.concat_arrays([wrapped, truth.column(1).chunk(0)[1:]]))
""",
    "keys whose offsets run past their data": """
offsets = pa.py_buffer(np.array([0, 100_000, 2], dtype=np.int32).tobytes())
keys = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"ab")])
lying = truth.set_column(0, truth.field(0), keys)
""",
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_partial_that_is_not_valid_arrow_is_not_used(lie):
    """Run in a subprocess: Arrow's grouping reads such keys out of bounds and kills the process that does."""
    code = f"""
from decimal import Decimal
import numpy as np, pyarrow as pa
import flightpart as fp
from flightpart.query import aggregates as ag
BIG = Decimal("9" * 38)
table = pa.table({{"k": ["a", "b"], "v": pa.array([Decimal(1), Decimal(2)], pa.decimal128(38, 0))}})
agg = ag.spec([("v", "sum")], ["k"], table.schema)
expected = ag.partial_schema(agg, table.schema)
truth = ag.partial(table, agg)
{LIES[lie]}
try:
    lying.validate(full=True)
    raise SystemExit("the lie is valid Arrow")
except pa.ArrowInvalid:
    pass
try:
    ag.checked_partials([truth, lying], agg, expected, 10)
except fp.ServerError as exc:
    print(exc.code, exc)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the reader ended with {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.startswith("INTERNAL a node's partial aggregate"), done.stdout
    assert "not valid Arrow" in done.stdout and "not used" in done.stdout


def _valid(table: pa.Table) -> bool:
    try:
        table.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def test_a_sum_that_wraps_to_exactly_the_widths_floor_is_refused():
    """2**126 + 2**126 in decimal128(38, 0) wraps to -2**127, which Arrow's own validation lets through: the sum
    is refused as any other overflow, not handed on as a wrong number."""
    half = Decimal(2 ** 126)
    table = _decimals([half, half])
    wrapped = table.group_by("k").aggregate([("v", "sum")]).column("v_sum")
    # what pyarrow alone gives
    assert _valid(pa.table({"v": wrapped})) and wrapped.to_pylist() == [Decimal(-(2 ** 127))]
    with pytest.raises(fp.RequestRejected, match=r"sum of 'v' .*decimal128\(38, 0\)"):
        ag.partial(table, ag.spec([("v", "sum")], ["k"], table.schema))
