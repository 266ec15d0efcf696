"""A newcomer's path through the CLI, mistakes included: every answer is the result or one line saying what to do.

Each command runs as a person types it (``python -m flightpart ...`` in a
subprocess, with the environment the docs tell them to export); a mistake
must end with a non-zero exit, one ``Error [CODE]: ... Next: ...`` line (or
click's usage message) and never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flightpart.local.cluster import Daemon

from certs import make_pki
from helpers import free_port


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTPART_")}
    return subprocess.run([sys.executable, "-m", "flightpart", *args], capture_output=True, text=True, timeout=120,
                          env={**environ, **(env or {})})


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.stdout


def mistake(done: subprocess.CompletedProcess, code: str, *words: str) -> str:
    """A refused command: exit 1, exactly one line on stderr with the code and a next step, no traceback."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"Error [{code}]: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_the_documented_path_and_the_usual_mistakes(tmp_path):
    ip, port = "127.0.0.41", free_port()
    catalog_uri = f"grpc://{ip}:{port}"
    env = {"FLIGHTPART_CATALOG": catalog_uri}  # exported as the docs say, before any daemon starts
    # `serve` does not read $FLIGHTPART_CATALOG: on the catalog's own address it becomes the catalog (and a node)
    first = Daemon(["serve", "--host", ip, "--port", str(port), "--data-dir", str(tmp_path / "n1"),
                    "--state-dir", str(tmp_path / "state")], env=env)
    second = Daemon(["serve", "--host", "127.0.0.42", "--port", "0", "--data-dir", str(tmp_path / "n2"),
                     "--catalog", catalog_uri], env=env)
    try:
        assert first.uris["catalog"] == catalog_uri
        assert "2 nodes alive" in ok(run("wait", catalog_uri, "--nodes", "2", "--timeout", "30", env=env))
        rng = np.random.default_rng(0)
        pq.write_table(pa.table({"order": np.arange(1_200_000), "amount": rng.random(1_200_000)}),
                       tmp_path / "sales.parquet")
        # 19 MB: one partition of the default --partition-size (64 MiB)
        assert "sales v1: 1,200,000 rows x 2 columns in a 1x1 grid" in ok(
            run("put", "sales", str(tmp_path / "sales.parquet"), env=env))
        listing = ok(run("ls", env=env))
        assert "sales" in listing and "1,200,000" in listing
        assert ok(run("nodes", env=env)).count("alive") == 2
        ok(run("get", "sales", "-o", str(tmp_path / "copy.arrow"), env=env))
        assert pa.ipc.open_file(str(tmp_path / "copy.arrow")).read_all().num_rows == 1_200_000

        node = second.uris["node"]
        mistake(run("nodes", "--catalog", node), "INVALID_REQUEST", "is a flightpart node", "--catalog")
        mistake(run("ls", "--catalog", node), "INVALID_REQUEST", "is a flightpart node")
        mistake(run("get", "sales", "-o", str(tmp_path / "x.arrow"), "--catalog", node), "INVALID_REQUEST",
                "is a flightpart node")
        web = run("ls", "--catalog", f"http://{ip}:{port}")
        assert web.returncode == 2 and "not a flightpart address" in web.stderr and "Traceback" not in web.stderr
        mistake(run("get", "nosuch", "-o", str(tmp_path / "y.arrow"), env=env), "DATASET_NOT_FOUND", "flightpart ls")
        mistake(run("catalog", "--host", ip, "--port", str(port), "--state-dir", str(tmp_path / "s2")),
                "CANNOT_START", "address in use", "--port")
        mistake(run("serve", "--host", ip, "--port", str(port), "--catalog", catalog_uri), "CANNOT_START",
                "own address")
        assert "bytes_sent" in ok(run("stats", node))
    finally:
        second.stop()
        first.stop()
    mistake(run("stats", second.uris["node"]), "UNAVAILABLE", "flightpart wait")
    mistake(run("ls", env=env), "UNAVAILABLE", "Next:")


def test_tokens_and_tls_mistakes_are_one_line(tmp_path):
    secret = tmp_path / "secret"
    ok(run("secret", "--out", str(secret)))  # the way a newcomer is told to make one: mode 600 already
    pki = make_pki(tmp_path / "pki", ["127.0.0.43"])
    daemon = Daemon(["serve", "--host", "127.0.0.43", "--port", "0", "--data-dir", str(tmp_path / "d"), "--state-dir",
                     str(tmp_path / "s"), "--secret-file", str(secret), "--tls-cert", str(pki["server"]), "--tls-key",
                     str(pki["server_key"])])
    try:
        catalog = daemon.uris["catalog"]
        bare = catalog.split("://")[1]
        tls = {"FLIGHTPART_TLS_CA": str(pki["ca"])}
        mistake(run("ls", "--catalog", catalog, env=tls), "UNAUTHENTICATED", "FLIGHTPART_TOKEN", "flightpart token")
        mistake(run("ls", "--catalog", catalog, env={**tls, "FLIGHTPART_TOKEN": "fp1:reader:bob:0:forged"}),
                "UNAUTHENTICATED")
        reader = ok(run("token", "--role", "reader", "--name", "bob", "--secret-file", str(secret))).strip()
        with_token = {**tls, "FLIGHTPART_TOKEN": reader}
        ok(run("ls", "--catalog", catalog, env=with_token))
        # a bare host:port with $FLIGHTPART_TLS_CA set is a TLS address: stats of the TLS node works
        assert "bytes_sent" in ok(run("stats", daemon.uris["node"].split("://")[1], env=with_token))
        mistake(run("stats", bare, env={"FLIGHTPART_TOKEN": reader}), "UNAVAILABLE", "FLIGHTPART_TLS_CA")
    finally:
        daemon.stop()


def test_a_daemon_does_not_take_a_clients_token_for_the_cluster_secret(tmp_path):
    """$FLIGHTPART_TOKEN exported for client commands, then `serve` in the same shell with no secret: the daemon
    neither makes the token its secret nor runs open silently; it refuses to start and says what to do."""
    refused = run("serve", "--host", "127.0.0.44", "--port", "0", "--data-dir", str(tmp_path / "d"), "--state-dir",
                  str(tmp_path / "s"), env={"FLIGHTPART_TOKEN": "fp1:reader:alice:0:0123"})
    mistake(refused, "CANNOT_START", "FLIGHTPART_TOKEN", "FLIGHTPART_SECRET", "--secret-file", "unset")
    assert not (tmp_path / "d").exists()  # refused before it touched anything
