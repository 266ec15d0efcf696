"""SQL predicates (``--where``, ``ds.filter("...")``, ``count_rows``) as filters that travel to the nodes.

The text is parsed by sqlglot in DuckDB's dialect (``''`` in strings, ``"quoted names"``, ``<>``, ``BETWEEN``,
``IN``, ``LIKE``/``ILIKE``, ``IS [NOT] NULL``/``TRUE``, typed literals, ``CAST``, ``+ - * /``); names match
columns as DuckDB matches them.

The translation keeps DuckDB's answer where Python's or Arrow's differ: three-valued logic, NaN greater than
every number and equal to itself, integer ``/`` as decimals, literals cast as DuckDB casts them. What it cannot
translate exactly is refused with INVALID_FILTER, never evaluated to a different answer;
``tests/unit/test_sql_predicates.py`` checks it against DuckDB over random tables and predicates.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from flightpart.errors import InvalidExpression, InvalidFilter
from flightpart.frames import widens_losslessly
from flightpart.query.functions import arrow_call
from flightpart.query.joined import conjunction, disjunction

_NULL_BOOL = pc.scalar(pa.scalar(None, pa.bool_()))


@dataclass(frozen=True)
class Value:
    """A translated operand: its expression, its Arrow type when known, and the Python value of a literal."""

    expression: pc.Expression
    type: pa.DataType | None
    literal: Any = None
    is_literal: bool = False
    typed: bool = False  # a literal given its type by a CAST: DuckDB's untyped integer literals adapt, typed ones not
    text: str | None = None  # a number literal as written (exact where a float is not: compared with a decimal)
    integer_type: pa.DataType | None = None  # a folded integer literal's type as DuckDB's (INTEGER or BIGINT)


def parse_sql_predicate(text: str, schema: pa.Schema) -> pc.Expression:
    """The filter ``text`` (a SQL boolean expression over ``schema``'s columns) means, or InvalidFilter."""
    import sqlglot
    from sqlglot.errors import ParseError, TokenError

    if not isinstance(text, str) or not text.strip():
        raise InvalidFilter("a filter text must be a non-empty SQL expression such as \"fare > 10 AND zone = 'JFK'\"",
                            field="filter")
    try:
        tree = sqlglot.parse_one(text, read="duckdb")
        weight = _expanded_weight(tree)
        if weight > MAX_EXPANDED_WEIGHT:
            raise InvalidFilter(f"filter {text[:200]!r}: its translation would repeat its operands some {weight:,} "
                                f"times, more than the {MAX_EXPANDED_WEIGHT:,} sent to the nodes (a comparison of a "
                                "condition inside another, nested)", field="filter")
        return _Translator(schema, text).boolean(tree)
    except (ParseError, TokenError) as exc:
        raise InvalidFilter(f"filter {text!r}: not a SQL expression ({str(exc).splitlines()[0][:200]})",
                            field="filter") from None
    except RecursionError:
        raise InvalidFilter(f"filter {text[:200]!r}...: nested too deeply", field="filter") from None


MAX_EXPANDED_WEIGHT = 200_000
"""The most operand uses a filter's translation may have (:func:`_expanded_weight`)."""


def _expanded_weight(root: Any) -> int:
    """An upper bound of the nodes a predicate's translation has once shared operands are counted where used (a
    comparison uses each side up to three times, BETWEEN its subject twice, IN once per value), since Arrow writes
    an expression as that tree. Walked without recursion."""
    from sqlglot import exp

    def uses(node: Any, child: Any) -> int:
        if isinstance(node, exp.Between):
            return 6 if child is node.this else 3
        if isinstance(node, exp.In):
            return 3 * max(1, len(node.expressions)) if child is node.this else 3
        if isinstance(node, (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE, exp.NullSafeEQ, exp.NullSafeNEQ)):
            return 3
        if isinstance(node, (exp.And, exp.Or, exp.Not, exp.Paren)):
            return 1
        return 2  # arithmetic, casts, IS, LIKE, functions: at most twice
    weight: dict[int, int] = {}
    order, pending = [], [root]
    while pending:
        node = pending.pop()
        order.append(node)
        pending += [c for c in node.iter_expressions()]
    for node in reversed(order):  # children before their parents
        total = 1 + sum(uses(node, c) * weight[id(c)] for c in node.iter_expressions())
        weight[id(node)] = min(total, 1 << 62)
    return weight[id(root)]


def parse_sql_value(text: str, schema: pa.Schema) -> tuple[pc.Expression, pa.DataType, tuple[str, ...]]:
    """A computed column: the value the SQL expression ``text`` has on each row of ``schema``, its Arrow type, and the
    columns it reads; or InvalidExpression.

    Only what gives DuckDB's value exactly translates: ``+ - * /`` on integers and DOUBLE columns (checked overflow
    is an error, as in DuckDB), widening numeric casts, and ``date_trunc('unit', column)`` of a date or naive
    timestamp. Nodes compute a float value only when finite (a NaN or infinity sends the query to DuckDB whole).
    At most :data:`MAX_COMPUTED_STEPS` operations.
    """
    import sqlglot
    from sqlglot.errors import ParseError, TokenError

    if not isinstance(text, str) or not text.strip():
        raise InvalidExpression("an expression must be non-empty SQL such as \"fare * 100\"", field="computed")
    if date_trunc_unit_not_quoted(text):
        raise InvalidExpression(f"expression {text[:200]!r}: date_trunc takes its unit as a string literal here "
                                "('month'); DuckDB reads a bare name as a column, its unit row by row",
                                field="computed")
    translator = _Translator(schema, text, computing=True)
    try:
        value = translator.value(sqlglot.parse_one(text, read="duckdb"))
    except (ParseError, TokenError) as exc:
        raise InvalidExpression(f"expression {text[:200]!r}: not SQL ({str(exc).splitlines()[0][:200]})",
                                field="computed") from None
    except RecursionError:
        raise InvalidExpression(f"expression {text[:200]!r}...: nested too deeply", field="computed") from None
    if translator.steps > MAX_COMPUTED_STEPS:
        raise InvalidExpression(f"expression {text[:200]!r}: {translator.steps} operations, more than the "
                                f"{MAX_COMPUTED_STEPS} a computed column may have", field="computed")
    if value.is_literal or value.type is None:
        raise InvalidExpression(f"expression {text!r}: computes no column (name at least one column)", field="computed")
    return value.expression, value.type, tuple(n for n in schema.names if n in translator.read)


MAX_IN_VALUES = 1000
"""Values an ``IN`` list sent to the nodes may have. Arrow reads and binds an ``is_in`` by recursion as deep as its
list (about 10,000 values overflow a Flight thread's stack, about 3,500 the nodes' filter checker's, see
:mod:`flightpart.server.substrait_check`): a longer list is refused here, and SQL runs such a query whole."""

MAX_COMPUTED_STEPS = 64
"""Operations (columns, literals, operators, functions) one computed column may have: a node evaluates it on every
row of a partition, so a short ticket must not buy unbounded work."""
_TRUNC_UNQUOTED = re.compile(r"date_?trunc\s*\(\s*(?!')", re.IGNORECASE)


def date_trunc_unit_not_quoted(text: str) -> bool:
    """Whether a ``date_trunc`` in ``text`` takes its unit from anything but a string literal (DuckDB would read a
    name there as a column)."""
    return _TRUNC_UNQUOTED.search(text) is not None


def column_value(schema: pa.Schema, name: str) -> Value:
    """A column as an operand (matched as DuckDB matches names), for callers translating other engines' expressions."""
    return _Translator(schema, name).column(_Named(name))


def literal_value(value: Any, type: pa.DataType | None = None) -> Value:
    """A literal as an operand (its Python value, and its Arrow type when the caller knows it)."""
    scalar = pa.scalar(value, type=type) if type is not None else pa.scalar(value)
    return Value(pc.scalar(scalar), scalar.type, scalar.as_py(), True)


def membership(schema: pa.Schema, subject: Value, values: list[Value]) -> pc.Expression:
    """``subject IN (values)`` (literals, none NULL) as SQL reads it: one ``is_in`` where the values meet the column's
    type exactly, else a balanced tree of comparisons."""
    return _Translator(schema, "IN list").member(subject, values)


def _chained(node: Any, kind: type[Any]) -> list[Any]:
    """The operands of a chain of ``kind`` (AND or OR) nodes, left to right, walked without recursion."""
    operands: list[Any] = []
    pending: list[Any] = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, kind):
            pending += [current.expression, current.this]  # popped left first
        else:
            operands.append(current)
    return operands


def comparison(schema: pa.Schema, op: str, left: Value, right: Value) -> pc.Expression:
    """``left <op> right`` (op: eq, ne, lt, le, gt, ge) as SQL compares: a literal read as its column's type, NaN
    greatest and equal to NaN, NULL on either side NULL. InvalidFilter when they do not compare exactly."""
    return _Translator(schema, f"{op} comparison").compare(op, left, right)


@dataclass(frozen=True)
class _Named:
    """A bare column name where a parsed SQL column is expected."""

    name: str
    table: str = ""


class _Translator:
    def __init__(self, schema: pa.Schema, text: str, *, computing: bool = False):
        self.schema = schema
        self.text = text
        self.computing = computing  # a computed column's value, not a filter: DuckDB's arithmetic types, exactly
        self.truncating = False  # translating date_trunc's column (the one place a computed value reads a temporal one)
        self.steps = 0  # operations translated (a computed column's cost on every row)
        self.read: set[str] = set()
        from sqlglot import exp

        self.exp = exp
        e = exp
        self.comparisons: dict[type, str] = {e.EQ: "eq", e.NEQ: "ne", e.LT: "lt", e.LTE: "le", e.GT: "gt", e.GTE: "ge"}
        self.arithmetic: dict[type, str] = {e.Add: "add", e.Sub: "subtract", e.Mul: "multiply", e.Div: "divide"}

    def fail(self, what: str) -> InvalidFilter | InvalidExpression:
        if self.computing:
            return InvalidExpression(f"expression {self.text!r}: {what}", field="computed")
        return InvalidFilter(f"filter {self.text!r}: {what}", field="filter")

    # ------------------------------------------------------------------ booleans

    def boolean(self, node: Any) -> pc.Expression:
        value = self.value(node)
        if value.type is not None and not pat.is_boolean(value.type) and not pat.is_null(value.type):
            raise self.fail(f"{node.sql(dialect='duckdb')!r} is {value.type}, not a condition (compare it: "
                            "x > 0, x = 'a')")
        return value.expression

    def value(self, node: Any) -> Value:
        self.steps += 1
        if node.args.get("negate"):  # sqlglot writes some NOT forms (x NOT LIKE p ESCAPE e) as a flag
            plain = node.copy()
            plain.set("negate", None)
            return Value(~self.boolean(plain), pa.bool_())
        e = self.exp
        if isinstance(node, e.Paren):
            return self.value(node.this)
        if isinstance(node, (e.And, e.Or)):  # a chain of them as a balanced tree (joined.balanced)
            operands = [self.boolean(operand) for operand in _chained(node, type(node))]
            return Value(conjunction(operands) if isinstance(node, e.And) else disjunction(operands), pa.bool_())
        if isinstance(node, e.Not):
            return Value(~self.boolean(node.this), pa.bool_())
        if type(node) in self.comparisons:
            return Value(self.compare(self.comparisons[type(node)], self.value(node.this), self.value(node.expression)),
                         pa.bool_())
        if isinstance(node, e.Between):
            subject = self.value(node.this)
            low, high = self.value(node.args["low"]), self.value(node.args["high"])
            return Value(self.compare("ge", subject, low) & self.compare("le", subject, high), pa.bool_())
        if isinstance(node, e.In):
            return Value(self.is_in(node), pa.bool_())
        if isinstance(node, e.Is):
            return Value(self.is_(node), pa.bool_())
        if isinstance(node, (e.Like, e.ILike)):
            return Value(self.like(node, escape=None), pa.bool_())
        if isinstance(node, e.Escape) and isinstance(node.this, (e.Like, e.ILike)):
            matched = self.like(node.this, escape=self.string_literal(node.expression, "ESCAPE"))
            return Value(~matched if node.this.args.get("negate") else matched, pa.bool_())
        if type(node) in self.arithmetic:
            return self.arithmetic_of(node)
        if isinstance(node, e.Neg):
            inner = self.value(node.this)
            if inner.is_literal and isinstance(inner.literal, (int, float)) and not isinstance(inner.literal, bool):
                return dataclasses.replace(self.literal(-inner.literal), text=_negated_text(inner.text),
                                           integer_type=inner.integer_type)
            self.need_numeric(inner, node)
            return Value(arrow_call("negate", [inner.expression]), inner.type)
        if isinstance(node, e.Column):
            return self.column(node)
        if isinstance(node, e.Literal):
            return self.number_or_string(node)
        if isinstance(node, e.Boolean):
            return self.literal(bool(node.this))
        if isinstance(node, e.Null):
            return Value(pc.scalar(None), None, None, True)
        if isinstance(node, e.Cast):
            return self.cast(node)
        if isinstance(node, (e.TimestampTrunc, e.DateTrunc)):
            return self.truncated(node)
        raise self.fail(f"{node.sql(dialect='duckdb')!r} is not supported (columns, literals, comparisons, "
                        "AND/OR/NOT, IN, BETWEEN, LIKE, IS NULL, CAST and + - * / are; functions are not)")

    # ------------------------------------------------------------------ leaves

    def column(self, node: Any) -> Value:
        if node.table:
            raise self.fail(f"{node.sql(dialect='duckdb')!r}: name a column without a table")
        name = node.name
        if name not in self.schema.names:
            folded = [n for n in self.schema.names if n.lower() == name.lower()]
            if len(folded) != 1:
                hint = f"; several differ only by case: {folded} (quote the one meant)" if folded else ""
                raise self.fail(f"no column {name!r}; the columns are {self.schema.names}{hint}")
            name = folded[0]
        field = self.schema.field(name)
        if self.computing and pat.is_unsigned_integer(field.type):
            raise self.fail(f"{name!r} is {field.type}: DuckDB's arithmetic of unsigned integers with "
                            "signed ones is not translated (signed integers and DOUBLE are)")
        if self.computing and _temporal(field.type) and not self.truncating:
            raise self.fail(f"{name!r} is {field.type}: a date or timestamp is computed only by date_trunc")
        self.read.add(name)
        return Value(pc.field(name), None if pat.is_null(field.type) else field.type)  # null: type not known

    def truncated(self, node: Any) -> Value:
        """``date_trunc('month', column)``: the column floored to the unit, as a TIMESTAMP (microseconds), the type
        DuckDB returns for dates and timestamps alike; weeks start on Monday, as ISO's and DuckDB's do."""
        unit = node.args.get("unit")
        name = (unit.name if unit is not None else "").lower()
        if name not in _TRUNCATED_UNITS:
            raise self.fail(f"date_trunc by {name!r} is not translated (units: {', '.join(_TRUNCATED_UNITS)})")
        self.truncating = True
        try:
            inner = self.value(node.this)
        finally:
            self.truncating = False
        if inner.is_literal or not _temporal(inner.type) or getattr(inner.type, "tz", None) is not None \
                or getattr(inner.type, "unit", None) == "ns":
            raise self.fail(f"{node.sql(dialect='duckdb')!r}: date_trunc of a date or of a timestamp column "
                            "in s, ms or us without time zone is translated (DuckDB truncates a zoned one in its "
                            "session's time zone, and rounds nanoseconds to microseconds first)")
        floored = arrow_call("date_trunc", [inner.expression], pc.RoundTemporalOptions(1, name))
        # checked: a date or a timestamp past TIMESTAMP's range is an error, as in DuckDB, never a wrapped value
        return Value(floored.cast(pa.timestamp("us"), safe=True), pa.timestamp("us"))

    def literal(self, value: Any, type: pa.DataType | None = None) -> Value:
        try:
            scalar = pa.scalar(value, type=type) if type is not None else pa.scalar(value)
        except (OverflowError, pa.ArrowInvalid):
            raise self.fail(f"the literal {value!r:.60} does not fit {type or 'a 64-bit number'}") from None
        return Value(pc.scalar(scalar), scalar.type, value, True)

    def number_or_string(self, node: Any) -> Value:
        if node.is_string:
            return Value(pc.scalar(node.this), pa.string(), node.this, True)
        text = node.this
        try:
            number: int | float = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                raise self.fail(f"{text!r} is not a number") from None
        return dataclasses.replace(self.literal(number), text=text)

    def string_literal(self, node: Any, what: str) -> str:
        if not (isinstance(node, self.exp.Literal) and node.is_string):
            raise self.fail(f"{what} takes a string literal, got {node.sql(dialect='duckdb')!r}")
        return node.this

    def cast(self, node: Any) -> Value:
        target = _arrow_type(node.to.this.name, self)
        if self.computing and not _numeric(target):
            raise self.fail(f"{node.sql(dialect='duckdb')!r}: a computed value casts to numbers only")
        inner = self.value(node.this)
        if inner.is_literal:
            if inner.literal is None:
                return Value(pc.scalar(pa.scalar(None, target)), target, None, True, typed=True)
            return dataclasses.replace(self.typed_literal(inner.literal, target, node), typed=True)
        if inner.type is not None and widens_losslessly(inner.type, target):
            return Value(inner.expression.cast(target, safe=False), target)
        raise self.fail(f"{node.sql(dialect='duckdb')!r}: a cast of a column from {inner.type} to {target} is not "
                        "translated exactly (casts of literals, and widening numeric casts of columns, are)")

    def typed_literal(self, value: Any, target: pa.DataType, node: Any) -> Value:
        """A literal as the type DuckDB would cast it to (CAST('2024-01-01' AS DATE), a string against a column)."""
        try:
            if pat.is_timestamp(target):
                return self.literal(_timestamp(value, target, self), target)
            if pat.is_date(target):
                parsed = dt.date.fromisoformat(value.strip()) if isinstance(value, str) else value
                if isinstance(parsed, dt.datetime):
                    parsed = parsed.date()
                return self.literal(parsed, target)
            if pat.is_boolean(target) and isinstance(value, str):
                lowered = value.strip().lower()
                if lowered not in ("true", "false", "t", "f", "1", "0"):
                    raise ValueError(value)
                return self.literal(lowered in ("true", "t", "1"), target)
            if pat.is_integer(target) and isinstance(value, float) and not value.is_integer():
                raise ValueError(f"{value} is not an integer")
            if pat.is_integer(target) and isinstance(value, str):
                return self.literal(int(value.strip()), target)
            if pat.is_floating(target) and isinstance(value, str):
                return self.literal(float(value.strip()), target)
            if _is_string(target):
                if not isinstance(value, str):
                    raise ValueError("only a string literal compares with a string column exactly")
                return self.literal(value, target)
            return self.literal(pa.scalar(value).cast(target).as_py(), target)
        except InvalidFilter:
            raise
        except (ValueError, TypeError, OverflowError, pa.ArrowException) as exc:
            raise self.fail(f"{node.sql(dialect='duckdb') if node is not None else value!r} cannot be read as "
                            f"{target} ({exc})") from None

    # ------------------------------------------------------------------ comparisons

    def compare(self, op: str, left: Value, right: Value) -> pc.Expression:
        left, right = self.coerce(left, right)
        if any(t is not None and pat.is_timestamp(t) and t.unit == "ns" for t in (left.type, right.type)):
            left, right = _as_nanoseconds(left), _as_nanoseconds(right)  # Substrait has no nanosecond literal
        plain = arrow_call(op, [left.expression, right.expression])
        if not (_floating(left.type) or _floating(right.type)):
            return plain
        return _nan_ordered(op, plain, (_nan_test(left), left.expression.is_valid()),
                            (_nan_test(right), right.expression.is_valid()))

    def coerce(self, left: Value, right: Value) -> tuple[Value, Value]:
        """The two sides of a comparison as DuckDB compares them: a literal takes the other side's type; temporal
        columns of different units meet at the finer one; a decimal column and a number meet as decimals."""
        if _decimal(left.type) and not left.is_literal and right.is_literal and _plain_number(right.literal):
            return self.decimal_and_number(left, right)
        if _decimal(right.type) and not right.is_literal and left.is_literal and _plain_number(left.literal):
            column, number = self.decimal_and_number(right, left)
            return number, column
        if _numeric(left.type) and _numeric(right.type):
            return self.same_number_type(left, right)
        if left.is_literal and not right.is_literal and right.type is not None:
            left = self.literal_as(left, right.type)
        elif right.is_literal and not left.is_literal and left.type is not None:
            right = self.literal_as(right, left.type)
        if left.type is not None and right.type is not None and left.type != right.type:
            if _numeric(left.type) and _numeric(right.type):
                return self.same_number_type(left, right)
            if _temporal(left.type) and _temporal(right.type):
                common = _finer_temporal(left.type, right.type, self)
                return self.widen(left, common), self.widen(right, common)
            if _is_string(left.type) and _is_string(right.type) and left.type != right.type:
                return self.widen(left, pa.large_string()), self.widen(right, pa.large_string())
            if ((_is_string(left.type) or _is_string(right.type))
                    and not (_is_string(left.type) and _is_string(right.type))):
                if not (pat.is_null(left.type) or pat.is_null(right.type)):
                    raise self.fail(f"a {left.type} compared with a {right.type}: cast one side (CAST(x AS "
                                    "VARCHAR) is not translated; compare with a literal of the column's type)")
        return left, right

    def decimal_and_number(self, column: Value, literal: Value) -> tuple[Value, Value]:
        """A decimal column and a number literal in one decimal type holding both exactly, as DuckDB compares them (the
        column widened if the literal needs more places). A literal DuckDB reads as DOUBLE is refused."""
        number = literal.literal
        if isinstance(number, float) and (literal.typed or literal.text is None
                                          or not DECIMAL_TEXT.match(literal.text)):
            # a DOUBLE to DuckDB (1e-1, CAST(0.1 AS DOUBLE)), which compares the column as a double: Arrow's cast of a
            # decimal to a double rounds otherwise than DuckDB's (0.1 as DECIMAL(38, 20) is not 0.1 after it)
            raise self.fail(f"a {column.type} column compared with the DOUBLE {number!r} is not translated exactly: "
                            "write the number with digits and a point (0.1, not 1e-1 or CAST(0.1 AS DOUBLE))")
        value = decimal.Decimal(literal.text if literal.text is not None else str(number))
        kind: Any = column.type
        _sign, digits, exponent = value.as_tuple()
        if not isinstance(exponent, int):
            raise self.fail(f"{literal.text or number!r} is not a finite number")
        places = max(kind.scale, -exponent)
        whole = max(kind.precision - kind.scale, len(digits) + exponent)
        if whole + places > MAX_DECIMAL_DIGITS:
            raise self.fail(f"{number!r} compared with a {kind} column needs a decimal of {whole + places} digits, "
                            f"more than the {MAX_DECIMAL_DIGITS} a filter carries to the nodes")
        common = pa.decimal128(whole + places, places)
        widened = column if common == kind else Value(column.expression.cast(common, safe=False), common)
        return widened, self.literal(value, common)

    def literal_as(self, literal: Value, target: pa.DataType) -> Value:
        if literal.literal is None:
            return literal
        if literal.type is not None and _temporal(literal.type) and _temporal(target):
            if literal.type == target:
                return literal
            common = _finer_temporal(literal.type, target, self)
            if common == target:
                return self.typed_literal(literal.literal, target, None)
            return literal  # the literal is finer: the column is widened by the caller's comparison
        if _temporal(target) or _is_string(target) or pat.is_boolean(target):
            if isinstance(literal.literal, str) or _is_string(target) or pat.is_boolean(target):
                return self.typed_literal(literal.literal, target, None)
            raise self.fail(f"{literal.literal!r} compared with a {target} column: write a literal of that type")
        if (pat.is_integer(target) or pat.is_floating(target)) and isinstance(literal.literal, str):
            return self.typed_literal(literal.literal, target, None)
        if _numeric(target) and literal.type is not None and _numeric(literal.type):
            return self.same_number_type(literal, Value(pc.scalar(0), target))[0]
        return literal

    def same_number_type(self, left: Value, right: Value) -> tuple[Value, Value]:
        """Two numbers in one type, cast explicitly (Arrow's implicit casts are checked and cannot travel as Substrait):
        a literal takes the column's integer type when it fits, integers meet floats as float64, integers widen."""
        a: Any = left.type
        b: Any = right.type
        if a == b:
            return left, right
        if pat.is_integer(a) and pat.is_integer(b):
            for lit, other in ((left, right), (right, left)):
                if lit.is_literal and not other.is_literal and _fits(lit.literal, other.type):
                    typed = self.literal(lit.literal, other.type)
                    return (typed, right) if lit is left else (left, typed)
            if (a == pa.uint64() and pat.is_signed_integer(b)) or (b == pa.uint64() and pat.is_signed_integer(a)):
                raise self.fail("a UBIGINT meets a signed integer: int64 cannot hold both (DuckDB computes in a "
                                "wider type), not translated")
            wide = (pa.int64() if pat.is_signed_integer(a) or pat.is_signed_integer(b)
                    or 64 in (a.bit_width, b.bit_width) else pa.uint64())
            if pat.is_unsigned_integer(a) and pat.is_unsigned_integer(b):
                wide = a if a.bit_width >= b.bit_width else b
            return self.widen(left, wide), self.widen(right, wide)
        for lit, other in ((left, right), (right, left)):
            if (lit.is_literal and not lit.typed and other.type == pa.float32() and not other.is_literal
                    and isinstance(lit.literal, float)):  # DuckDB and Polars read a bare decimal as the FLOAT's type
                typed = self.literal(lit.literal, pa.float32())
                return (typed, right) if lit is left else (left, typed)
        return self.widen(left, pa.float64()), self.widen(right, pa.float64())

    def widen(self, value: Value, target: pa.DataType) -> Value:
        if value.type == target:
            return value
        if value.is_literal:
            return self.typed_literal(value.literal, target, None)
        return Value(value.expression.cast(target, safe=False), target)

    def is_in(self, node: Any) -> pc.Expression:
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise self.fail("IN takes a list of literals, not a query")
        if len(node.expressions) > MAX_IN_VALUES:
            raise self.fail(f"an IN list of {len(node.expressions):,} values, more than the {MAX_IN_VALUES:,} sent to "
                            "the nodes")
        subject = self.value(node.this)
        items = [self.value(item) for item in node.expressions]
        if not items or not all(item.is_literal for item in items):
            raise self.fail("IN takes a list of literals, e.g. zone IN ('JFK', 'LGA')")
        has_null = any(item.literal is None for item in items)
        values = [item for item in items if item.literal is not None]
        if subject.is_literal:
            raise self.fail("IN tests a column, e.g. zone IN ('JFK', 'LGA')")
        found = self.member(subject, values)
        if has_null:  # x IN (..., NULL) is TRUE where found, else NULL (never FALSE)
            found = pc.if_else(found, pc.scalar(True), _NULL_BOOL)
        return found

    def member(self, subject: Value, values: list[Value]) -> pc.Expression:
        """``subject`` equal to one of ``values`` (literals, none NULL): NULL where ``subject`` is NULL."""
        if subject.type is None:
            found = subject.expression.isin([v.literal for v in values])
            found = pc.if_else(subject.expression.is_null(), _NULL_BOOL, found)
        elif _floating(subject.type) or any(_floating(v.type) for v in values) or _temporal(subject.type):
            terms = [self.compare("eq", subject, v) for v in values]  # NaN and units as comparisons treat them
            found = disjunction(terms) if terms else pc.scalar(False)
        else:
            typed = [self.literal_as(v, subject.type).literal for v in values]
            try:
                value_set = pa.array(typed, type=subject.type if not _is_string(subject.type) else pa.string())
            except (pa.ArrowException, TypeError, ValueError) as exc:
                raise self.fail(f"the IN list does not fit column {subject.type} ({exc})") from None
            column = (subject.expression if subject.type != pa.large_string()
                      else subject.expression.cast(pa.string(), safe=False))
            found = pc.if_else(subject.expression.is_null(), _NULL_BOOL, column.isin(value_set))
        return found

    def is_(self, node: Any) -> pc.Expression:
        subject = self.value(node.this)
        target = node.expression
        if isinstance(target, self.exp.Null):
            return subject.expression.is_null()
        if isinstance(target, self.exp.Boolean):
            if subject.type is not None and not pat.is_boolean(subject.type):
                raise self.fail(f"IS TRUE / IS FALSE tests a condition, not a {subject.type}")
            condition = subject.expression if target.this else ~subject.expression
            return pc.coalesce(condition, pc.scalar(False))
        raise self.fail("IS compares with NULL, TRUE or FALSE (IS NOT DISTINCT FROM is not translated)")

    def like(self, node: Any, escape: str | None) -> pc.Expression:
        subject = self.value(node.this)
        if subject.type is None or not _is_string(subject.type):
            raise self.fail(f"LIKE matches a string column, not {subject.type}")
        pattern = self.string_literal(node.expression, "LIKE")
        ignore_case = isinstance(node, self.exp.ILike)
        if ignore_case and not pattern.isascii():
            raise self.fail("ILIKE with letters beyond ASCII is not translated exactly (case folding "
                            "differs); use LIKE")
        pieces = _like_pieces(pattern, escape, self)
        column = subject.expression if subject.type == pa.string() else subject.expression.cast(pa.string(), safe=False)

        def call(function: str, text: str) -> pc.Expression:
            return arrow_call(function, [column], pc.MatchSubstringOptions(text, ignore_case=ignore_case))

        kind, text = pieces
        if kind == "exact":
            if ignore_case:
                raise self.fail(f"ILIKE {pattern!r} without '%' is not translated (prefix%, %suffix and %part% are)")
            return column == pc.scalar(text)
        return call({"prefix": "starts_with", "suffix": "ends_with", "contains": "contains"}[kind], text)

    # ------------------------------------------------------------------ arithmetic

    def arithmetic_of(self, node: Any) -> Value:
        left, right = self.value(node.this), self.value(node.expression)
        for side in (left, right):
            self.need_numeric(side, node)
        if not self.computing and _number_literal(left) is not None and _number_literal(right) is not None:
            return self.folded(node, left, right)
        function = self.arithmetic[type(node)]
        if self.computing:
            self.need_duckdb_arithmetic(left, right, node)
        if self.computing and function != "divide" and all(v.type is not None and pat.is_integer(v.type)
                                                           for v in (left, right)):
            left, right = self.duckdb_integers(left, right)  # overflows where DuckDB's does (not in filters: DuckDB
            # folds a filter's constants across its comparison, and never computes the product that would overflow)
            return Value(arrow_call(function, [left.expression, right.expression]), left.type)
        if left.type is not None and right.type is not None:
            left, right = self.same_number_type(left, right)
        lhs, rhs = left.expression, right.expression
        if function == "divide":  # SQL's / divides integers as decimals do (7 / 2 = 3.5)
            lhs = lhs if _floating(left.type) else lhs.cast(pa.float64(), safe=False)
            rhs = rhs if _floating(right.type) else rhs.cast(pa.float64(), safe=False)
            return Value(arrow_call("divide", [lhs, rhs]), pa.float64())
        result_type = pa.float64() if (_floating(left.type) or _floating(right.type)) else (left.type or right.type)
        return Value(arrow_call(function, [lhs, rhs]), result_type)

    def folded(self, node: Any, left: Value, right: Value) -> Value:
        """Arithmetic of two number literals (``price > 1 + 0.5``) folded to the literal DuckDB folds it to, or refused
        where DuckDB refuses it: INTEGER or BIGINT (overflowing where DuckDB's does), an exact DECIMAL of at most 38
        digits, or a DOUBLE (``/`` always; ``1 / 0`` infinite, ``0 / 0`` NaN)."""
        (kind_a, a), (kind_b, b) = _number_literal(left), _number_literal(right)  # type: ignore[misc]
        op = type(node)
        written = node.sql(dialect="duckdb")
        if op is self.exp.Div or "double" in (kind_a, kind_b):
            x, y = float(a), float(b)
            if op is self.exp.Div and y == 0:
                result = math.nan if x == 0 or math.isnan(x) else math.copysign(math.inf, x) * math.copysign(1.0, y)
            elif op is self.exp.Div:
                result = x / y
            else:
                result = x + y if op is self.exp.Add else x - y if op is self.exp.Sub else x * y
            return self.literal(result)  # a DOUBLE: no text
        exact_context = decimal.Context(prec=2 * MAX_DECIMAL_DIGITS + 2)  # exact for any two of 38 digits
        with decimal.localcontext(exact_context):
            exact = a + b if op is self.exp.Add else a - b if op is self.exp.Sub else a * b
        if kind_a == kind_b == "integer":
            wide = pa.int64() if pa.int64() in (_integer_type(left), _integer_type(right)) else pa.int32()
            if not _fits(int(exact), wide):
                raise self.fail(f"{written!r} overflows {'BIGINT' if wide == pa.int64() else 'INTEGER'}, as DuckDB "
                                "computes it")
            return dataclasses.replace(self.literal(int(exact)), text=str(int(exact)), integer_type=wide)
        scale = _scale(a) + _scale(b) if op is self.exp.Mul else max(_scale(a), _scale(b))
        _sign, digits, exponent = exact.as_tuple()
        if scale > MAX_DECIMAL_DIGITS or max(len(digits) - max(-exponent, 0), 0) + scale > MAX_DECIMAL_DIGITS:
            raise self.fail(f"{written!r} needs a decimal of more than {MAX_DECIMAL_DIGITS} digits, which DuckDB "
                            "refuses too")
        with decimal.localcontext(exact_context):  # as many places as DuckDB's type of it has
            text = format(exact.quantize(decimal.Decimal(1).scaleb(-scale)), "f")
        return dataclasses.replace(self.literal(float(exact)), text=text)

    def need_duckdb_arithmetic(self, left: Value, right: Value, node: Any) -> None:
        """A computed value's arithmetic only where Arrow's gives DuckDB's value: no FLOAT (DuckDB computes in
        FLOAT, not DOUBLE), no decimal literal beside integers only (DuckDB computes a DECIMAL)."""
        types = [v.type for v in (left, right)]
        if any(t is not None and pat.is_floating(t) and t != pa.float64() for t in types):
            raise self.fail(f"{node.sql(dialect='duckdb')!r}: arithmetic on FLOAT is not translated (DOUBLE is)")
        columns_floating = any(_floating(v.type) for v in (left, right) if not v.is_literal)
        if not columns_floating and any(v.is_literal and isinstance(v.literal, float) for v in (left, right)):
            raise self.fail(f"{node.sql(dialect='duckdb')!r}: a decimal literal with integers is computed as a DECIMAL "
                            "by DuckDB, not translated")
        if left.is_literal and right.is_literal:
            raise self.fail(f"{node.sql(dialect='duckdb')!r}: arithmetic of literals alone is not translated")
        if isinstance(node, self.exp.Mul) and any(v.is_literal and v.literal == 0 for v in (left, right)):
            raise self.fail(f"{node.sql(dialect='duckdb')!r}: a product with the literal 0 is not translated (Arrow "
                            "folds it to 0 where DuckDB may refuse an overflow of the other factor)")

    def duckdb_integers(self, left: Value, right: Value) -> tuple[Value, Value]:
        """Two signed integers in the type DuckDB computes them in: a literal takes the other side's type when it fits,
        else INTEGER or BIGINT; then the wider of the two, so a checked operation overflows where DuckDB's does."""
        def own(value: Value, other: Value) -> pa.DataType:
            if not value.is_literal or value.typed:
                return value.type
            if _fits(value.literal, other.type):  # (two literals never meet here: refused before)
                return other.type
            return pa.int32() if _fits(value.literal, pa.int32()) else pa.int64()

        types = [own(left, right), own(right, left)]
        target = max(types, key=lambda t: t.bit_width)
        return self.widen(left, target), self.widen(right, target)

    def need_numeric(self, value: Value, node: Any) -> None:
        if value.type is not None and not (pat.is_integer(value.type) or pat.is_floating(value.type)):
            raise self.fail(f"{node.sql(dialect='duckdb')!r}: arithmetic on {value.type} is not "
                            "translated (numbers only)")


# ---------------------------------------------------------------------- helpers


def _is_string(t: pa.DataType | None) -> bool:
    return t is not None and (pat.is_string(t) or pat.is_large_string(t) or pat.is_string_view(t))


DECIMAL_TEXT = re.compile(r"^-?(\d+\.?\d*|\.\d+)$")
"""A number literal DuckDB reads as a DECIMAL (an integer, or digits with a point): one with an exponent is a DOUBLE."""
MAX_DECIMAL_DIGITS = 38
"""The most digits of a decimal a filter carries to the nodes (Substrait's decimals are 128-bit)."""


def _negated_text(text: str | None) -> str | None:
    """A number literal's text negated (``- -10`` is ``10``)."""
    if text is None:
        return None
    return text[1:] if text.startswith("-") else f"-{text}"


def _number_literal(value: Value) -> tuple[str, Any] | None:
    """A number literal as DuckDB types it, with its value: ``("integer", Decimal)``, ``("decimal", Decimal)`` or
    ``("double", float)``; None for anything else."""
    if not value.is_literal or value.typed or not _plain_number(value.literal):
        return None
    if isinstance(value.literal, int):
        return "integer", decimal.Decimal(value.literal)
    if value.text is not None and DECIMAL_TEXT.match(value.text):
        return "decimal", decimal.Decimal(value.text)
    return "double", value.literal


def _integer_type(value: Value) -> pa.DataType:
    """DuckDB's type of an integer literal: INTEGER where its digits fit one (``-2147483648`` is a BIGINT
    negated), else BIGINT; a folded one keeps the type it was folded in."""
    if value.integer_type is not None:
        return value.integer_type
    return pa.int32() if abs(value.literal) <= (1 << 31) - 1 else pa.int64()


def _scale(value: decimal.Decimal) -> int:
    """The places after the point of a decimal literal as written (``1.50``: 2; an integer: 0)."""
    exponent = value.as_tuple().exponent
    return max(-exponent, 0) if isinstance(exponent, int) else 0


def _decimal(t: pa.DataType | None) -> bool:
    return t is not None and pat.is_decimal(t)


def _plain_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numeric(t: pa.DataType | None) -> bool:
    return t is not None and (pat.is_integer(t) or pat.is_floating(t))


def _fits(value: Any, t: pa.DataType) -> bool:
    """Whether an integer literal is a value of integer type ``t``."""
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    bits = t.bit_width
    if pat.is_signed_integer(t):
        return -(1 << (bits - 1)) <= value < (1 << (bits - 1))
    return 0 <= value < (1 << bits)


_TRUNCATED_UNITS = ("year", "quarter", "month", "week", "day", "hour", "minute", "second", "millisecond", "microsecond")
"""The units of ``date_trunc`` Arrow's ``floor_temporal`` computes as DuckDB does."""


def _floating(t: pa.DataType | None) -> bool:
    return t is not None and pat.is_floating(t)


def _temporal(t: pa.DataType | None) -> bool:
    return t is not None and (pat.is_timestamp(t) or pat.is_date(t))


_UNITS = {"s": 0, "ms": 1, "us": 2, "ns": 3}


def _finer_temporal(a: pa.DataType, b: pa.DataType, tr: _Translator) -> pa.DataType:
    """The type two temporal values compare in: dates meet timestamps as timestamps, the finer unit, two zones in
    UTC. A zoned and a naive timestamp do not meet: refused."""
    zones = {getattr(t, "tz", None) for t in (a, b) if pat.is_timestamp(t)}
    if len(zones) > 1 and None not in zones:  # two zones: the same instants, compared in UTC
        zones = {"UTC"}
    if len(zones) > 1:
        raise tr.fail("a timestamp with a time zone compared with one without: write the literal with its offset, "
                      "e.g. TIMESTAMPTZ '2024-01-01 00:00:00+00'")
    if pat.is_date(a) and pat.is_date(b):
        return pa.date32() if a == b or pat.is_date32(a) or pat.is_date32(b) else a
    units = [t.unit for t in (a, b) if pat.is_timestamp(t)]
    if any(pat.is_date(t) for t in (a, b)) and zones != {None}:
        raise tr.fail("a date compared with a timestamp with a time zone: compare with a TIMESTAMPTZ literal instead")
    unit = max(units, key=_UNITS.__getitem__)
    return pa.timestamp(unit, tz=next(iter(zones)))


_BEYOND_MICROSECONDS = re.compile(r"[.,]\d{6}(\d+)")


def _timestamp(value: Any, target: pa.DataType, tr: _Translator) -> dt.datetime:
    if isinstance(value, dt.datetime):
        parsed = value
    elif isinstance(value, dt.date):
        parsed = dt.datetime(value.year, value.month, value.day)
    else:
        text = str(value).strip()
        finer = _BEYOND_MICROSECONDS.search(text)
        if finer and finer.group(1).strip("0"):  # Python's parser drops them: compared, that is another instant
            raise tr.fail(f"{value!r} is finer than a microsecond: not translated")
        try:
            parsed = dt.datetime.fromisoformat(text)
        except ValueError:
            parsed = dt.datetime.fromisoformat(_iso_offset(text))
    zoned = parsed.tzinfo is not None
    if target.tz is None and zoned:
        raise tr.fail(f"{value!r} has a time zone but is compared with a timestamp without one")
    if target.tz is not None and not zoned:
        raise tr.fail(f"{value!r} has no time zone but is compared with a timestamp in {target.tz}: add its offset "
                      "(TIMESTAMPTZ '2024-01-01 00:00:00+00')")
    if target.unit != "ns" and parsed.microsecond and target.unit in ("s", "ms"):
        pass  # the comparison widens the column (see _finer_temporal); the literal keeps its fraction
    return parsed


def _iso_offset(text: str) -> str:
    """``+02`` as Python wants it (``+02:00``)."""
    if len(text) >= 3 and text[-3] in "+-" and text[-2:].isdigit():
        return text + ":00"
    return text


def _arrow_type(name: str, tr: _Translator) -> pa.DataType:
    types: dict[str, Callable[[], pa.DataType]] = {
        "TINYINT": pa.int8, "SMALLINT": pa.int16, "INT": pa.int32, "BIGINT": pa.int64, "UTINYINT": pa.uint8,
        "USMALLINT": pa.uint16, "UINT": pa.uint32, "UBIGINT": pa.uint64, "FLOAT": pa.float32, "DOUBLE": pa.float64,
        "VARCHAR": pa.string, "TEXT": pa.string, "BOOLEAN": pa.bool_, "DATE": pa.date32,
        "TIMESTAMP": lambda: pa.timestamp("us"), "TIMESTAMPNTZ": lambda: pa.timestamp("us"),
        "DATETIME": lambda: pa.timestamp("us"),
        "TIMESTAMPTZ": lambda: pa.timestamp("us", tz="UTC"), "TIMESTAMP_S": lambda: pa.timestamp("s"),
        "TIMESTAMP_MS": lambda: pa.timestamp("ms"), "TIMESTAMP_NS": lambda: pa.timestamp("ns"),
    }
    if name not in types:
        raise tr.fail(f"casts to {name} are not translated (numbers, VARCHAR, BOOLEAN, DATE and TIMESTAMP[TZ] are)")
    return types[name]()


def _as_nanoseconds(value: Value) -> Value:
    """A nanosecond timestamp as its int64 count since the epoch: compared exactly, and a literal Substrait can
    carry."""
    if value.is_literal:
        if value.literal is None:
            return Value(pc.scalar(pa.scalar(None, pa.int64())), pa.int64(), None, True)
        count = pa.scalar(value.literal, value.type).cast(pa.int64()).as_py()
        return Value(pc.scalar(count), pa.int64(), count, True)
    return Value(value.expression.cast(pa.int64(), safe=False), pa.int64())


def _nan_test(value: Value) -> pc.Expression:
    if value.is_literal:  # known now: no is_nan left for the nodes (nor in the way of pruning by statistics)
        return pc.scalar(isinstance(value.literal, float) and math.isnan(value.literal))
    return pc.is_nan(value.expression) if _floating(value.type) else pc.scalar(False)


def _nan_ordered(op: str, plain: pc.Expression, left: tuple[pc.Expression, pc.Expression],
                 right: tuple[pc.Expression, pc.Expression]) -> pc.Expression:
    """A comparison in DuckDB's order of floats: NaN is greater than every number and equal to NaN; a NULL on
    either side still gives NULL (``left``/``right``: is-NaN and is-valid of each side)."""
    (left_nan, left_valid), (right_nan, right_valid) = left, right
    both = _both(left_nan, right_nan)
    if op == "eq":
        return _either(plain, both)
    if op == "ne":
        return _both(plain, _not(both))
    if op == "gt":
        return _either(plain, _both(left_nan, _not(right_nan)))
    if op == "ge":
        return _either(plain, _both(left_nan, right_valid))
    if op == "lt":
        return _either(plain, _both(_not(left_nan), right_nan))
    return _either(plain, _both(right_nan, left_valid))  # le


_TRUE, _FALSE = pc.scalar(True), pc.scalar(False)


def _both(a: pc.Expression, b: pc.Expression) -> pc.Expression:
    """``a AND b``, folded where a side is a known TRUE or FALSE, since every call left in a filter doubles its size
    (:func:`~flightpart.query.filters.substrait_bound`)."""
    if a.equals(_FALSE) or b.equals(_FALSE):
        return _FALSE
    return b if a.equals(_TRUE) else a if b.equals(_TRUE) else a & b


def _either(a: pc.Expression, b: pc.Expression) -> pc.Expression:
    """``a OR b``, folded as :func:`_both` (``x OR FALSE`` is ``x``, NULL included)."""
    if a.equals(_TRUE) or b.equals(_TRUE):
        return _TRUE
    return b if a.equals(_FALSE) else a if b.equals(_FALSE) else a | b


def _not(a: pc.Expression) -> pc.Expression:
    return _FALSE if a.equals(_TRUE) else _TRUE if a.equals(_FALSE) else ~a


def _like_pieces(pattern: str, escape: str | None, tr: _Translator) -> tuple[str, str]:
    """A LIKE pattern as the one test the nodes evaluate exactly: ``abc`` (exact), ``abc%`` (prefix), ``%abc``
    (suffix), ``%abc%`` (contains); others (``_``, inner ``%``) are refused rather than guessed."""
    if escape is not None and len(escape) != 1:
        raise tr.fail(f"ESCAPE takes one character, got {escape!r}")
    tokens: list[tuple[str, str]] = []  # ("lit", c) or ("any", "%") or ("one", "_")
    k = 0
    while k < len(pattern):
        c = pattern[k]
        if escape is not None and c == escape:
            if k + 1 >= len(pattern):
                raise tr.fail(f"LIKE pattern {pattern!r} ends with its escape character")
            tokens.append(("lit", pattern[k + 1]))
            k += 2
            continue
        tokens.append(("any", c) if c == "%" else ("one", c) if c == "_" else ("lit", c))
        k += 1
    if any(kind == "one" for kind, _ in tokens):
        raise tr.fail(f"LIKE pattern {pattern!r}: '_' is not translated (prefix%, %suffix, %part% and "
                      "exact patterns are)")
    lead = 0
    while lead < len(tokens) and tokens[lead][0] == "any":
        lead += 1
    trail = len(tokens)
    while trail > lead and tokens[trail - 1][0] == "any":
        trail -= 1
    middle = tokens[lead:trail]
    if any(kind == "any" for kind, _ in middle):
        raise tr.fail(f"LIKE pattern {pattern!r}: a '%' inside the text is not translated (prefix%, "
                      "%suffix, %part% are)")
    text = "".join(c for _, c in middle)
    starts, ends = lead > 0, trail < len(tokens)
    if not starts and not ends:
        return "exact", text
    if starts and ends:
        return "contains", text
    return ("suffix", text) if starts else ("prefix", text)
