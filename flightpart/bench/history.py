"""Which code a bench run measured, and the runs kept before it: the noise *between* runs of one code.

The spread of a case's figures within one run (its 7 alternated runs) understates how far two whole runs of the
same code lie apart on one machine: which CPU a daemon lands on, the page cache, the allocator's state after
start-up differ from one start of the cluster to the next. Two runs of identical code have shown a read's ratio
move by 12 % and a put's by a third, where the spread inside each run was 8 %. So each run names the code it
measured (a digest of the package's sources and pyarrow's version), and a run saved after a comparison carries
the figures of the runs kept before it. Runs of one code, however many were kept, give the noise between runs;
runs of different code are never mixed into it (a real change would pass for noise).
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

KEPT = 24
"""Earlier runs a saved run carries (the oldest dropped first)."""

_PACKAGES = ("flightpart", "flightpart.server", "flightpart.client")
_NOT_MEASURED = ("bench/compare.py", "bench/history.py", "cli/bench.py")
"""Sources that only decide what is shown and saved of a run (never what is measured): left out of the digest, so
changing how runs are compared does not make the same measured code look new."""


def code_digest() -> str:
    """A digest of every source file the bench measures (by path and content) and of pyarrow's version."""
    digest = hashlib.sha256(f"pyarrow {pa.__version__}\n".encode())
    for name, path in sorted(_sources()):
        digest.update(f"{name}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def stamp(run: dict) -> dict:
    """``run``, named with when it was taken and the code it measured (:func:`code_digest`)."""
    run.setdefault("taken", datetime.now(UTC).isoformat(timespec="seconds"))
    run.setdefault("code", code_digest())
    return run


def _sources() -> Iterable[tuple[str, Path]]:
    seen: set[Path] = set()
    for package in _PACKAGES:
        root = Path(next(iter(importlib.import_module(package).__path__)))
        for path in root.rglob("*.py"):
            real = path.resolve()
            relative = path.relative_to(root).as_posix()
            if real in seen or relative in _NOT_MEASURED:
                continue
            seen.add(real)
            yield f"{package}/{relative}", path


def figures(run: dict) -> dict[str, float]:
    """Each case's figure, as a comparison judges it: its speed ratio against its baseline, else its median."""
    out = {}
    for case in run.get("cases", []):
        if case.get("ratio_of") and case.get("speed_ratio"):
            out[case["case"]] = float(case["speed_ratio"])
        elif case.get("median_seconds"):
            out[case["case"]] = float(next(iter(case["median_seconds"].values())))
    return out


def entry(run: dict) -> dict:
    """What a later run keeps of ``run``: when it was taken, its code and its figures."""
    return {"taken": run.get("taken"), "code": run.get("code"), "figures": figures(run)}


def carried(old: dict) -> list[dict]:
    """The history a run compared with ``old`` keeps: ``old``'s own, then ``old`` itself (the last :data:`KEPT`)."""
    earlier = [e for e in old.get("history") or [] if isinstance(e, dict) and isinstance(e.get("figures"), dict)]
    return (earlier + [entry(old)])[-KEPT:]


def noise_between_runs(case: str, runs: Sequence[dict]) -> tuple[float, int]:
    """How far ``case``'s figure moved between runs of one code (the widest such move: highest over lowest, less
    one), and how many runs that was seen in (0 when no two runs of one code have the case)."""
    by_code: dict[str, list[float]] = {}
    for run in runs:
        value = run.get("figures", {}).get(case)
        if run.get("code") and isinstance(value, (int, float)) and value > 0:
            by_code.setdefault(run["code"], []).append(float(value))
    widest, seen = 0.0, 0
    for values in by_code.values():
        if len(values) >= 2:
            widest = max(widest, max(values) / min(values) - 1)
            seen += len(values)
    return widest, seen
