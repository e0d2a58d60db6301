"""`loadkit tune`: the conductor, with each phase a trial proposed by the search strategy.

A trial is an ordinary phase: the point's overlays applied through the controller (a refused
config is recorded and the search goes on), the tune load's steps measured drained with exact
accounting, results.json written after each. The first trial is the baseline (every model as
the server had it), what the winner is measured against. Ctrl-C stops after the current trial
(a second one stops at once); every model is restored either way (Conductor._wind_up).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from loadkit.modelconfig import merge, needs_gpu
from loadkit.plan import PhasePlan
from loadkit.run.accounting import run_failures
from loadkit.run.conductor import Conductor, Hub
from loadkit.run.results import PhaseResult, RunStatus
from loadkit.scenario import PhaseSpec, Requirements, Scenario, Thresholds, TuneSpec
from loadkit.search import race, space
from loadkit.search.score import operating_point, pareto, rank_key, reference_of
from loadkit.search.strategies import STRATEGIES
from loadkit.stats import compare, mean_step

log = logging.getLogger("loadkit.tune")
DONE = ("ok", "failed", "skipped")  # a trial in these states is never measured again
STEP_OVERHEAD_S = 1.5  # drain, snapshots and the report write around each step


@dataclass(frozen=True, kw_only=True)
class TuneRun:
    """What the command line chose over the scenario's `tune:` section."""

    strategy: str
    budget_s: float = 0.0  # 0: no time limit
    budget_trials: int = 0  # 0: no limit; counts trials of the grid, not the baseline
    resumed: tuple[dict[str, Any], ...] = ()  # trials of the search being resumed
    resumed_from: str = ""
    resumed_elapsed_s: float = 0.0  # how long the resumed search had run before


RACE_INDEX = 100_000  # re-measures' phase indices start here, clear of every trial's


class TuneConductor(Conductor):
    ROUNDS = "back-to-back"

    def __init__(self, run: Hub, opts: TuneRun):
        super().__init__(run)
        assert run.scenario.tune is not None
        self.spec: TuneSpec = run.scenario.tune
        self.opts = opts
        self.dims = self.spec.dimensions
        self.template = run.plan.phases[0]
        self.strategy = STRATEGIES[opts.strategy](space.sizes(self.dims), self.spec.seed)
        self.trials: list[dict[str, Any]] = [dict(t) for t in opts.resumed]
        self.started = time.monotonic()
        self.stopped = ""
        self.in_trial = False
        self.stop_after_trial: tuple[str, int, RunStatus] | None = None
        self.reference: dict[str, float | None] | None = None
        self.raced: list[int] = []  # the trials racing measured again
        self.race_note = ""
        self._publish()

    def abort(self, reason: str, exit_code: int, status: RunStatus = "interrupted") -> None:
        """The first Ctrl-C during a trial lets it finish (its numbers count); a second, or any
        other reason, stops at once."""
        if (reason.startswith("interrupted by SIGINT") and self.in_trial
                and self.stop_after_trial is None and self.aborted is None):
            self.stop_after_trial = (reason, exit_code, status)
            print("loadkit tune: stopping after this trial (Ctrl-C again to stop now)",
                  file=sys.stderr, flush=True)
            log.warning("stopping after the current trial: %s", reason)
            return
        super().abort(reason, exit_code, status)

    # ---- the search -------------------------------------------------------------------------
    def _walk_plan(self) -> None:
        for t in self.trials:
            if t.get("baseline"):
                self.reference = t.get("reference")
            elif t.get("index") is not None and t["status"] in DONE:
                self.strategy.tell(tuple(t["index"]), t if t.get("point") else None)
        if not any(t.get("baseline") and t["status"] == "ok" for t in self.trials):
            self._trial(None)
        while not self._should_stop():
            point = self.strategy.propose()
            if point is None:
                self.stopped = f"searched: {self.strategy.name} has nothing more to try"
                break
            if not self._fits():
                self.stopped = f"budget: {self.opts.budget_s:g} s"
                break
            trial = self._trial(point)
            if trial is not None and trial["status"] in DONE:
                self.strategy.tell(point, trial if trial.get("point") else None)
        if self.stop_after_trial is None and not self.aborted:
            self._race()
        if self.stop_after_trial is not None and self.aborted is None:
            self.stopped = "interrupted"
            super().abort(*self.stop_after_trial)
        self._publish()

    def _grid_trials(self) -> int:
        return sum(1 for t in self.trials if not t.get("baseline") and t["status"] != "partial")

    def _should_stop(self) -> bool:
        if self.aborted or self.stop_after_trial is not None:
            self.stopped = self.stopped or (
                f"aborted: {self.aborted}" if self.aborted and self.abort_status != "interrupted"
                else "interrupted")
            return True
        if self.opts.budget_trials and self._grid_trials() >= self.opts.budget_trials:
            self.stopped = f"budget: {self.opts.budget_trials} trials"
            return True
        return False

    def _fits(self) -> bool:
        """Whether one more trial fits in the time budget (its steps, their overhead and the
        last reload)."""
        if not self.opts.budget_s:
            return True
        steps = self.template.steps
        reload_s = max((sum(t.get("reload_s", {}).values()) for t in self.trials), default=0.0)
        cost = sum(s.warmup_s + s.duration_s + STEP_OVERHEAD_S for s in steps) * \
            self.run.plan.repeats + reload_s
        return time.monotonic() - self.started + cost <= self.opts.budget_s

    def _step_of(self, trial: dict[str, Any]) -> dict[str, Any] | None:
        """The step a trial's operating point stands for: its measurement's, or, for a raced
        trial, the mean of all its measurements with their interval (stats.mean_step)."""
        names = [trial["phase"], *trial.get("remeasured", [])]
        steps = [s.to_json() for pr in self.run.result.phases if pr.name in names
                 for s in pr.steps if s.index == trial["point"]["step"]]
        return mean_step(steps, self.run.scenario.confidence) if steps else None

    def _measure(self, phase: PhasePlan) -> PhaseResult | None:
        """The phase measured in `repeats` rounds back to back (its config loaded once), the
        rounds pooled into its steps (Conductor._result)."""
        pr = None
        for _ in range(self.run.plan.repeats):
            pr = self._run_phase(phase)
            if pr is None or pr.status != "ok" or self.aborted:
                break
        return pr

    def _phase_for(self, n: int, name: str, overlays: dict[str, Any]) -> PhasePlan:
        """The tune load as phase n, named `name`, on these overlays."""
        steps = tuple(dataclasses.replace(s, phase_index=n, phase=name)
                      for s in self.template.steps)
        needs = self.template.requires
        return dataclasses.replace(
            self.template, index=n, name=name, steps=steps, config=overlays,
            requires=Requirements(needs.gpu or any(needs_gpu(o) for o in overlays.values()),
                                  needs.files))

    def _race(self) -> None:
        """Before naming a winner: measure again, interleaved with the leader, the configs it
        cannot be told apart from (search/race.py), while the budget lasts; each raced trial
        then stands for all its measurements."""
        leader = next((t for t in sorted(self.trials, key=rank_key)
                       if t.get("point") and t["point"]["constraints_met"]), None)
        if leader is None:
            return
        measured = sum(1 for t in self.trials if t.get("point"))
        field = [leader, *race.contenders(self.trials, leader)][:race.field_size(measured)]
        if len(field) < 2:
            return
        points = {t["trial"]: [t["point"]] for t in field}
        for r in range(race.RACE_ROUNDS):
            for t in field:
                if self._should_stop() or not self._fits():
                    self.race_note = "cut short by the budget or an interruption"
                    break
                p = self._remeasure(t, r + 2)
                if p is not None:
                    points[t["trial"]].append(p)
        for t in field:
            if len(points[t["trial"]]) > 1:
                t["point"] = race.combine(points[t["trial"]], self.run.scenario.confidence)
        self.raced = [t["trial"] for t in field]
        self._publish()

    def _remeasure(self, trial: dict[str, Any], k: int) -> dict[str, Any] | None:
        """Trial's config measured once more (its k-th measurement): its operating point."""
        # an index no trial has (a resumed search's trials count, this run's phases may not)
        n = RACE_INDEX + len(self.run.result.phases)
        self.title = f"racing trial {trial['trial']} ({k})"
        pr = self._measure(self._phase_for(n, f"{trial['phase']}#{k}", trial["overlay"]))
        if pr is None or pr.status != "ok":
            return None
        trial.setdefault("remeasured", []).append(pr.name)
        return operating_point(self.spec, [s.to_json() for s in pr.steps], self.reference)

    def _trial(self, point: space.Point | None) -> dict[str, Any] | None:
        """Measure one config (None: the baseline) and record it as a trial."""
        n = len(self.trials)
        name = "baseline" if point is None else f"trial-{n}"
        while any(p.name == name for p in self.run.result.phases):
            name += "'"  # a resumed run may measure the baseline again
        fixed = self.spec.config  # `tune.config`: on every trial, the baseline too
        originals = {m: merge(self.run.controller.original_config(m), fixed.get(m, {}))
                     for m in {d.model for d in self.dims}}
        overlays = {m: dict(o) for m, o in fixed.items()}
        if point is not None:
            for m, o in space.overlays(self.dims, point, originals).items():
                overlays[m] = {**overlays.get(m, {}), **o}
        phase = self._phase_for(n, name, overlays)
        grid = self.spec.grid_size
        self.title = ("baseline" if point is None else f"trial {self._grid_trials() + 1}/{grid} "
                      + ", ".join(f"{k.rsplit('.', 1)[1]}={v}"
                                  for k, v in space.values(self.dims, point).items()))
        self.in_trial = True
        try:
            pr = self._measure(phase)
        finally:
            self.in_trial = False
        if pr is None:
            return None
        trial = self._record(n, point, overlays, pr)
        self.trials.append(trial)
        if trial["status"] == "failed" and not self.run.controller.server_live():
            self.abort(f"the server could not be reached after trial {n} ({trial['reason']}); "
                       "the search stops here", 1, "aborted")
        elif trial["status"] == "failed" and "--model-control-mode=explicit" in trial["reason"]:
            # no config can be loaded on this server: every further trial would say the same
            self.abort(f"loadkit tune swaps configs through Triton's model control: "
                       f"{trial['reason']}", 1, "aborted")
        self._publish()
        self.run.save()
        return trial

    def _record(self, n: int, point: space.Point | None, overlays: dict[str, Any],
                pr: PhaseResult) -> dict[str, Any]:
        steps = [s.to_json() for s in pr.steps]
        if point is None and pr.status == "ok":
            self.reference = reference_of(self.spec, steps)
        status = pr.status
        measured = status == "ok" and all(s["status"] == "ok" for s in steps)
        if status == "ok" and not measured:
            status = "partial"
        trial: dict[str, Any] = {
            "trial": n,
            "phase": pr.name,
            "baseline": point is None,
            "index": list(point) if point is not None else None,
            "values": space.values(self.dims, point) if point is not None else {},
            "overlay": overlays,
            "status": status,
            "reason": pr.reason,
            "reload_s": pr.reload_s,
            "point": operating_point(self.spec, steps, self.reference) if measured else None,
        }
        if point is None:
            trial["reference"] = self.reference
        return trial

    def _failures(self, results: dict[str, Any]) -> list[str]:
        """As any run's, except that a trial whose config the server refused is a result of
        the search (ranked last, with the server's reason), not a failure of the run."""
        refused = {t["phase"] for t in self.trials if t["status"] == "failed"}
        return run_failures({**results, "phases": [p for p in results["phases"]
                                              if p["name"] not in refused]})

    # ---- results.json's `tune` section ------------------------------------------------------
    def _publish(self) -> None:
        spec, opts = self.spec, self.opts
        ranked = sorted(self.trials, key=rank_key)
        best = next((t for t in ranked if t.get("point") and t["point"]["constraints_met"]),
                    None)
        baseline = next((t for t in self.trials if t.get("baseline") and t.get("point")), None)
        self.run.result.tune = {
            "strategy": opts.strategy,
            "objective": spec.objective.text,
            "constraints": [{"metric": t.metric, "limit": t.limit, "from": t.where}
                            for t in spec.constraints],
            "gpu_memory_bytes": spec.gpu_memory_bytes or None,
            "dimensions": [{"model": d.model, "path": d.path, "values": list(d.values),
                            "from": d.where} for d in self.dims],
            "grid_size": spec.grid_size,
            "load": [s.load for s in self.template.steps],
            "budget": {"s": opts.budget_s or None, "trials": opts.budget_trials or None},
            # the whole search's time: a resumed one adds what it had run before
            "elapsed_s": round(time.monotonic() - self.started + opts.resumed_elapsed_s, 1),
            "stopped": self.stopped,
            "resumed_from": opts.resumed_from or None,
            "trials": self.trials,
            "grid_trials": self._grid_trials(),
            "ranking": [t["trial"] for t in ranked if t.get("point")],
            "best": best["trial"] if best else None,
            "baseline": baseline["trial"] if baseline else None,
            "pareto": pareto(self.trials),
            "gain": _gain(best, baseline),
            "raced": self.raced,
            "race_note": self.race_note,
        }
        if best is not None and baseline is not None and best is not baseline:
            a, b = self._step_of(baseline), self._step_of(best)
            for metric in ("throughput", "p99"):  # the gain with its interval, never bare
                change = compare(a, b, metric, self.run.scenario.confidence,
                                 self.run.scenario.noise_threshold) if a and b \
                    else None
                if change is not None:
                    self.run.result.tune["gain"][f"{metric}_change"] = change
        if best is not None:
            tied = race.ties(self.trials, best, self.run.scenario.noise_threshold)
            self.run.result.tune.update(ties=list(tied), tie_words={
                str(k): v for k, v in tied.items()},
                recommended=race.recommend(self.trials, best, tied))


def _gain(best: dict[str, Any] | None, baseline: dict[str, Any] | None) -> dict[str, Any]:
    """What the winner bought over the baseline: throughput and p99 ratios at their operating
    points."""
    if not best or not baseline:
        return {}
    b, a = best["point"], baseline["point"]
    out: dict[str, Any] = {}
    if a["throughput"]:
        out["throughput_x"] = round(b["throughput"] / a["throughput"], 3)
    if a.get("p99_us") and b.get("p99_us"):
        out["p99_x"] = round(b["p99_us"] / a["p99_us"], 3)
    return out


def trial_scenario(scenario: Scenario) -> Scenario:
    """The scenario with one phase, its `tune:` load: the template of every trial (the plan
    `loadkit tune` hands its Run)."""
    assert scenario.tune is not None
    phase = PhaseSpec(name="trial", load=scenario.tune.load, config={}, requires=Requirements(),
                      thresholds=Thresholds())
    return dataclasses.replace(scenario, phases=(phase,))
