"""The SQL service's functions are short enough to read whole: none in flightpart/sql/ runs over 60 lines.

A function's length is its lines from ``def`` to its last line, docstring included; a nested function counts on
its own and inside the one holding it. Read from the source with ``ast``; nothing is imported or run.
"""

from __future__ import annotations

import ast
from pathlib import Path

SQL = Path(__file__).resolve().parents[2] / "flightpart" / "sql"
MOST_LINES = 60


def long_functions(folder: Path, most: int = MOST_LINES) -> list[str]:
    """Each function under ``folder`` longer than ``most`` lines, as ``path:line name (n lines)``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > most:
                    found.append(f"{path.relative_to(folder)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_of_the_sql_service_is_over_60_lines():
    assert len(list(SQL.glob("*.py"))) > 10  # the folder is where it is: an empty walk would pass anything
    assert long_functions(SQL) == []
