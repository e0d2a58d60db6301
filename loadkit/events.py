"""Typed run events, and the small hook registry that hears them (Locust's EventHook idea).

Every stage that has something to say about a run (the controller swapping a config, the
conductor losing the server, the master losing a worker) adds a typed event to the run's
EventLog; the log keeps each as the plain dict results.json has always carried (`at`, `event`,
then the event's fields) and fires the hook, so a live view (the web UI, a timeline) can follow
without polling. `docs/results.md` lists the events and their fields.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from loadkit.clock import utcnow

log = logging.getLogger("loadkit.events")


@dataclass(frozen=True)
class RunEvent:
    """Base: `name` is the `event` field in results.json; the dataclass fields follow it."""

    name: ClassVar[str] = ""

    def to_json(self, at: str) -> dict[str, Any]:
        out: dict[str, Any] = {"at": at, "event": self.name}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "at":
                out["at"] = value or at
            elif value is not None:
                out[f.name] = value
        return out


# ---- the controller -------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ConfigApplied(RunEvent):
    name: ClassVar[str] = "config_applied"
    phase: str
    model: str
    reload_s: float


@dataclass(frozen=True, kw_only=True)
class ConfigRefused(RunEvent):
    """Triton refused the phase's config (`config_rejected`) or did not load it in time
    (`config_timeout`)."""

    phase: str
    model: str
    detail: str
    timed_out: bool = False

    @property
    def name(self) -> str:  # type: ignore[override]
        return "config_timeout" if self.timed_out else "config_rejected"

    def to_json(self, at: str) -> dict[str, Any]:
        return {"at": at, "event": self.name, "phase": self.phase, "model": self.model,
                "detail": self.detail}


@dataclass(frozen=True)
class ConfigRestored(RunEvent):
    name: ClassVar[str] = "config_restored"
    model: str
    phase: str | None = None


@dataclass(frozen=True, kw_only=True)
class RestoreFailed(RunEvent):
    name: ClassVar[str] = "restore_failed"
    model: str
    left_on: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class PhaseSkipped(RunEvent):
    name: ClassVar[str] = "phase_skipped"
    phase: str
    detail: str


@dataclass(frozen=True)
class ModelReloaded(RunEvent):
    name: ClassVar[str] = "model_reloaded"
    model: str
    reload_s: float


# ---- the conductor --------------------------------------------------------------------------
@dataclass(frozen=True)
class AccountingMismatch(RunEvent):
    name: ClassVar[str] = "accounting_mismatch"
    step: str
    detail: str


@dataclass(frozen=True)
class DrainTimeout(RunEvent):
    name: ClassVar[str] = "drain_timeout"
    step: str
    in_flight: int


@dataclass(frozen=True)
class SequencesEnded(RunEvent):
    """Sequences still open on the server (a phase ended, users stopped, an END failed) were
    ended with an END request outside any measured window (loads/sequence.py)."""

    name: ClassVar[str] = "sequences_ended"
    before: str  # what comes next: "phase NAME", "step KEY", "the end of the run"
    count: int


@dataclass(frozen=True, kw_only=True)
class ThresholdAbort(RunEvent):
    name: ClassVar[str] = "threshold_abort"
    phase: str
    threshold: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class ServerLost(RunEvent):
    name: ClassVar[str] = "server_lost"
    at: str
    step: str
    policy: str
    wait_s: float


@dataclass(frozen=True)
class ServerBack(RunEvent):
    name: ClassVar[str] = "server_back"
    after_s: float


@dataclass(frozen=True)
class ReportRenderFailed(RunEvent):
    name: ClassVar[str] = "report_render_failed"
    detail: str


# ---- distributed runs -----------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerJoined(RunEvent):
    name: ClassVar[str] = "worker_joined"
    worker: str


@dataclass(frozen=True)
class WorkerRefused(RunEvent):
    name: ClassVar[str] = "worker_refused"
    worker: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class WorkerLost(RunEvent):
    name: ClassVar[str] = "worker_lost"
    at: str
    worker: str
    users: int
    step: str | None

    def to_json(self, at: str) -> dict[str, Any]:  # `step` is null between steps
        return {"at": self.at or at, "event": self.name, "worker": self.worker,
                "users": self.users, "step": self.step}


@dataclass(frozen=True, kw_only=True)
class WorkerReportTimeout(RunEvent):
    name: ClassVar[str] = "worker_report_timeout"
    workers: list[str]
    step: str | None
    detail: str

    def to_json(self, at: str) -> dict[str, Any]:
        return {"at": at, "event": self.name, "workers": self.workers, "step": self.step,
                "detail": self.detail}


Listener = Callable[[RunEvent, dict[str, Any]], None]


class EventHook:
    """Listeners called in order with each event and its JSON form (as Locust's EventHook)."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> Listener:
        self._listeners.append(listener)
        return listener

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def fire(self, event: RunEvent, data: dict[str, Any]) -> None:
        """Every listener hears the event; one that raises is logged with its traceback and the
        rest still hear it (a live view must never break the run that reports to it)."""
        for listener in list(self._listeners):
            try:
                listener(event, data)
            except Exception:
                log.exception("an event listener failed on %s", event.name)


class EventLog:
    """A run's events: `items` is results.json's `events` list (the same list object)."""

    def __init__(self, items: list[dict[str, Any]] | None = None):
        self.items: list[dict[str, Any]] = items if items is not None else []
        self.added = EventHook()

    def add(self, event: RunEvent) -> dict[str, Any]:
        data = event.to_json(utcnow())
        self.items.append(data)
        self.added.fire(event, data)
        return data

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.items if e.get("event") == name]
