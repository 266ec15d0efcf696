"""Row filters that travel to the data: ``pyarrow.compute`` expressions as Substrait.

A filter is written by the user as a ``pyarrow.compute.Expression``
(``pc.field("amount") > 10``). It crosses the wire as a Substrait extended
expression (``pyarrow.substrait.serialize_expressions``): language neutral
and safe to decode, never pickled. The expression is bound to a schema of
only the columns it reads, in that order, so a node can evaluate it on any
partition that has those columns, whatever else the partition holds.

``parse_where`` turns the text of a ``--where`` option into an expression
through Python's parser, without evaluating anything.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc
import pyarrow.substrait as substrait

from flightpart.errors import PartitionedError, RequestRejected

_FIELD_PATH = re.compile(r"FieldPath\((\d+)")


@dataclass(frozen=True)
class Filter:
    """A filter ready to travel: its Substrait bytes and the columns it reads (in the bound order)."""

    expression: pc.Expression
    columns: tuple[str, ...]
    substrait: bytes

    @classmethod
    def compile(cls, expression: pc.Expression, schema: pa.Schema) -> "Filter":
        """Bind ``expression`` to the columns of ``schema`` it reads; a clear error when it cannot travel."""
        if not isinstance(expression, pc.Expression):
            raise TypeError(f"a filter is a pyarrow.compute.Expression (e.g. pc.field('x') > 0), got {type(expression).__qualname__}")
        columns = referenced_columns(expression, schema)
        bound = pa.schema([schema.field(c) for c in columns])
        raw = _serialize(expression, bound if columns else pa.schema([]))
        return cls(expression, columns, raw)



def conjunction(terms: Sequence[pc.Expression]) -> pc.Expression | None:
    """``terms[0] & terms[1] & ...``, or None for no terms."""
    out = None
    for term in terms:
        out = term if out is None else out & term
    return out


def _serialize(expression: pc.Expression, schema: pa.Schema) -> bytes:
    try:
        return bytes(substrait.serialize_expressions([expression], ["filter"], schema))
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise PartitionedError(f"filter {expression}: cannot be sent to the nodes ({exc}); filter the rows after reading "
                               "instead, or use functions Substrait knows (comparisons, and/or/not, is_in, is_null, arithmetic)") from None


def referenced_columns(expression: pc.Expression, schema: pa.Schema) -> tuple[str, ...]:
    """The top-level columns of ``schema`` that ``expression`` reads, in schema order.

    Found by binding the expression to the whole schema and reading the
    field paths back; a field the schema lacks is an error naming it.
    """
    try:
        bound = substrait.deserialize_expressions(substrait.serialize_expressions([expression], ["filter"], schema))
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise PartitionedError(f"filter {expression}: cannot be sent to the nodes ({exc}); the columns are {schema.names}; "
                               "Substrait knows comparisons, and/or/not, is_in, is_null and arithmetic") from None
    used = {int(k) for k in _FIELD_PATH.findall(str(bound.expressions["filter"]))}
    return tuple(name for k, name in enumerate(schema.names) if k in used)


@functools.lru_cache(maxsize=256)
def decode(raw: bytes) -> tuple[pc.Expression, pa.Schema]:
    """The expression and its bound schema from Substrait bytes, or RequestRejected."""
    try:
        bound = substrait.deserialize_expressions(pa.py_buffer(raw))
        expression = bound.expressions["filter"]
    except (pa.ArrowException, KeyError, TypeError, ValueError) as exc:
        raise RequestRejected(f"ticket.filter: not a Substrait filter expression ({str(exc)[:200]})", field="ticket.filter") from None
    return expression, bound.schema


def apply(table: pa.Table, raw: bytes) -> pa.Table:
    """The rows of ``table`` the encoded filter keeps, in order (the columns it reads must be in ``table``)."""
    expression, bound = decode(raw)
    for field in bound:
        if field.name not in table.column_names:
            raise RequestRejected(f"ticket.filter: reads column {field.name!r}, which this partition does not have "
                                  f"(it has {table.column_names})", field="ticket.filter")
        if not table.schema.field(field.name).type.equals(field.type):
            raise RequestRejected(f"ticket.filter: column {field.name!r} is {table.schema.field(field.name).type} here, "
                                  f"the filter was bound to {field.type}", field="ticket.filter")
    order = list(bound.names) + [n for n in table.column_names if n not in bound.names]
    source = acero.Declaration("table_source", acero.TableSourceNodeOptions(table.select(order)))
    plan = acero.Declaration.from_sequence([source, acero.Declaration("filter", acero.FilterNodeOptions(expression))])
    try:
        kept = plan.to_table(use_threads=False)  # one thread keeps the rows in order
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise RequestRejected(f"ticket.filter: cannot be evaluated here ({str(exc)[:200]})", field="ticket.filter") from None
    return kept.select(table.column_names)


# ---------------------------------------------------------------------- --where text

_COMPARE = {ast.Eq: "equal", ast.NotEq: "not_equal", ast.Lt: "less", ast.LtE: "less_equal", ast.Gt: "greater",
            ast.GtE: "greater_equal"}
_ARITH = {ast.Add: "add_checked", ast.Sub: "subtract_checked", ast.Mult: "multiply_checked", ast.Div: "divide"}


def parse_where(text: str, columns: Sequence[str]) -> pc.Expression:
    """A filter from text such as ``amount > 10 and store in ('s1', 's2')`` (Python syntax; ``=``, AND, OR, NOT also read).

    Names are columns (``"quoted name"`` for others is not needed: use a
    name as it is, or backquotes ```odd name```), literals are numbers,
    strings, True/False/None; ``x is None`` / ``x is not None`` test nulls.
    Nothing is evaluated: an unknown construct is an error naming it.
    """
    source = _normalise(text)
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise PartitionedError(f"--where {text!r}: not an expression ({exc.msg})") from None
    return _Translator(columns, text).visit(tree.body)


def _normalise(text: str) -> str:
    out = []
    tokens = re.split(r"(`[^`]*`|'[^']*'|\"[^\"]*\")", text)
    for tok in tokens:
        if tok.startswith("`") and tok.endswith("`") and len(tok) >= 2:
            out.append(f"__col__({tok[1:-1]!r})")
        elif tok[:1] in ("'", '"'):
            out.append(tok)
        else:
            tok = re.sub(r"(?<![<>=!])=(?!=)", "==", tok)
            tok = re.sub(r"\b(AND|OR|NOT|IN|IS|NULL|TRUE|FALSE)\b",
                         lambda m: {"NULL": "None", "TRUE": "True", "FALSE": "False"}.get(m.group(1), m.group(1).lower()),
                         tok, flags=re.IGNORECASE)
            out.append(tok)
    return "".join(out)


class _Translator:
    def __init__(self, columns: Sequence[str], text: str):
        self.columns = list(columns)
        self.text = text

    def fail(self, what: str) -> PartitionedError:
        return PartitionedError(f"--where {self.text!r}: {what}")

    def visit(self, node: ast.AST) -> pc.Expression:
        if isinstance(node, ast.BoolOp):
            values = [self.visit(v) for v in node.values]
            if isinstance(node.op, ast.And):
                return conjunction(values)
            return functools.reduce(lambda a, b: a | b, values)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ~self.visit(node.operand)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return pc.negate_checked(self.visit(node.operand))
        if isinstance(node, ast.Compare):
            return self.compare(node)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            return pc.Expression._call(_ARITH[type(node.op)], [self.visit(node.left), self.visit(node.right)])
        if isinstance(node, ast.Name):
            return self.column(node.id)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__col__":
            return self.column(node.args[0].value)  # type: ignore[attr-defined]
        if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (bool, int, float, str))):
            return pc.scalar(node.value)
        raise self.fail(f"{ast.unparse(node)!r} is not a column, a literal or a comparison")

    def column(self, name: str) -> pc.Expression:
        if name not in self.columns:
            raise self.fail(f"no column {name!r}; the columns are {self.columns}")
        return pc.field(name)

    def literals(self, node: ast.AST) -> list:
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set)) or not all(isinstance(e, ast.Constant) for e in node.elts):
            raise self.fail(f"'in' takes a list of literals, got {ast.unparse(node)!r}")
        return [e.value for e in node.elts]  # type: ignore[attr-defined]

    def compare(self, node: ast.Compare) -> pc.Expression:
        out = None
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            if isinstance(op, (ast.In, ast.NotIn)):
                term = self.visit(left).isin(self.literals(right))
                term = ~term if isinstance(op, ast.NotIn) else term
            elif isinstance(op, (ast.Is, ast.IsNot)):
                if not (isinstance(right, ast.Constant) and right.value is None):
                    raise self.fail("'is' compares with None only (x is None, x is not None)")
                term = self.visit(left).is_null()
                term = ~term if isinstance(op, ast.IsNot) else term
            elif type(op) in _COMPARE:
                term = pc.Expression._call(_COMPARE[type(op)], [self.visit(left), self.visit(right)])
            else:
                raise self.fail(f"unknown comparison {type(op).__name__}")
            out = term if out is None else out & term
            left = right
        assert out is not None
        return out
