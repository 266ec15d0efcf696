"""The distribution: subpackages import the same from an editable install and a wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = ("import flightpart, flightpart.server, flightpart.client, flightpart.runtimes; "
         "print(flightpart.server.__file__); print(flightpart.client.__file__)")


def run(args, **kwargs):
    done = subprocess.run(args, capture_output=True, text=True, timeout=240, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed:\n{done.stderr[-3000:]}"
    return done


def test_editable_install_maps_server_and_client_folders(tmp_path):
    out = run([sys.executable, "-c", PROBE], cwd=tmp_path).stdout.split()
    assert Path(out[0]) == ROOT / "server" / "__init__.py"
    assert Path(out[1]) == ROOT / "client" / "__init__.py"


def test_wheel_holds_the_mapped_subpackages_and_imports(tmp_path):
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)])
    (wheel,) = wheels.glob("flightpart-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "flightpart/server/__init__.py" in names and "flightpart/client/__init__.py" in names
    assert not any(n.startswith(("server/", "client/", "tests/")) for n in names)
    target = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)])
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    out = run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env).stdout.split()
    assert Path(out[0]).is_relative_to(target) and Path(out[1]).is_relative_to(target)


def test_console_script_version_and_help():
    exe = Path(sys.executable).with_name("flightpart")
    if not exe.exists():
        pytest.skip("console script not installed next to this interpreter")
    import flightpart

    assert run([str(exe), "--version"]).stdout.strip() == f"flightpart, version {flightpart.__version__}"
    assert "Usage: flightpart" in run([str(exe), "--help"]).stdout
