"""The conductor walks the plan: config swap per phase, then warm-up and measured window per step.

It is the only thing that decides when a step starts and ends. The Locust shape only reports its
target user count to the runner. Around every measured window the gate is closed and drained,
so the server's counters are snapshotted with nothing in flight: client counts then equal the
server's success deltas exactly.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from typing import Any, Protocol

import gevent
from gevent.event import Event

from loadkit.clock import utcnow
from loadkit.control.controller import Controller, Snapshot
from loadkit.events import (
    AccountingMismatch,
    DrainTimeout,
    EventLog,
    ReportRenderFailed,
    RestoreFailed,
    SequencesEnded,
    ServerBack,
    ServerLost,
    ThresholdAbort,
)
from loadkit.plan import PhasePlan, Plan, Step
from loadkit.run import stability
from loadkit.run.accounting import run_failures
from loadkit.run.drive import Collected, Drive
from loadkit.run.results import PhaseResult, RunResult, RunStatus, StepResult
from loadkit.run.rounds import Looks, Pool, pooled_intervals, round_intervals
from loadkit.run.step_result import StepContext, build_step_result
from loadkit.run.timeline import Sampler
from loadkit.scenario import Scenario, Stability, Threshold
from loadkit.slo import check_phase, failed
from loadkit.stats import comparisons, judging


class Hub(Protocol):
    """What the conductor needs of the run it walks (loadkit.run.Run): declared here, so the
    conductor does not import the module that builds it."""

    plan: Plan
    scenario: Scenario
    result: RunResult
    events: EventLog
    controller: Controller
    drive: Drive
    environment: Any  # Locust's Environment
    batch_sizes: dict[str, int]
    template_models: dict[str, str]
    template_calls: dict[str, dict[str, int | None]]  # accounting.template_calls
    input_tokens: dict[str, tuple[float, str]]
    composing: dict[str, str]  # model -> the template model it runs inside
    baseline: dict[str, Any] | None  # `--baseline`'s results.json

    def save(self, final: bool = False) -> None: ...

log = logging.getLogger("loadkit.conductor")
SPAWN_WAIT_S = 30.0
LIVENESS_S = 1.0


class Conductor:
    # how a step's rounds are taken: phases interleaved here; tune's trials and capacity's
    # probes are adaptive, so theirs come back to back (the intervals' method says which)
    ROUNDS = "interleaved"
    CHOOSES_STEPS = False  # capacity's search chooses each phase's steps as it goes

    def __init__(self, run: Hub):
        self.run = run
        self.target: tuple[int, float] | None = (run.plan.steps[0].concurrency, 1000.0)
        self.finished = Event()
        self.current: Step | None = None
        self.stage = "starting"
        self.stage_started = time.monotonic()
        self.stage_length_s = 0.0
        self.aborted: str | None = None
        self.abort_status: RunStatus = "interrupted"
        self.exit_code = 0
        self._wake = Event()
        self.lost_at = ""
        self.greenlet: gevent.Greenlet | None = None
        self._sampler: Sampler | None = None
        self.phase: PhasePlan | None = None  # the phase being walked
        self._results: dict[int, PhaseResult] = {}  # phase index -> its (pooled) result
        self._pools: dict[str, Pool] = {}  # step key -> its rounds so far
        self.title = ""  # what the progress line calls it ('' : the phase's name)

    def start(self) -> None:
        if self.greenlet is None:
            self.greenlet = gevent.spawn(self._main)

    def abort(self, reason: str, exit_code: int, status: RunStatus = "interrupted") -> None:
        if self.aborted is None:
            self.aborted = reason
            self.exit_code = exit_code
            self.abort_status = status
        self._wake.set()

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless aborted; True if the whole time passed."""
        if self.aborted:
            return False
        self._wake.wait(seconds)
        return not self.aborted

    def _set_stage(self, stage: str, length_s: float) -> None:
        self.stage = stage
        self.stage_started = time.monotonic()
        self.stage_length_s = length_s

    def _main(self) -> None:
        run = self.run
        try:
            self._walk_plan()
            run.result.status = self.abort_status if self.aborted else "complete"
            run.result.reason = self.aborted or ""
        except Exception as exc:  # a bug or a lost server: keep what we have, say what happened
            log.error("run aborted: %s\n%s", exc, traceback.format_exc())
            run.result.status = "aborted"
            run.result.reason = f"{type(exc).__name__}: {exc}"
            self.exit_code = self.exit_code or 1
        finally:
            try:
                self._wind_up()
            except Exception as exc:  # a bug here must end the run loudly, never hang it
                log.error("run aborted while finishing: %s\n%s", exc, traceback.format_exc())
                run.result.status = "aborted"
                run.result.reason = f"{type(exc).__name__}: {exc}"
                self.exit_code = self.exit_code or 1
                with contextlib.suppress(Exception):
                    run.save(final=True)
            finally:
                self.stage = "done"
                self.finished.set()

    def _walk_plan(self) -> None:
        """The plan's phases in order (run/tune.py proposes its trials as it goes); with
        `repeats: N`, N rounds, every other one in reverse order (A B C, C B A, A B C): a
        drift that grows through the run then falls on every phase alike (docs/verdicts.md)."""
        plan = self.run.plan
        phases = plan.phases
        sc = self.run.scenario
        looks = Looks(self.run.result, sc.confidence, sc.noise_threshold, plan.repeats,
                      plan.max_time_s, self.run.baseline) if plan.auto else None
        for r in range(plan.repeats):
            for phase in phases if r % 2 == 0 else tuple(reversed(phases)):
                if self.aborted or self._run_phase(phase) is None:
                    return
            if looks is not None and looks.stop(r + 1):
                return

    def _run_phase(self, phase: PhasePlan) -> PhaseResult | None:
        """Apply the phase's configs and walk its steps; None when no load can be sent."""
        run = self.run
        missing = run.drive.missing_senders()
        if missing:  # e.g. every worker was refused: no config swap for nothing
            self.abort(f"{missing}; stopped before phase {phase.name}", 1, "aborted")
            return None
        pr = self._results.get(phase.index)
        if pr is None:
            pr = self._results[phase.index] = PhaseResult(name=phase.name)
            run.result.phases.append(pr)
        self.phase = phase
        self._set_stage("configuring", 0)
        # a reload takes a second or more of blocking control-plane calls: off the hub, so
        # the live metrics, the web UI and the progress line keep going meanwhile
        outcome = gevent.get_hub().threadpool.apply(run.controller.apply_phase, (phase,))
        pr.status, pr.reason = outcome.status, outcome.reason
        # a round on the config already loaded reloads nothing: keep the reload it had
        pr.reload_s, pr.config = outcome.reload_s or pr.reload_s, outcome.config
        run.save()
        if pr.status not in ("failed", "skipped"):
            self._walk_phase(phase, pr)
            self._end_sequences(f"the end of phase {phase.name}", every=True)
        return pr

    def _end_sequences(self, before: str, every: bool) -> None:
        """Sequences the server may still hold open get their END now, outside any window,
        so the next phase, config or run finds every sequence slot free (docs/scenarios.md)."""
        run = self.run
        ended = run.drive.end_sequences(run.scenario.target.timeout_s + 1, every)
        if ended:
            run.events.add(SequencesEnded(before, ended))

    def _wind_up(self) -> None:
        """Drain, restore every model's config, judge the run, write the final results."""
        run = self.run
        run.drive.end(run.scenario.target.timeout_s + 1)
        self._end_sequences("the end of the run", every=True)
        self.target = None
        self.current = None
        self._set_stage("restoring", 0)
        try:
            failures = gevent.get_hub().threadpool.apply(run.controller.restore)
        except Exception as exc:  # the control plane itself broke: every model is unknown
            failures = [{"model": m, "detail": str(exc)} for m in run.controller.applied]
        for failure in failures:
            run.events.add(RestoreFailed(**failure))
        self._judge()
        try:
            results = run.result.to_json()
            run.result.comparisons = comparisons(results, *judging(results))
        except Exception as exc:  # the measurements stand; say why the verdicts are missing
            log.exception("the comparisons could not be made")
            run.events.add(ReportRenderFailed(f"comparisons: {exc!r}"))
        run.result.finished_at = utcnow()
        run.save(final=True)

    def _judge(self) -> None:
        """A run that walked its phases is `failed` (exit 1) when what it measured is known to
        be wrong or empty (accounting.run_failures); an interrupted or aborted run keeps its status
        and exit code, with the same reasons added."""
        result = self.run.result
        reasons = self._failures(result.to_json())
        if not reasons:
            return
        if result.status == "complete":
            result.status = "failed"
            result.reason = "; ".join(reasons)
        else:
            result.reason = "; ".join([result.reason, *reasons])
        self.exit_code = self.exit_code or 1

    def _failures(self, results: dict[str, Any]) -> list[str]:
        return run_failures(results)

    def _walk_phase(self, phase: PhasePlan, pr: PhaseResult) -> None:
        """The phase's planned steps, in order (run/capacity.py chooses them as it goes)."""
        for step in phase.steps:
            self._run_step(step, pr)
            self.run.save()
            if phase.thresholds.abort_on_fail:
                self._check_abort(phase.thresholds.items, pr)
            if self.aborted:
                pr.status = "partial"
                break

    def _check_abort(self, thresholds: tuple[Threshold, ...], pr: PhaseResult) -> None:
        """abort_on_fail: stop at the first step that breaks a threshold (report still written,
        configs still restored, exit 1)."""
        broken = failed(check_phase(thresholds, pr.to_json()))
        if broken:
            o = broken[0]
            self.abort(f"threshold {o.threshold} failed in phase {o.phase}: {o.message}", 1)
            self.run.events.add(ThresholdAbort(phase=o.phase, threshold=o.threshold,
                                               detail=o.message))

    def _wait_users(self, count: int) -> None:
        runner = self.run.environment.runner
        deadline = time.monotonic() + SPAWN_WAIT_S
        while runner is not None and runner.user_count != count and time.monotonic() < deadline:
            if not self._sleep(0.05) or self.run.drive.missing_senders():
                return

    def _watch(self, seconds: float) -> bool:
        """Sleep like _sleep, checking every second that the server can still be reached;
        False (and `lost_at` set) when it cannot."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if not self._sleep(min(left, LIVENESS_S)):
                return False
            if not self.run.controller.server_live():
                self.lost_at = utcnow()
                return False
            if self._sampler is not None:  # the timeline's server side, once a second
                self._sampler.tick()
        return True

    def _watch_stable(self, step: Step, spec: Stability) -> tuple[bool, dict[str, Any]]:
        """Watch window after window until the last ones agree or the maximum is reached
        (run/stability.py); (whether the whole time passed, the `stability` section)."""
        t0 = time.monotonic()
        values: list[dict[str, float]] = []
        became = False
        while time.monotonic() - t0 + step.duration_s <= spec.max_s + 1e-9:
            if not self._watch(step.duration_s):
                return False, stability.report(spec, values, False, time.monotonic() - t0)
            window = self.run.drive.live_window()
            if window is not None:
                values = stability.window_values(window, step.duration_s,
                                                 time.monotonic() - t0, self.run.batch_sizes)
            if stability.stable(values, spec):
                became = True
                break
        return True, stability.report(spec, values, became, time.monotonic() - t0)

    def _snapshot(self) -> Snapshot | None:
        try:
            return self.run.controller.snapshot()
        except Exception as exc:  # the server went away: the step keeps its client side
            log.warning("server statistics unavailable: %s", exc)
            return None

    def _run_step(self, step: Step, pr: PhaseResult) -> None:
        run, drive = self.run, self.run.drive
        drain_s = run.scenario.target.timeout_s + 1
        self.current = step
        users = drive.users_for(step)
        self.target = (users, max(1000.0, users * 100.0))
        self._set_stage("spawning", 0)
        self._wait_users(users)
        missing = drive.missing_senders()
        if missing:  # e.g. every worker was refused: nothing can be measured
            self.abort(f"{missing}; stopped before step {step.key}", 1, "aborted")
            return
        self._end_sequences(f"step {step.key}", every=False)  # e.g. users that stopped
        self._set_stage("warm-up", step.warmup_s)
        drive.begin(step, record=False)
        if step.warmup_s > 0 and not self._watch(step.warmup_s):
            drive.end(drain_s)
            if self.lost_at:
                self._await_server(step)
            return
        drive.end(drain_s)
        before = self._snapshot()
        started_at = utcnow()
        self._set_stage("measuring", step.duration_s)
        t0 = time.monotonic()
        sampler = self._sampler = Sampler(run.controller.metrics, run.controller.watched,
                                          drive.in_flight)
        sampler.start(before.metrics if before is not None else None)
        drive.begin(step, record=True)
        settled: dict[str, Any] = {}
        if step.stable is None:
            completed = self._watch(step.duration_s)
        else:
            completed, settled = self._watch_stable(step, step.stable)
        got = drive.end(drain_s)
        duration = time.monotonic() - t0
        self._sampler = None
        after = self._snapshot() if before is not None else None
        if after is not None:
            sampler.samples.append((time.monotonic() - sampler.t0, after.metrics,
                                    drive.in_flight()))
        assert got is not None
        if not got.drained:
            run.events.add(DrainTimeout(step.key, got.in_flight))
        lost = got.workers.get("lost") if got.workers else None
        ok = completed and got.drained and not lost and after is not None
        result = self._result(step, got, before, after, started_at, duration,
                              "ok" if ok else "partial", sampler.rows())
        result.stability = settled
        done = [i for i, s in enumerate(pr.steps) if s.index == step.index]
        if done:
            pr.steps[done[0]] = result  # the rounds so far, pooled
        else:
            pr.steps.append(result)
        if result.accounting["status"] == "mismatch":
            log.warning("step %s: accounting mismatch: %s", step.key, result.accounting["reason"])
            run.events.add(AccountingMismatch(step.key, result.accounting["reason"]))
        if self.lost_at:
            self._await_server(step)

    def _result(self, step: Step, got: Collected, before: Snapshot | None,
                after: Snapshot | None, started_at: str, duration: float, status: str,
                rows: dict[int, dict[str, Any]]) -> StepResult:
        """The step's result: this round's, or every round so far pooled (run/rounds.py),
        with each metric's interval (loadkit/stats.py)."""
        run = self.run
        confidence = run.scenario.confidence
        base: dict[str, Any] = dict(
            step=step, batch_sizes=run.batch_sizes, calls=run.template_calls,
            models=run.template_models,
            shared=run.scenario.target.shared, composing=run.composing,
            goodput=run.scenario.goodput is not None, input_tokens=run.input_tokens)
        one = build_step_result(StepContext(**base, got=got, before=before, after=after,
                                            started_at=started_at, duration_s=duration,
                                            status=status, server_rows=rows))
        pool = (self._pools.setdefault(step.key, Pool(step=step, order=self.ROUNDS))
                if run.plan.repeats > 1 else None)
        if pool is not None:
            pool.add(got, before, after, duration, rows, started_at)
            pool.keep(one)
        if pool is None or len(pool.rounds) == 1:  # one round: intervals from its seconds
            round_intervals(one, step, got.window.seconds, run.batch_sizes, confidence)
            return one
        b, a = pool.snapshots()
        statuses = {r["status"] for r in pool.rounds}
        pooled = build_step_result(StepContext(
            **base, got=pool.collected(got.in_flight), before=b, after=a,
            started_at=pool.started_at, duration_s=pool.duration_s,
            status="ok" if statuses == {"ok"} else "partial", server_rows=pool.server_rows))
        pooled.rounds = list(pool.rounds)
        pooled.timeline = list(pool.timeline)
        pooled_intervals(pooled, confidence, self.ROUNDS)
        return pooled

    def _await_server(self, step: Step) -> None:
        """The server could not be reached: wait for it as the scenario says, then go on (it
        came back: reload the models at this phase's config) or stop with what we have."""
        run = self.run
        target = run.scenario.target
        lost_at, self.lost_at = self.lost_at, ""
        run.events.add(ServerLost(at=lost_at, step=step.key, policy=target.on_server_loss,
                                  wait_s=target.server_loss_wait_s))
        run.save()
        self._set_stage("waiting for the server", target.server_loss_wait_s)
        t0 = time.monotonic()
        while time.monotonic() - t0 < target.server_loss_wait_s:
            if not self._sleep(LIVENESS_S):
                return
            if run.controller.server_live():
                try:
                    run.controller.recover()
                except Exception as exc:
                    self.abort(f"the server came back but its models did not load: {exc}", 1,
                               "aborted")
                    return
                run.events.add(ServerBack(round(time.monotonic() - t0, 1)))
                return
        self.abort(
            f"server lost at {lost_at} during step {step.key} and not back within "
            f"{target.server_loss_wait_s:g} s (on_server_loss: {target.on_server_loss})", 1,
            "aborted",
        )

    def status(self) -> dict[str, Any]:
        step = self.current
        elapsed = time.monotonic() - self.stage_started
        window = self.run.drive.live_window()
        return {
            "title": self.title or (step.phase if step else ""),
            # a search chooses its steps as it goes: no total to say (capacity's probes)
            "steps": None if self.CHOOSES_STEPS else
            len(self.phase.steps) if self.phase is not None else 0,
            "phase": step.phase if step else "",
            "step": step.index if step else None,
            "concurrency": step.concurrency if step else None,
            "load": step.label if step else "",
            "stage": self.stage,
            "elapsed_s": elapsed,
            "remaining_s": max(0.0, self.stage_length_s - elapsed),
            "window": window,
        }
