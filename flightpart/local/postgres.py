"""A throwaway PostgreSQL server on loopback, for catalogs that share a lease.

Uses the machine's server binaries (``/usr/lib/postgresql/<major>/bin``, or ``initdb`` on the PATH).
``initdb`` refuses to run as root, so as root the server runs as the ``postgres`` user.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def server_binaries() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl`` (the newest installed major version), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def missing_reason() -> str | None:
    """Why a local PostgreSQL cannot be started here (None: it can)."""
    if server_binaries() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) are not installed: apt-get install postgresql"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run PostgreSQL as"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed: pip install 'flightpart[ha]'"
    return None


class LocalPostgres:
    """``initdb`` in a temporary directory, ``pg_ctl start`` on 127.0.0.1 and a free port; :meth:`stop` removes all.
    ``url(db)`` is what catalogs are given (``--lease``)."""

    def __init__(self) -> None:
        binaries = server_binaries()
        if binaries is None:
            raise RuntimeError(missing_reason() or "no PostgreSQL")
        self.bin = binaries
        self.dir = Path(tempfile.mkdtemp(prefix="flightpart-pg-"))
        self.data = self.dir / "data"
        self.user = "flightpart"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.dir, "postgres")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._run([str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", self.user, "--no-sync",
                   "--encoding", "UTF8", "--locale", "C"])
        self.start()

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run([*self._as, *argv], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")

    def start(self) -> None:
        """Start (or start again after :meth:`pause`) on the same port and data."""
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w",
                   "-t", "60", "start"])

    def pause(self) -> None:
        """Stop the server (fast shutdown: connections cut), keeping its data for :meth:`start`."""
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def database(self, name: str, encoding: str | None = None) -> str:
        """The URL of a new, empty database ``name`` (dropped first if it exists), in ``encoding`` if given."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"'
                         + (f" ENCODING '{encoding}' TEMPLATE template0" if encoding else ""))
        return self.url(name)

    def stop(self) -> None:
        try:
            self.pause()
        except Exception:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
