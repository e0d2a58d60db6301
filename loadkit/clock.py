"""Wall-clock stamps for results and events: UTC, ISO 8601, milliseconds."""

from __future__ import annotations

from datetime import datetime, timezone


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")
