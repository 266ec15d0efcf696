"""Small helpers shared by test modules."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence


def code_of(exc: BaseException) -> str:
    """The stable code a server sent with an error; fails the test if there is none, or a leak."""
    from flightpart import wire

    decoded = wire.decode_error(getattr(exc, "extra_info", None))
    assert decoded is not None, f"an error without a code: {type(exc).__name__}: {exc}"
    assert "Traceback" not in str(exc) and "site-packages" not in str(exc), str(exc)
    return decoded[0]


def put_raw(node, path: list[str], table, trailer: int | None = None, options=None) -> None:
    """A put as a plain Flight client sends it (``node``: a URI or a FlightClient), closed by its row-count trailer;
    ``options``: its call options (a credential's headers)."""
    import json

    import pyarrow as pa
    import pyarrow.flight as flight

    node = flight.connect(node) if isinstance(node, str) else node
    writer, _ = node.do_put(flight.FlightDescriptor.for_path(*path), table.schema, options=options)
    writer.write_table(table)
    writer.write_metadata(pa.py_buffer(json.dumps({"rows": table.num_rows if trailer is None else trailer}).encode()))
    writer.close()


def raw_action(client, name: str, body=None, *, uri: str | None = None, timeout: float = 30.0):
    """An action sent the way a client that does not speak flightpart's messages would (a lying or outdated client):
    any name, any JSON body, with ``client``'s credentials, to its catalog or to ``uri``; the JSON reply.
    Errors come back as flightpart's errors, as :meth:`flightpart.Client.call` raises them."""
    import json

    import pyarrow.flight as flight

    from flightpart.io.errors import translated

    pool = client.pool
    payload = json.dumps(body if body is not None else {}).encode()
    with translated():
        results = list(pool.client(uri or client.uri).do_action(flight.Action(name, payload),
                                                                options=pool.options(timeout)))
    return json.loads(results[0].body.to_pybytes())


def free_port() -> int:
    """A TCP port free on loopback now (for a daemon that must restart on the same port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, timeout: float = 30.0, what: str = "condition"):
    """Poll ``check`` until it returns something true; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def run_threads(target, count: int, timeout: float) -> None:
    """``count`` threads running ``target`` at once, all joined; fails the test if one is still running after
    ``timeout``."""
    import threading

    threads = [threading.Thread(target=target) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), f"a thread still runs after {timeout:g} s"


@contextlib.contextmanager
def dask_workers_on(ips: Sequence[str]) -> Iterator:
    """A Dask scheduler on 127.0.0.1 and one worker process bound to each of ``ips``."""
    import distributed

    with distributed.LocalCluster(n_workers=0, host="127.0.0.1", scheduler_port=0, dashboard_address=None) as lc:
        procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", lc.scheduler_address, "--host",
                                   ip, "--nthreads", "1", "--no-nanny", "--no-dashboard"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for ip in ips]
        try:
            with distributed.Client(lc.scheduler_address, set_as_default=False) as client:
                client.wait_for_workers(len(ips), timeout=60)
                yield client
        finally:
            for p in procs:
                p.terminate()
            for p in procs:  # a worker that has not left after SIGTERM (a busy machine) is killed, not waited on
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(30)


class MemoryCap:
    """A memory cgroup whose limit the kernel enforces on the processes started in it (v2 or v1 memory controller).

    ``preexec`` moves a ``subprocess`` child into it before it runs; a child
    that goes over the limit is killed by the kernel (SIGKILL), which the
    test sees as a negative return code. ``unavailable`` says why a machine
    cannot do this (then the test is skipped with that reason).
    """

    def __init__(self, limit_bytes: int):
        import os
        import uuid
        from pathlib import Path

        self.limit = limit_bytes
        self.path: Path | None = None
        self.unavailable: str | None = None
        name = f"flightpart-test-{uuid.uuid4().hex[:8]}"
        v2 = (Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.controllers").exists()
              else Path("/sys/fs/cgroup"))
        own_v1 = next((line.split(":", 2)[2].strip() for line in open("/proc/self/cgroup")
                       if line.split(":")[1] == "memory"), None)
        candidates = []
        if (v2 / "cgroup.controllers").exists() and "memory" in (v2 / "cgroup.controllers").read_text().split():
            candidates.append(("v2", v2 / name))
        if own_v1 is not None:
            candidates.append(("v1", Path("/sys/fs/cgroup/memory") / own_v1.lstrip("/") / name))
        for kind, path in candidates:
            try:
                path.mkdir()
            except OSError:
                continue
            try:
                if kind == "v2":
                    (path / "memory.max").write_text(str(limit_bytes))
                    if (path / "memory.swap.max").exists():
                        (path / "memory.swap.max").write_text("0")
                else:
                    (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                    if (path / "memory.memsw.limit_in_bytes").exists():
                        (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
            except OSError:
                path.rmdir()
                continue
            self.path = path
            return
        self.unavailable = "no writable memory cgroup here (needs root and a cgroup memory controller)" \
            if os.geteuid() == 0 else "memory cgroups need root"

    def preexec(self) -> None:
        import os

        assert self.path is not None
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak_bytes(self) -> int | None:
        """The cgroup's peak usage, where the kernel reports one."""
        assert self.path is not None
        for name in ("memory.peak", "memory.max_usage_in_bytes"):
            if (self.path / name).exists():
                return int((self.path / name).read_text())
        return None

    def remove(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.rmdir()
            self.path = None


def finished_within(call, bound: float) -> dict:
    """``call()`` in a thread: what it returned (``value``) or raised (``error``), or ``{}`` if it had not finished
    after ``bound`` seconds. A bound is many times what the call needs, and far below what it would take without the
    mechanism under test (a 600 s call timeout, or forever): it tells the two apart on a loaded machine."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except Exception as exc:  # the test looks at it
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    return outcome
