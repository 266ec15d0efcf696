"""How the ``flightpart`` command's processes log: plain lines for people, JSON lines for log collectors.

Daemons log one INFO line per put, get, drop and commit (see
:mod:`flightpart.server.telemetry`), with the fields also attached to the
record (``extra``), so ``--log-format json`` gives a collector the dataset,
version, bytes, duration and peer as fields rather than prose to parse.

gRPC's own C++ logging goes to stderr past Python's logging; it says
things like "Failed to add port" that flightpart already reports in its own
words, so it is silenced unless the log level is DEBUG (``GRPC_VERBOSITY``,
read when gRPC starts, is only set when the environment does not set it).
"""

from __future__ import annotations

import json
import logging
import os
import time

STANDARD_ATTRIBUTES = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every ``extra`` field of the record."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
                 "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        entry.update({k: v for k, v in record.__dict__.items() if k not in STANDARD_ATTRIBUTES
                      and not k.startswith("_")})
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str, fmt: str = "text") -> None:
    """Log to stderr at ``level`` as ``text`` or ``json`` lines; quiet gRPC's own logging below DEBUG."""
    level = level.upper()
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR" if level == "DEBUG" else "NONE")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # the audit trail (every decision on access) is written whatever the level: it is a record, not a diagnostic
    logging.getLogger("flightpart.audit").setLevel(logging.INFO)
    for noisy in ("grpc", "urllib3", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
