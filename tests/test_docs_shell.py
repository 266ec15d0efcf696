"""Every shell example in the README and docs/ runs, as a newcomer would paste it.

Each ```bash block runs in a fresh directory with this checkout's
``flightpart`` first on PATH, in a session of its own: whatever it leaves in
the background (daemons) is stopped after it, and the next block starts only
once they are gone. A block may start with ``# not run by the suite: <why>``
when something else runs it (the set-up commands: CI itself; the compose
file: docker/e2e.sh; full benchmarks: their quick forms in
tests/test_bench_smoke.py); the test checks the reason names that place.
Blocks that read a running cluster (querying) get one in
``$FLIGHTPART_CATALOG``, holding the ``sales`` dataset the docs describe.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.local.cluster import Daemon

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
NOT_RUN = "# not run by the suite: "
SETUP = "python3 -m venv .venv && "
BLOCKS = [(doc, k, code) for doc in DOCS for k, code in enumerate(BLOCK.findall(doc.read_text()))]
RUN = [(d, k, c) for d, k, c in BLOCKS if not c.startswith(NOT_RUN) and not c.startswith(SETUP)]


@pytest.fixture(scope="module")
def sales_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs-cluster")
    daemon = Daemon(["serve", "--host", "127.0.0.96", "--port", "0", "--data-dir", str(root / "data"), "--state-dir",
                     str(root / "state")])
    rng = np.random.default_rng(1)
    sales = pa.table({"order": np.arange(10_000), "store": [f"s{k}" for k in rng.integers(0, 5, 10_000)],
                      "amount": rng.random(10_000) * 100})
    with fp.connect(daemon.uris["catalog"]) as client:
        client.put("sales", sales, tiling=(4, 1))
    yield daemon.uris["catalog"]
    daemon.stop()


def run_block(code: str, cwd: Path, catalog: str, timeout: float = 240.0) -> subprocess.CompletedProcess:
    """Run ``code`` as bash would, each command traced with the time it started (stderr), Python's fault handler on.

    Its output goes to files, not pipes: what the block leaves in the background (daemons it started and stops
    with ``kill``) holds no pipe open, so the block is over when bash is, and :func:`stop_session` then stops
    whatever is left. (How a daemon stops on SIGTERM, within its grace period, is tests/test_reliability.py's.)
    A block still running after ``timeout`` fails the test with what it printed and where every Python process of
    it was: each gets SIGABRT, which the fault handler answers with its threads' stacks, before the session is
    stopped.
    """
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "HOME": str(cwd),
           "FLIGHTPART_CATALOG": catalog, "PYTHONFAULTHANDLER": "1"}
    timed = "PS4='+ $(date +%T.%3N) '\n" + code  # set in the script: bash run by root ignores PS4 from the environment
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(["bash", "-x", "-e", "-o", "pipefail", "-c", timed], cwd=cwd, env=env, stdout=out,
                                stderr=err, text=True, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            running = subprocess.run(["ps", "-o", "pid,stat,etime,args", "-g", str(proc.pid)], capture_output=True,
                                     text=True).stdout
            for line in running.splitlines()[1:]:
                pid, *_, command = line.split(None, 3)
                if "python" in command or "flightpart" in command:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGABRT)
                    time.sleep(1.0)  # one stack dump at a time
            stop_session(proc.pid)
            pytest.fail(f"still running after {timeout:.0f} s:\n{running}\n--- stdout\n{_read(out)[-3000:]}\n"
                        f"--- stderr (with the stacks of its Python processes)\n{_read(err)[-20000:]}")
        finally:
            stop_session(proc.pid)
        return subprocess.CompletedProcess(proc.args, proc.returncode, _read(out), _read(err))


def _read(file: Any) -> str:
    file.seek(0)
    return file.read()


def stop_session(pgid: int) -> None:
    """SIGTERM to what the block left running, then wait until it is gone (its ports free for the next block)."""
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


@pytest.mark.parametrize("doc,k,code", RUN, ids=[f"{d.relative_to(ROOT)}#{k}" for d, k, _ in RUN])
def test_shell_example_runs(doc, k, code, tmp_path, sales_cluster):
    done = run_block(code, tmp_path, sales_cluster)
    assert done.returncode == 0, (f"{doc.name}#{k} exited {done.returncode}:\n{done.stdout[-2000:]}\n"
                                  f"{done.stderr[-3000:]}")
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_blocks_not_run_say_what_runs_them():
    for doc, k, code in BLOCKS:
        if code.startswith(NOT_RUN):
            reason = code.splitlines()[0][len(NOT_RUN):]
            assert re.search(r"\.ci/run|docker/e2e\.sh|tests/(?:unit/)?test_\w+\.py",
                             reason), f"{doc.name}#{k}: {reason}"
            named = re.findall(r"tests/(?:unit/)?test_\w+\.py|docker/e2e\.sh", reason)
            assert all((ROOT / path).exists() for path in named), named


def test_setup_blocks_are_the_commands_ci_runs():
    """The README's two commands (and the quickstart's copy) are what .ci/run executes on a fresh clone."""
    readme = [c.strip() for d, _k, c in BLOCKS if d.name == "README.md"]
    assert len(readme) == 2 and readme[0].endswith("flightpart demo") and "pytest" in readme[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "grep -E '^python3 -m venv .venv && .*pytest' README.md" in ci and 'bash -c "$cmd"' in ci
    quickstart = next(c for d, _k, c in BLOCKS if d.name == "quickstart.md" and c.startswith(NOT_RUN))
    commands = [line for line in quickstart.splitlines() if line.startswith(SETUP)]
    assert commands[0] == readme[0]
    assert commands[1].replace(" && .venv/bin/python -m pytest -q -m \"not slow\"", "") in readme[1]


def test_there_are_shell_examples_that_run():
    assert len(RUN) >= 4
