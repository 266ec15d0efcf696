"""The audit trail: every decision on access as one structured log line, counted in the metrics.

A line goes to the ``flightpart.audit`` logger at INFO (a refusal at WARNING), its message a JSON object with
``audit`` (the action: ``sign-in``, ``open``, ``query``, ``grant``, ...), ``outcome`` (``allowed`` or ``refused``),
``user`` (a user's name, a role token's ``role:name``, or ``owner``), ``dataset``, ``version``, ``client`` (the
caller's IP) and ``why`` for a refusal, so a log shipper reads it without parsing prose; the same fields are the
record's ``extra``. Reads a role token makes (nodes, operators, the catalog's own SQL gateway) are not written:
the trail is about people.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from flightpart.tokens import Credential

from .telemetry import Telemetry

log = logging.getLogger("flightpart.audit")


def who(credential: Credential) -> str:
    """How the trail names a caller: a user by name, a role token as ``role:name``, the secret as ``owner``."""
    if credential.user:
        return credential.name
    if credential.role == "owner":
        return "owner"
    return f"{credential.role}:{credential.name}"


def audit(telemetry: Telemetry, action: str, allowed: bool, credential: Credential | None, *,
          user: str | None = None, client: str = "", why: str = "", **extra: Any) -> None:
    """Write and count one decision: ``action`` by ``credential`` (or the named ``user`` when there is no credential
    yet, as at sign-in) ``allowed`` or not; ``extra``: its ``dataset``, ``version`` and what else it concerns."""
    outcome = "allowed" if allowed else "refused"
    telemetry.decided(action, outcome)
    level = logging.INFO if allowed else logging.WARNING
    if not log.isEnabledFor(level):
        return
    fields: dict[str, Any] = {"audit": action, "outcome": outcome,
                              "user": user if user is not None else who(credential) if credential else "",
                              "dataset": None, "version": None, "client": client}
    if why:
        fields["why"] = why
    fields.update(extra)
    log.log(level, json.dumps(fields, separators=(",", ":"), default=str), extra={"fields": fields})
