"""SPMD ranks as separate processes: env launcher always, real mpirun when installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

RANK_SCRIPT = """
import json, sys
import numpy as np, pandas as pd
import flightpart as fp

name = sys.argv[1]
rank, size = fp.spmd.world()
host = f"127.0.0.{2 + rank}"
(offset,), (rows,) = (lambda o, s: ((o[0],), (s[0],)))(*fp.default_partition(size, rank, (50, 3)))
g = np.arange(offset, offset + rows, dtype=np.float64)
frame = pd.DataFrame({"a": g, "b": g * 10, "c": g * 100})
fp.spmd.publish(name, frame, host=host)
ds = fp.spmd.open(name, host=host)
d = fp.validate(ds, require_pickle=True)
dap = fp.distarray.validate(ds.__distarray__())
out = json.dumps({
    "rank": rank, "size": size,
    "locals": [list(p) for p in d["locals"]],
    "none": sorted(list(p) for p, e in d["partitions"].items() if e["data"] is None),
    "dim0": dap["dim_data"][0], "dim1": dap["dim_data"][1],
    "first_row": dap["buffer"][0].tolist() if len(dap["buffer"]) else None,
})
open(f"{sys.argv[2]}/rank{rank}.json", "w").write(out)
"""


def check(outputs: list[dict], size: int = 3) -> None:
    assert sorted(o["rank"] for o in outputs) == list(range(size))
    for o in outputs:
        r = o["rank"]
        (start,), (rows,) = (lambda off, s: ((off[0],), (s[0],)))(
            *__import__("flightpart").default_partition(size, r, (50, 3)))
        assert o["size"] == size and o["locals"] == [[r, 0]]
        assert o["none"] == [[k, 0] for k in range(size) if k != r]
        assert o["dim0"] == {"dist_type": "b", "size": 50, "proc_grid_size": size, "proc_grid_rank": r, "start": start,
                             "stop": start + rows}
        assert o["dim1"] == {"dist_type": "b", "size": 3, "proc_grid_size": 1, "proc_grid_rank": 0, "start": 0,
                             "stop": 3}  # 0.10
        assert o["first_row"] == [start, start * 10, start * 100]


def test_env_launcher_three_ranks(cluster, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    procs = [
        subprocess.Popen([sys.executable, str(script), "spmd-env", str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "RANK": str(r), "WORLD_SIZE": "3", "FLIGHTPART_CATALOG": cluster.uri})
        for r in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
    check([json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)])


def _mpi_ready() -> str | None:
    if shutil.which("mpirun") is None:
        return "mpirun is not installed (Debian: openmpi-bin)"
    try:
        subprocess.run([sys.executable, "-c", "import mpi4py"], check=True, capture_output=True, timeout=60)
    except subprocess.CalledProcessError:
        return "mpi4py is not installed (pip install 'flightpart[mpi]')"
    return None


@pytest.mark.skipif(_mpi_ready() is not None, reason=str(_mpi_ready()))
def test_real_mpirun_three_ranks(cluster, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {**os.environ, "FLIGHTPART_CATALOG": cluster.uri}
    done = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "3", sys.executable, str(script),
                           "spmd-mpi", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    check([json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)])


def test_world_reads_the_launcher_environment(monkeypatch):
    import flightpart as fp

    for var in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert fp.spmd.world() == (2, 4)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(fp.FlightpartError, match=r"\$RANK=4 is not in \[0, \$WORLD_SIZE=4\)"):
        fp.spmd.world()
