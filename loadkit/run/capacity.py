"""`loadkit capacity`: the conductor, with each phase's steps chosen by the capacity search.

Everything else is the ordinary run: the phase's config overlay is applied and restored the same
way, each probe is a drained open-loop step with exact accounting, results.json is updated after
each probe, and Ctrl-C still leaves a report. The time budget is shared out over the phases
still to search, so a slow first config cannot starve the others.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

from loadkit.plan import Arrivals, PhasePlan, Step, replay_step
from loadkit.run.conductor import Conductor, Hub
from loadkit.run.results import PhaseResult
from loadkit.scenario import RateLoad, Threshold
from loadkit.scenario.model import ReplayLoad
from loadkit.search.capacity import Probe, Search, cheapest, phase_summary
from loadkit.slo import judge_step, probe_outcome, slo_confidence
from loadkit.stats import across_rounds
from loadkit.stats.sequential import MIN_ROUNDS, design

PROBE_OVERHEAD_S = 1.5  # drain, snapshots and the report write around each probe
CONFIRM_FACTOR = 2
DEFAULT_CAP = 64  # in flight at most: bounds the client and the server queue at overload
MIN_SPEED, MAX_SPEED = 0.01, 1000.0  # a replay's speeds, as the scenario accepts them


def replay_rate(load: ReplayLoad) -> float:
    """The file's mean request rate at speed 1."""
    t = load.traffic
    return len(t.offsets) / t.duration_s if t.duration_s > 0 else 0.0


@dataclass(frozen=True, kw_only=True)
class CapacitySpec:
    slo: tuple[Threshold, ...]
    slo_text: str
    peak: float | None = None
    headroom: float = 0.3
    budget_s: float = 600.0
    precision: float = 0.05
    start_rate: float | None = None
    max_rate: float | None = None
    peak_speed: float | None = None  # --peak 3x: a replay's traffic three times as fast
    start_speed: float | None = None  # a replay's first speed (default: the load's speed)
    # every probe at least this long (a replay repeats its file whole); None: 5 s for a
    # replay (at a high speed a file lasts a second, and one stall decides), step_duration
    # for a rate
    min_probe_s: float | None = None


REPLAY_MIN_PROBE_S = 5.0


def looped(load: ReplayLoad, speed: float, min_probe_s: float) -> ReplayLoad:
    """The replay at `speed`, its file repeated whole until the probe lasts `min_probe_s`."""
    period = load.traffic.duration_s / speed if speed > 0 else 0.0
    if period <= 0 or period >= min_probe_s or load.step_duration_s:
        return load
    times = math.ceil(min_probe_s / period - 1e-9)
    return dataclasses.replace(load, loop=True, times=times, step_duration_s=times * period)


class CapacityConductor(Conductor):
    ROUNDS = "back-to-back"
    CHOOSES_STEPS = True

    def __init__(self, run: Hub, spec: CapacitySpec):
        super().__init__(run)
        self.spec = spec
        self.started = time.monotonic()
        self.summaries: list[dict[str, object]] = []
        self.run.result.capacity = self._capacity()

    def _capacity(self) -> dict[str, object]:
        s = self.spec
        return {
            "slo": s.slo_text,
            "limits": [{"metric": t.metric, "limit": t.limit, "from": t.where} for t in s.slo],
            "peak": s.peak,
            "peak_speed": s.peak_speed,
            "headroom": s.headroom,
            "budget_s": s.budget_s,
            "precision": s.precision,
            "phases": self.summaries,
            "cheapest": cheapest(self.summaries),  # type: ignore[arg-type]
        }

    def _walk_plan(self) -> None:
        """Each phase searched once (the base's rounds would search it again): `repeats`
        measures each probe in that many rounds instead."""
        for phase in self.run.plan.phases:
            if self.aborted or self._run_phase(phase) is None:
                return

    def _phase_budget_s(self, phase: PhasePlan) -> float:
        left = self.spec.budget_s - (time.monotonic() - self.started)
        phases_left = len(self.run.plan.phases) - phase.index
        return max(0.0, left / max(1, phases_left))

    def _walk_phase(self, phase: PhasePlan, pr: PhaseResult) -> None:
        load = self.run.scenario.phases[phase.index].load
        first = phase.steps[0]
        template = first.arrivals or Arrivals(rate=1.0, max_concurrency=DEFAULT_CAP)
        if not template.max_concurrency:
            template = Arrivals(rate=template.rate, arrival=template.arrival, seed=template.seed,
                                max_concurrency=DEFAULT_CAP,
                                late_tolerance_s=template.late_tolerance_s)
        if isinstance(load, ReplayLoad):  # the search moves the file's speed, not a rate
            replay = load if load.max_concurrency else dataclasses.replace(
                load, max_concurrency=DEFAULT_CAP)
            search = Search(start=self.spec.start_speed or load.levels[0],
                            precision=self.spec.precision, min_rate=MIN_SPEED,
                            max_rate=MAX_SPEED)
        else:
            replay = None
            start = self.spec.start_rate or (load.levels[0] if isinstance(load, RateLoad)
                                             else 100.0)
            search = Search(start=float(start), precision=self.spec.precision,
                            max_rate=self.spec.max_rate or Search.max_rate)
        deadline = time.monotonic() + self._phase_budget_s(phase)
        # each probe in this many rounds, pooled (auto: at most; the budget counts the first
        # look's)
        rounds = MIN_ROUNDS if self.run.plan.auto else self.run.plan.repeats
        cost = (first.warmup_s + first.duration_s + PROBE_OVERHEAD_S) * rounds
        mix = phase.mix
        batch = sum(mix.get(n, 0) * b for n, b in self.run.batch_sizes.items()) / sum(
            mix.values())
        while (nxt := search.next_rate()) is not None:
            if self.aborted:
                search.stopped = "aborted"
                break
            if time.monotonic() + cost > deadline:
                search.stopped = "budget"
                break
            rate, kind = nxt
            if replay is not None:  # the file at this speed, repeated to the minimum length
                step = replay_step(phase.index, phase.name, len(pr.steps), looped(
                    replay, rate, self.spec.min_probe_s or REPLAY_MIN_PROBE_S), rate, phase.mix)
                duration = step.duration_s
            else:
                # a confirmation (and, after one failed, every probe) measures twice as long:
                # the answer must hold, not just once pass
                duration = max(first.duration_s, self.spec.min_probe_s or 0.0) * (
                    CONFIRM_FACTOR if search.long(kind) else 1)
                step = Step(phase_index=phase.index, phase=phase.name, index=len(pr.steps),
                            concurrency=1, warmup_s=first.warmup_s, duration_s=duration,
                            arrivals=Arrivals(rate=rate, arrival=template.arrival,
                                              seed=template.seed + len(pr.steps),
                                              max_concurrency=template.max_concurrency,
                                              late_tolerance_s=template.late_tolerance_s))
            if time.monotonic() + cost + (duration - first.duration_s) * rounds > deadline:
                search.stopped = "budget"
                break
            result, outcome, taken = self._probe(step, pr, rounds)
            passed, broken = judge_step(self.spec.slo, result)
            ol = result.get("open_loop", {})
            search.record(Probe(rate=rate, kind=kind, passed=passed, broken=broken,
                                step=step.index, latency_us=result["latency_us"],
                                achieved_rate=ol.get("achieved_rate", 0.0),
                                generator_limited=bool(ol.get("generator_limited")),
                                outcome=outcome, limited_by=ol.get("limited_by", ""), rounds=taken))
            self._summarize(phase, search, pr, batch)
            self.run.save()
        if self.aborted:
            pr.status = "partial"
        self._summarize(phase, search, pr, batch)

    def _probe(self, step: Step, pr: PhaseResult, rounds: int
               ) -> tuple[dict[str, Any], str, int]:
        """One probe in its rounds, back to back: (the pooled step, its SLO outcome judged
        with its intervals, rounds taken). With `repeats: auto`, rounds are added from the
        third until the outcome is held or broken with confidence (each look at the
        sequential design's level, loadkit/stats/sequential.py), or the most rounds."""
        plan = self.run.plan
        most = plan.repeats
        level = design(self.run.scenario.confidence, most).nominal if plan.auto else None
        taken, outcome, result = 0, "no interval", {}
        for taken in range(1, most + 1):
            self._run_step(step, pr)
            if self.aborted:
                break
            last = pr.steps[-1]
            result = last.to_json()
            intervals = last.intervals if level is None else across_rounds(
                last.rounds, result, level, self.ROUNDS)
            outcome = probe_outcome(self.spec.slo, result, intervals)
            if not plan.auto and taken >= rounds:
                break
            if plan.auto and taken >= MIN_ROUNDS and outcome in ("held", "broken"):
                break
        return result, outcome, taken

    def _summarize(self, phase: PhasePlan, search: Search, pr: PhaseResult,
                   batch: float) -> None:
        if search.best is None:
            status, reason = "not_found", (
                "no rate held the SLO" + (f" (stopped: {search.stopped})" if search.stopped
                                          else ""))
        elif search.confirmed:
            status, reason = "found", ""
        else:
            status, reason = "approximate", f"stopped before confirming: {search.stopped}"
        load = self.run.scenario.phases[phase.index].load
        summary = phase_summary(phase.name, search, status, reason, self.spec.peak,
                                self.spec.headroom, batch,
                                replay_rate(load) if isinstance(load, ReplayLoad) else None,
                                self.spec.peak_speed)
        confirm = next((p for p in reversed(search.probes) if p.kind == "confirm" and p.passed),
                       None)
        step = next((s for s in pr.steps if confirm and s.index == confirm.step), None)
        if step is not None:
            summary["slo_confidence"] = slo_confidence(self.spec.slo, step.intervals,
                                                       self.run.scenario.confidence)
        self.summaries[:] = [s for s in self.summaries if s["phase"] != phase.name]
        self.summaries.append(summary)
        self.run.result.capacity = self._capacity()
