"""Which code a bench run measured, and the runs kept before it: the noise *between* runs of one code.

The spread of a case's figures within one run (its 7 alternated runs) understates how far two whole runs of the
same code lie apart on one machine: which CPU a daemon lands on, the page cache, the allocator's state after
start-up differ from one start of the cluster to the next. Two runs of identical code have shown a read's ratio
move by 12 % and a put's by a third, where the spread inside each run was 8 %. So each run names the code it
measured (a digest of the package's sources, the versions of what it runs on and the machine's size), and a run
saved after a comparison carries the figures of the runs kept before it. Runs of one code and one size, however
many were kept, give the noise between runs; runs of different code or size are never mixed into it (a real
change would pass for noise), nor is the run being judged (a run would excuse its own change).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

KEPT = 24
"""Earlier runs a saved run carries (the oldest dropped first)."""

_PACKAGES = ("flightpart", "flightpart.server", "flightpart.client")
_NOT_MEASURED = ("bench/compare.py", "bench/history.py", "cli/bench.py")
"""Sources that only decide what is shown and saved of a run (never what is measured): left out of the digest, so
changing how runs are compared does not make the same measured code look new."""


RUNS_ON = ("pyarrow", "numpy", "pandas", "polars", "duckdb", "dask", "distributed", "ray", "grpcio")
"""Distributions whose versions are part of a run's code: an upgrade of one changes what is measured."""


def code_digest() -> str:
    """A digest of every source file the bench measures (by path and content), of the versions of Python and of
    :data:`RUNS_ON`, and of the machine's CPUs and memory."""
    digest = hashlib.sha256(_runs_on().encode())
    for name, path in sorted(_sources()):
        digest.update(f"{name}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _runs_on() -> str:
    versions = []
    for name in RUNS_ON:
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} -")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return (f"python {sys.version.split()[0]}\n" + "\n".join(versions)
            + f"\ncpus {os.cpu_count()} memory {memory >> 30} GiB\n")


def stamp(run: dict, code: str | None = None) -> dict:
    """``run``, named with when it was taken and the code it measured: ``code`` (the :func:`code_digest` taken when
    it started, so a file edited while it ran does not name it) or the digest now."""
    run.setdefault("taken", datetime.now(UTC).isoformat(timespec="seconds"))
    run.setdefault("code", code or code_digest())
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
    """What a later run keeps of ``run``: when it was taken, its code, its size and its figures."""
    return {"taken": run.get("taken"), "code": run.get("code"), "size_bytes": run.get("size_bytes"),
            "quick": bool(run.get("quick")), "figures": figures(run)}


def carried(old: dict) -> list[dict]:
    """The history a run compared with ``old`` keeps: ``old``'s own, then ``old`` itself (the last :data:`KEPT`).
    A history that is not a list of runs' entries (a file edited by hand) is left out, not a traceback."""
    history = old.get("history")
    earlier = [e for e in history if isinstance(e, dict) and isinstance(e.get("figures"), dict)] \
        if isinstance(history, list) else []
    return (earlier + [entry(old)])[-KEPT:]


def noise_between_runs(case: str, runs: Sequence[dict]) -> tuple[float, int]:
    """How far ``case``'s figure moved between runs of one code and one size (the widest such move: highest over
    lowest, less one), and how many runs that was seen in (0 when no two such runs have the case)."""
    by_code: dict[tuple, list[float]] = {}
    for run in runs:
        value = run.get("figures", {}).get(case)
        if run.get("code") and isinstance(value, (int, float)) and value > 0:
            by_code.setdefault((run["code"], run.get("size_bytes"), bool(run.get("quick"))), []).append(float(value))
    widest, seen = 0.0, 0
    for values in by_code.values():
        if len(values) >= 2:
            widest = max(widest, max(values) / min(values) - 1)
            seen += len(values)
    return widest, seen
