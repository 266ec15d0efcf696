"""The limits of the catalog's SQL service, read from the catalog's environment at start.

A caller (a token's role and name; the owner by IP) holds at most :func:`share`
of each total. A bad value stops the catalog at start. docs/limits.md lists
them.
"""

from __future__ import annotations

import dataclasses
import os

from flightpart.settings import bytes_from_env, count_from_env

QUERIES_PER_CALLER_ENV = "FLIGHTPART_SQL_QUERIES_PER_CALLER"
MEMORY_ENV = "FLIGHTPART_SQL_MEMORY"
SPILL_ENV = "FLIGHTPART_SQL_SPILL_BYTES"
SPILL_DIR_ENV = "FLIGHTPART_SQL_SPILL_DIR"
ANSWER_ENV = "FLIGHTPART_SQL_ANSWER_BYTES"
ANSWERS_ENV = "FLIGHTPART_SQL_ANSWERS_BYTES"
PARAMETERS_ENV = "FLIGHTPART_SQL_PARAMETER_BYTES"
BINDS_ENV = "FLIGHTPART_SQL_BINDS"
PREPARED_ENV = "FLIGHTPART_SQL_PREPARED"
PREPARED_BYTES_ENV = "FLIGHTPART_SQL_PREPARED_BYTES"
PREPARED_IDLE_ENV = "FLIGHTPART_SQL_PREPARED_IDLE"


def share(total: int) -> int:
    """What one caller may hold of ``total``: half of it, at least 1."""
    return max(1, total // 2)


@dataclasses.dataclass(frozen=True)
class SqlLimits:
    """The SQL service's limits (defaults here; :meth:`from_env` reads the catalog's environment)."""

    memory: int = 1 << 30
    """DuckDB's memory limit, shared by every query the catalog runs (queries spill past it)."""
    spill: int = 4 << 30
    """Bytes DuckDB may write to its spill files, every query together (``max_temp_directory_size``)."""
    spill_dir: str | None = None
    """Where the catalog makes its private spill directory (0700); None: the system's temporary directory."""
    answer: int = 512 << 20
    """Bytes one answer the catalog sends itself may have, counted as it is produced."""
    answers: int = 1 << 30
    """Bytes of answers the catalog holds, produced, waiting for their DoGet or being sent, all together."""
    parameters: int = 16 << 20
    """Bytes of parameters one bind (DoPut) may carry, counted as its batches arrive."""
    binds: int = 2
    """Binds whose parameters the catalog reads at once (each message is received whole before it is counted)."""
    prepared: int = 1024
    """Prepared statements the catalog keeps."""
    prepared_bytes: int = 256 << 20
    """Bytes of bound parameters the catalog keeps for its prepared statements."""
    prepared_idle: int = 900
    """Seconds a prepared statement is kept unused before it is forgotten."""
    queries_per_caller: int | None = None
    """Queries one caller may run at once; None: :func:`share` of the running limit."""

    @classmethod
    def from_env(cls) -> SqlLimits:
        """The limits the catalog's environment sets (each unset one its default)."""
        d = cls()
        per_caller = os.environ.get(QUERIES_PER_CALLER_ENV, "").strip()
        return cls(
            memory=bytes_from_env(MEMORY_ENV, d.memory, "the memory DuckDB may use for the catalog's queries"),
            spill=bytes_from_env(SPILL_ENV, d.spill, "the bytes the catalog's queries may spill to disk"),
            spill_dir=os.environ.get(SPILL_DIR_ENV, "").strip() or None,
            answer=bytes_from_env(ANSWER_ENV, d.answer, "the bytes of one SQL answer"),
            answers=bytes_from_env(ANSWERS_ENV, d.answers, "the bytes of SQL answers the catalog holds"),
            parameters=bytes_from_env(PARAMETERS_ENV, d.parameters, "the bytes of one bind's parameters"),
            binds=count_from_env(BINDS_ENV, d.binds, "the binds the catalog reads at once"),
            prepared=count_from_env(PREPARED_ENV, d.prepared, "the prepared statements the catalog keeps"),
            prepared_bytes=bytes_from_env(PREPARED_BYTES_ENV, d.prepared_bytes,
                                          "the bytes of bound parameters the catalog keeps"),
            prepared_idle=count_from_env(PREPARED_IDLE_ENV, d.prepared_idle,
                                         "the seconds an unused prepared statement is kept"),
            queries_per_caller=count_from_env(QUERIES_PER_CALLER_ENV, 1, "the SQL queries one caller runs at once")
            if per_caller else None,
        )
