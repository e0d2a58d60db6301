"""The config controller: apply each phase's overlay, read back what the server runs, restore.

Each phase's effective config is the model's config *before the run* (read from the server, so
it works against remote servers too) with that phase's overlay merged on top; overlays do not
accumulate from phase to phase. Every model touched is restored at the end, also on abort.
The controller returns what happened (PhaseOutcome, restore failures) and says it as typed
events; it never writes the run's results itself.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from loadkit.control.client import ModelCounters, ServerControl
from loadkit.control.metrics import MetricsSnapshot
from loadkit.errors import ControlError, ReloadTimeout
from loadkit.events import (
    ConfigApplied,
    ConfigRefused,
    ConfigRestored,
    EventLog,
    ModelReloaded,
    PhaseSkipped,
)
from loadkit.modelconfig import local_problems, merge
from loadkit.plan import PhasePlan

READY_TIMEOUT_S = 120.0
RECOVER_S = 60.0  # how long a server that came back may take to accept its models again
RESTORE_TIMEOUT_S = 600.0  # putting the last good config back outlasts a slow load
SETTLE_S = 0.01  # between two reads of the server's counters that must agree
SETTLE_TRIES = 50


@dataclass(kw_only=True)
class PhaseOutcome:
    """What applying a phase's configs came to: `ok`, `skipped` (the host lacks what the phase
    needs) or `failed` (a config was refused or timed out), with the reason, each model's
    reload time and the configs the server then runs."""

    status: Literal["ok", "failed", "skipped"] = "ok"
    reason: str = ""
    reload_s: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    counters: dict[str, ModelCounters]
    metrics: MetricsSnapshot
    unavailable: dict[str, str] = field(default_factory=dict)  # model -> why no counters


def _explain(exc: ControlError) -> str:
    # Triton answers a load on a server that polls its repository (or has model control off)
    # with UNAVAILABLE; a refused config is INVALID_ARG / INTERNAL.
    if exc.code == "UNAVAILABLE" and "failed to connect" not in str(exc).lower():
        return (
            f"{exc} (if the server is not in explicit model-control mode, start tritonserver "
            "with --model-control-mode=explicit to let loadkit swap configs)"
        )
    return str(exc)


class Controller:
    def __init__(
        self, control: ServerControl, models: tuple[str, ...], events: EventLog,
        reload_timeout_s: float = READY_TIMEOUT_S, observed: tuple[str, ...] = (),
    ):
        self.control = control
        self.reload_timeout_s = reload_timeout_s
        self.models = models
        # read with them at every snapshot, never configured: an ensemble's composing models
        self.observed = tuple(m for m in observed if m not in models)
        self.original: dict[str, dict[str, Any]] = {}
        self.applied: dict[str, dict[str, Any]] = {}
        self.applied_phase: dict[str, str] = {}  # which phase's overlay each model runs
        self.events = events

    def server_live(self) -> bool:
        return self.control.is_live()

    def metrics(self) -> MetricsSnapshot:
        """One scrape of the server's metrics (the timeline samples it once a second)."""
        return self.control.metrics()

    @property
    def watched(self) -> tuple[str, ...]:
        """Every model whose statistics a step reads: the configured and the observed."""
        return self.models + self.observed

    def snapshot(self) -> Snapshot:
        """Statistics and metrics together, taken while nothing is in flight.

        Triton counts a request a moment after its response has left: a snapshot taken the
        instant the client saw its last response could miss it (and the next window would
        count it). The counters are read until two reads SETTLE_S apart agree.
        """
        models = self.models + self.observed
        counters = self.control.read_counters(models)
        for _ in range(SETTLE_TRIES):
            time.sleep(SETTLE_S)
            again = self.control.read_counters(models)
            if again == counters:
                break
            counters = again
        return Snapshot(counters[0], self.control.metrics(), counters[1])

    def original_config(self, model: str) -> dict[str, Any]:
        """The model's config before the run (read once from the server)."""
        return self._original(model)

    def _original(self, model: str) -> dict[str, Any]:
        if model not in self.original:
            self.original[model] = self.control.config(model)
        return self.original[model]

    def _load(self, model: str, config: dict[str, Any], timeout_s: float | None = None) -> float:
        timeout_s = timeout_s or self.reload_timeout_s
        t0 = time.monotonic()
        try:
            self.control.load(model, config, timeout_s)
        except ControlError as exc:
            if exc.code == "DEADLINE_EXCEEDED":
                raise ReloadTimeout(
                    f"model '{model}' did not load within {timeout_s:g} s (target.reload_timeout)",
                    exc.code,
                ) from None
            raise ControlError(_explain(exc), exc.code) from None
        deadline = time.monotonic() + timeout_s
        while not self.control.model_ready(model):
            if time.monotonic() > deadline:
                raise ReloadTimeout(f"model '{model}' was not ready {timeout_s:g} s after load",
                                    "DEADLINE_EXCEEDED")
            time.sleep(0.05)
        return round(time.monotonic() - t0, 3)

    def unmet(self, phase: PhasePlan) -> str:
        """Why this phase cannot run on this host ('' when it can)."""
        missing = [str(f) for f in phase.requires.files if not f.is_file()]
        if missing:
            return f"skipped: file not found: {', '.join(missing)}"
        if phase.requires.gpu:
            snap = self.control.metrics()
            if not snap.error and not snap.has_gpu:
                return "skipped: no GPU (the server's metrics report none)"
        return ""

    def apply_phase(self, phase: PhasePlan) -> PhaseOutcome:
        """Bring every touched model to original + this phase's overlay; say what failed."""
        out = PhaseOutcome()
        reason = self.unmet(phase)
        if reason:
            out.status, out.reason = "skipped", reason
            self.events.add(PhaseSkipped(phase.name, reason))
            return out
        for model in set(self.applied) | set(phase.config):
            overlay = phase.config.get(model, {})
            if self.applied.get(model, {}) == overlay:
                continue
            desired = merge(self._original(model), overlay)
            problems = local_problems(desired)
            if problems:
                out.status, out.reason = "failed", f"{model}: " + "; ".join(problems)
                return out
            try:
                out.reload_s[model] = self._load(model, desired)
            except ControlError as exc:
                timed_out = isinstance(exc, ReloadTimeout)
                out.status, out.reason = "failed", f"{model}: {exc}"
                self.events.add(ConfigRefused(phase=phase.name, model=model, detail=str(exc),
                                              timed_out=timed_out))
                # A refused config leaves Triton on the last good one, which is what `applied`
                # records. A timed-out load goes on in the server and would win when it ends:
                # load the last good config again (Triton runs it after the slow one).
                if timed_out:
                    self._load(model, merge(self._original(model), self.applied.get(model, {})),
                               RESTORE_TIMEOUT_S)
                    self.events.add(ConfigRestored(model, phase.name))
                    out.reason += "; back on its last good config"
                return out
            self.applied[model] = overlay
            self.applied_phase[model] = phase.name
            self.events.add(ConfigApplied(phase=phase.name, model=model,
                                          reload_s=out.reload_s[model]))
        out.config = {m: self.control.config(m) for m in self.models}
        return out

    def recover(self) -> None:
        """After the server came back (a restart): load every model again at the config the
        current phase had, since a restarted server in explicit mode has none loaded."""
        for model in self.models:
            overlay = self.applied.get(model, {})
            deadline = time.monotonic() + RECOVER_S
            while True:
                try:
                    if not overlay and self.control.model_ready(model):
                        reload_s = 0.0  # whoever restarted the server loaded it as it was
                    else:
                        reload_s = self._load(model, merge(self._original(model), overlay))
                    break
                except ControlError:  # still starting (or someone else is loading it)
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            self.events.add(ModelReloaded(model, reload_s))

    def restore(self) -> list[dict[str, str]]:
        """Load every model we changed back to its config from before the run; every model is
        tried. Returns what could not be restored: model, the config it was left on, why."""
        failures = []
        for model in list(self.applied):
            if self.applied[model]:
                try:
                    self._load(model, self.original[model])
                except ControlError as exc:
                    phase = self.applied_phase.get(model, "?")
                    failures.append({
                        "model": model,
                        "left_on": f"phase '{phase}' overlay {json.dumps(self.applied[model])}",
                        "detail": f"{exc} (left on phase '{phase}''s config "
                                  f"{json.dumps(self.applied[model])})",
                    })
                    continue
                self.events.add(ConfigRestored(model))
            del self.applied[model]
        return failures
