"""Every Python example in the README and docs/ runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)

EXAMPLES = [(doc, k, code) for doc in DOCS for k, code in enumerate(BLOCK.findall(doc.read_text()))]


@pytest.mark.parametrize("doc,k,code", EXAMPLES, ids=[f"{d.relative_to(ROOT)}#{k}" for d, k, _ in EXAMPLES])
def test_example_runs(doc, k, code):
    exec(compile(code, f"{doc.name}#{k}", "exec"), {"__name__": "__docs__"})


def test_there_are_examples():
    assert len(EXAMPLES) >= 2
