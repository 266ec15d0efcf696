"""heat's own ``from_partitioned`` on flightpart's SPMD view, one process and two MPI ranks.

heat reads exactly one partition per rank, NumPy or torch from ``get`` and
the MPI rank as ``location[0]``; ``ds.as_partitioned(frames="numpy",
location="rank", one_per_rank=True)`` gives it that. Each rank runs in a
process of its own (heat starts MPI), and the test checks what every rank
saw.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

import flightpart as fp

pytestmark = pytest.mark.interop

RANK = """
import json, os, sys
import numpy as np
import heat as ht
import flightpart as fp

comm = ht.MPI_WORLD
rank, nranks = comm.rank, comm.size
with fp.connect(os.environ["FLIGHTPART_CATALOG"]) as client:
    view = client.open("heat-src", rank=rank, nranks=nranks)
    try:
        ht.from_partitioned(view)
        plain = "accepted"
    except (RuntimeError, TypeError) as exc:
        plain = str(exc)
    x = ht.from_partitioned(view.as_partitioned(frames="numpy", location="rank", one_per_rank=True))
    local = x.larray.numpy()
    total = float(x.sum().item())
    gathered = x.resplit(None).larray.numpy()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as out:
    json.dump({"shape": list(x.shape), "split": x.split, "local": local.tolist(), "total": total,
               "all": gathered.tolist(), "plain": plain}, out)
"""


def _heat_missing() -> str | None:
    done = subprocess.run([sys.executable, "-c", "import heat"], capture_output=True, text=True, timeout=300)
    return None if done.returncode == 0 else "heat is not installed: pip install 'flightpart[interop]'"


def _check(results: list[dict], values: np.ndarray) -> None:
    nranks = len(results)
    for rank, r in enumerate(results):
        (start, _), (size, _) = fp.default_partition(nranks, rank, values.shape)
        assert r["shape"] == list(values.shape)
        assert r["split"] == (0 if nranks > 1 else None)
        np.testing.assert_array_equal(np.array(r["local"]).reshape(size, values.shape[1]), values[start:start + size])
        np.testing.assert_array_equal(np.array(r["all"]), values)  # heat's own collective gathers the source back
        assert r["total"] == pytest.approx(values.sum())
        assert "Non-SPMD" not in r["plain"]  # the plain SPMD view is SPMD; heat refuses it for its part count or type


@pytest.fixture(scope="module")
def source(cluster):
    reason = _heat_missing()
    if reason:
        pytest.skip(reason)
    values = np.arange(50 * 3, dtype=np.float64).reshape(50, 3)
    with fp.connect(cluster.uri) as client:
        client.put("heat-src", pa.table({f"c{k}": values[:, k] for k in range(3)}), tiling=(4, 2))
    return values


def test_heat_reads_the_spmd_view_in_one_process(cluster, source, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FLIGHTPART_CATALOG": cluster.uri})
    assert done.returncode == 0, done.stderr[-3000:]
    _check([json.loads((tmp_path / "rank0.json").read_text())], source)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not installed (Debian: openmpi-bin)")
def test_heat_reads_the_spmd_view_on_two_mpi_ranks(cluster, source, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    done = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "2", sys.executable, str(script),
                           str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FLIGHTPART_CATALOG": cluster.uri})
    assert done.returncode == 0, done.stderr[-3000:]
    _check([json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)], source)


PRODUCER = """
import json, os, sys
import numpy as np
import heat as ht
import flightpart as fp

x = ht.array(np.arange(24, dtype=np.float64).reshape(6, 4), split=0)
d = x.__partitioned__
try:
    fp.validate(d)
    exact = "accepted"
except fp.PartitionedError as exc:
    exact = str(exc)
read = fp.from_partitioned(x)
with fp.connect(os.environ["FLIGHTPART_CATALOG"]) as client:
    stored = client.put("from-heat", x).to_arrow()
json.dump({"exact": exact, "read": [c.to_pylist() for c in read.columns],
           "stored": [c.to_pylist() for c in stored.columns], "used": fp.lenient.as_spec(d)[1]}, sys.stdout)
"""


def test_heat_arrays_are_read_and_put_through_the_lenient_consumer(cluster, source):
    done = subprocess.run([sys.executable, "-c", PRODUCER], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FLIGHTPART_CATALOG": cluster.uri})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["exact"] != "accepted"  # heat's dict is not the spec's form ...
    assert "location-rank" in out["used"]  # ... and is read for what it is: the rank as location
    values = np.arange(24, dtype=np.float64).reshape(6, 4)
    np.testing.assert_array_equal(np.array(out["read"]).T, values)
    np.testing.assert_array_equal(np.array(out["stored"]).T, values)
