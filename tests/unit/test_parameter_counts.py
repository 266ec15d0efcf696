"""No function takes more than eight parameters: a longer list is a value waiting to be named.

``self`` and ``cls`` are not counted; ``*args`` and ``**kwargs`` count one each. What is left over eight is listed
in :data:`ALLOWED`, each with why, and an entry that no longer needs its place fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("flightpart", "server", "client")
MOST = 8
ALLOWED = {
    # flightpart.connect and flightpart.client.connect: public API whose keywords (token=, tls_root_certs=, ...)
    # docs/api.md documents and users call; folding them into **kwargs would only hide them from type checkers
    "connect",
}


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = function.args
    named = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if x.arg not in ("self", "cls")]
    return len(named) + (a.vararg is not None) + (a.kwarg is not None)


def long_functions() -> dict[str, list[str]]:
    """Qualified name -> where each function of that name over :data:`MOST` parameters is (path:line, count)."""
    found: dict[str, list[str]] = {}

    def visit(node: ast.AST, prefix: str, path: Path) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                if parameters(child) > MOST:
                    found.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{child.lineno} ({parameters(child)})")
                visit(child, f"{name}.", path)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", path)
            else:
                visit(child, prefix, path)

    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            visit(ast.parse(path.read_text(), str(path)), "", path)
    return found


def test_no_function_takes_more_than_eight_parameters():
    over = long_functions()
    assert {name: where for name, where in over.items() if name not in ALLOWED} == {}


def test_the_allowed_list_only_shrinks():
    assert sorted(ALLOWED - set(long_functions())) == [], "these take 8 or fewer now: strike them from ALLOWED"
