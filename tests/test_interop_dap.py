"""flightpart and the Distributed Array Protocol's reference validators agree, version by version.

The reference is enthought/distributed-array-protocol: ``validator.py`` at
HEAD checks 0.10.0, ``validator/validator.py`` at tag rel-0.9.0 checks 0.9.0
(and 1.0.0, as its own tests label their dicts). The repository is read from
a git directory given by ``FLIGHTPART_DAP_REPO`` (a clone or a mirror); the
tests are skipped, saying so, where it is not there. Its code runs here; none
of it is part of flightpart.

Both directions: every ``__distarray__`` flightpart exports passes the
validator of its version, and the repository's own test suites pass with
flightpart's validator standing in for theirs (every example they call valid
flightpart accepts, every one they refuse flightpart refuses).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import types
import unittest
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart import distarray

BUNDLE = (Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "distributed-array-protocol"
          / "repo.bundle")


def reference_repo() -> Path:
    """A git directory of enthought/distributed-array-protocol: ``$FLIGHTPART_DAP_REPO``, else a bare clone of the
    bundle in ``../shared/reference`` (its README says how), made once per test run."""
    if os.environ.get("FLIGHTPART_DAP_REPO"):
        return Path(os.environ["FLIGHTPART_DAP_REPO"])
    target = Path(tempfile.gettempdir()) / f"flightpart-dap-reference-{os.getuid()}"
    if BUNDLE.exists() and not (target / "HEAD").exists():
        subprocess.run(["git", "clone", "-q", "--bare", str(BUNDLE), str(target)], check=False, capture_output=True)
    return target


REPO = reference_repo()
SOURCES = {  # version label -> (revision, validator path, test suite path)
    "0.10.0": ("HEAD", "validator.py", "tests/test_validator.py"),
    "0.9.0": ("rel-0.9.0", "validator/validator.py", "validator/test_validator.py"),
}

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.skipif(
    not (REPO / "HEAD").exists() and not (REPO / ".git").exists(),
    reason=f"the reference repository enthought/distributed-array-protocol is not at {REPO} and {BUNDLE} is missing "
           "(set FLIGHTPART_DAP_REPO to a clone of it)",
)]


def source(revision: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", str(REPO if (REPO / "HEAD").exists() else REPO / ".git"), "show",
                           f"{revision}:{path}"], capture_output=True, text=True, check=True).stdout


def module(name: str, text: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # distutils, which the validators import
        exec(compile(text, f"<{name}>", "exec"), mod.__dict__)
    return mod


def reference(version: str) -> types.ModuleType:
    revision, path, _ = SOURCES[version]
    return module(f"dap_validator_{version.replace('.', '_')}", source(revision, path))


def exported(version: str) -> list[dict]:
    """What flightpart exports: ranks of a 2-column frame, with and without halo rows."""
    full = np.arange(40.0).reshape(20, 2)
    out = []
    for (left, right) in ((0, 0), (2, 1)):
        for r, (s, e) in enumerate([(0, 7), (7, 13), (13, 20)]):
            lo, hi = (left if r > 0 else 0), (right if r < 2 else 0)
            table = pa.table({"a": full[s - lo : e + hi, 0], "b": full[s - lo : e + hi, 1]})
            out.append(distarray.export_local(table, rank=r, nranks=3, start=s, global_rows=20, padding=(lo, hi),
                                              version=version))
    out.append(distarray.export_local(pa.table({"x": np.arange(5)}), rank=0, nranks=1, start=0, global_rows=5,
                                      version=version))
    return out


@pytest.mark.parametrize("version", list(SOURCES))
def test_every_export_passes_the_reference_validator_of_its_version(version):
    checker = reference(version)
    for dap in exported(version):
        assert dap["__version__"] == version
        ok, message = checker.validate(dap)
        assert ok, (message, dap["dim_data"])


def test_the_dataset_spmd_view_exports_what_the_reference_accepts():
    table = pa.table({"a": np.arange(30.0), "b": np.arange(30.0) * 2})
    with fp.connect() as client:
        client.put("dap", table, tiling=(3, 1))
        for version in SOURCES:
            for rank in range(3):
                dap = client.open("dap", rank=rank, nranks=3).__distarray__(version=version)
                ok, message = reference(version).validate(dap)
                assert ok, message
            assert fp.from_partitioned(distarray.to_partitioned(
                [client.open("dap", rank=r, nranks=3).__distarray__(version=version) for r in range(3)])).equals(
                pa.table({"0": table["a"], "1": table["b"]}))


def test_halos_of_the_spmd_view_export_as_padding_the_reference_accepts():
    table = pa.table({"a": np.arange(30.0), "b": np.arange(30.0) * 2})
    with fp.connect() as client:
        client.put("dap-halo", table, tiling=(3, 1))
        exports = [(version, client.open("dap-halo", rank=r, nranks=3, halo=(2, 1)).__distarray__(version=version))
                   for version in SOURCES for r in range(3)]
        # a periodic halo that wraps around the ends: 0.9 names it with its periodic flag
        exports += [("0.9.0", client.open("dap-halo", rank=r, nranks=3, halo=(1, 1), periodic=True)
                     .__distarray__(version="0.9.0")) for r in range(3)]
    for version, dap in exports:
        ok, message = reference(version).validate(dap)
        assert ok, (message, dap["dim_data"])
    assert [d["dim_data"][0]["padding"] for v, d in exports[:3]] == [(0, 1), (2, 1), (2, 0)]
    for version in SOURCES:  # and the padding is read back as halos: the owned rows import equal
        daps = [d for v, d in exports[:6] if v == version]
        assert fp.from_partitioned(distarray.to_partitioned(daps)).equals(pa.table({"0": table["a"], "1": table["b"]}))


class _Ours:
    """flightpart's validator with the reference's interface: ``validate(d) -> (ok, message)``."""

    @staticmethod
    def validate(dap: dict) -> tuple[bool, str]:
        try:
            distarray.validate(dap)
        except fp.PartitionedError as exc:
            return False, str(exc)
        return True, ""


def outcomes(version: str, validator: object, monkeypatch) -> dict[str, bool]:
    """Each test of the reference suite of ``version``: passed or not, with ``validator`` as its ``validator``."""
    revision, _, tests = SOURCES[version]
    monkeypatch.setitem(sys.modules, "validator", validator)
    suite_module = module(f"dap_tests_{version.replace('.', '_')}", source(revision, tests))
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromModule(suite_module).run(result)
    failed = {test.id().rsplit(".", 2)[-2:][0] + "." + test.id().rsplit(".", 1)[-1]
              for test, _ in result.failures + result.errors}
    ran = {test.id().rsplit(".", 2)[-2:][0] + "." + test.id().rsplit(".", 1)[-1]
           for test in _tests(unittest.defaultTestLoader.loadTestsFromModule(suite_module))}
    return {name: name not in failed for name in ran}


def _tests(suite: unittest.TestSuite) -> list:
    return [t for item in suite for t in (_tests(item) if isinstance(item, unittest.TestSuite) else [item])]


@pytest.mark.parametrize("version", list(SOURCES))
def test_the_reference_test_suite_judges_flightparts_validator_as_it_judges_its_own(version, monkeypatch):
    shim = types.ModuleType("validator")
    shim.validate = _Ours.validate
    ours = outcomes(version, shim, monkeypatch)
    theirs = outcomes(version, reference(version), monkeypatch)
    assert len(ours) >= 5 and set(ours) == set(theirs)
    assert {name: ok for name, ok in ours.items() if ok != theirs[name]} == {}
    assert sum(theirs.values()) >= len(theirs) - 1  # the 0.9 suite has one test that asserts True and then False


def examples(version: str, monkeypatch) -> list[dict]:
    """Every dict the reference suite of ``version`` calls valid (its own validator's verdict)."""
    checker = reference(version)
    seen: list[tuple[dict, bool]] = []

    def recording(dap):
        ok, message = checker.validate(dap)
        seen.append((dap, ok))
        return ok, message

    shim = types.ModuleType("validator")
    shim.validate = recording
    outcomes(version, shim, monkeypatch)
    return [dap for dap, ok in seen if ok]


@pytest.mark.parametrize("version", list(SOURCES))
def test_every_valid_example_of_the_reference_suites_imports_or_is_refused_with_a_code(version, monkeypatch):
    imported = []
    for dap in examples(version, monkeypatch):
        try:
            partitioned = distarray.to_partitioned([dap]).__partitioned__
        except fp.PartitionedError as exc:  # one rank of an array of several: the others are needed, and it says so
            assert "ranks" in str(exc) or "implies" in str(exc), exc
            continue
        assert sum(int(np.prod(p["shape"]))
                   for p in partitioned["partitions"].values()) == int(np.prod(partitioned["shape"]))
        imported.append((dap["dim_data"], partitioned["shape"]))
    # the two whole arrays among them: the {} alias (an empty buffer) and one periodic padded block
    if version == "0.10.0":
        assert sorted(shape for _dims, shape in imported) == [(0,), (10,)]
