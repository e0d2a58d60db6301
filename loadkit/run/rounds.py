"""`repeats: N`: one step measured in N interleaved rounds, pooled. The pooled step is built as
any step is (run/step_result.py), from the rounds' windows merged sample for sample (their
seconds laid end to end) and the server's counter deltas summed, so every invariant the run
checks (client == server per model, the timeline adds up) holds for the pool as for a round.
Each round's own numbers stay in `rounds`: the intervals and verdicts are made from them."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from loadkit.control.client import ModelCounters
from loadkit.control.controller import Snapshot
from loadkit.control.metrics import MetricsSnapshot
from loadkit.plan import Step
from loadkit.record import Second, StepWindow
from loadkit.run.drive import Collected
from loadkit.run.results import RunResult, StepResult
from loadkit.stats import (
    across_rounds,
    against_baseline,
    comparisons,
    imprecise,
    undecided,
    within_run,
)
from loadkit.stats.sequential import design

ROUND_KEYS = ("started_at", "duration_s", "status", "requests", "throughput",
              "requests_per_s", "latency_us")


def _combine(a: ModelCounters, b: ModelCounters, sign: int) -> ModelCounters:
    """a + b (sign 1) or a - b (sign -1), field by field."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(ModelCounters):
        x, y = getattr(a, f.name), getattr(b, f.name)
        out[f.name] = ({k: x.get(k, 0) + sign * y.get(k, 0) for k in {*x, *y}}
                       if isinstance(x, dict) else x + sign * y)
    return ModelCounters(**out)


@dataclass(kw_only=True)
class Pool:
    """The rounds of one step so far."""

    step: Step
    order: str = "interleaved"  # or "back-to-back" (tune, capacity): compare pairs only the first
    window: StepWindow | None = None
    counters: dict[str, ModelCounters] = field(default_factory=dict)  # deltas, summed
    metrics: MetricsSnapshot = field(default_factory=MetricsSnapshot)
    unavailable: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    cpu_s: float = 0.0
    rss_bytes: int = 0
    drained: bool = True
    server_rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    workers: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    unread: bool = False  # some round's server statistics could not be read
    _offset: int = 0  # where the next round's seconds go in the merged window
    _starts: list[int] = field(default_factory=list)  # where each round's seconds begin
    # each round's own timeline rows, `t` moved to where its seconds go in the pool: a
    # round's last, partial second keeps its own length (the pool's would read it as whole)
    timeline: list[dict[str, Any]] = field(default_factory=list)

    def add(self, got: Collected, before: Snapshot | None, after: Snapshot | None,
            duration_s: float, server_rows: dict[int, dict[str, Any]], started_at: str) -> None:
        """One more round of the step."""
        self.started_at = self.started_at or started_at
        wire = got.window.to_wire()
        seconds = {int(i): s for i, s in wire["seconds"].items()}
        self._starts.append(self._offset)
        wire["seconds"] = {str(i + self._offset): s for i, s in seconds.items()}
        if self.window is None:
            self.window = StepWindow(step=self.step)
        self.window.add_wire(wire)
        self.server_rows.update({i + self._offset: r for i, r in server_rows.items()})
        self._offset += max([*seconds, *server_rows, int(duration_s)], default=0) + 1
        self.duration_s += duration_s
        self.cpu_s += got.cpu_s
        self.rss_bytes = max(self.rss_bytes, got.rss_bytes)
        self.drained = self.drained and got.drained
        self.workers = got.workers or self.workers
        if before is None or after is None:
            self.unread = True  # the sums would miss a round: the pool has no server side
            return
        self.unavailable.update({**before.unavailable, **after.unavailable})
        for m, c in after.counters.items():
            if m in before.counters:
                delta = _combine(c, before.counters[m], -1)
                self.counters[m] = _combine(self.counters.get(m, ModelCounters()), delta, 1)
        for key, value in after.metrics.counters.items():
            delta = value - before.metrics.counters.get(key, 0.0)
            self.metrics.counters[key] = self.metrics.counters.get(key, 0.0) + max(delta, 0.0)
        self.metrics.gauges = dict(after.metrics.gauges)
        self.metrics.error = after.metrics.error or before.metrics.error

    def collected(self, in_flight: int) -> Collected:
        assert self.window is not None
        return Collected(window=self.window, drained=self.drained, cpu_s=self.cpu_s,
                         rss_bytes=self.rss_bytes, in_flight=in_flight,
                         workers=self.workers)

    def snapshots(self) -> tuple[Snapshot | None, Snapshot | None]:
        """(zero, the sums): the pair build_step_result diffs into the pooled server side;
        (None, None) when a round's statistics could not be read."""
        if self.unread:
            return None, None
        zero = {m: ModelCounters() for m in self.counters}
        return (Snapshot(zero, MetricsSnapshot(error=self.metrics.error)),
                Snapshot(dict(self.counters), self.metrics, dict(self.unavailable)))

    def keep(self, result: StepResult) -> None:
        """A round's own numbers, for its intervals and the verdicts."""
        r = result.to_json()
        start = self._starts[len(self.rounds)]
        self.timeline += [{**row, "t": row["t"] + start} for row in result.timeline]
        entry = {"round": len(self.rounds) + 1, "order": self.order,
                 # where this round's seconds begin in the pooled step's timeline (`t`): the
                 # report draws each round at its own time (run/timeline.py run_timeline)
                 "timeline_from_s": start,
                 **{k: r[k] for k in ROUND_KEYS},
                 "accounting": r["accounting"]["status"]}
        if len(r["client"]) > 1:  # each template's own, for its own comparisons
            entry["templates"] = {n: {"throughput": c["throughput"], "latency_us": {
                k: c["latency_us"].get(k) for k in ("p50", "p90", "p99")}}
                for n, c in r["client"].items() if c.get("latency_us")}
        if r.get("streaming"):
            entry["streaming"] = {k: r["streaming"][k] for k in
                                  ("first_response_us", "inter_response_us")}
        self.rounds.append(entry)


def round_intervals(one: StepResult, step: Step, seconds: dict[int, Second],
                    batch_sizes: dict[str, int], confidence: float) -> None:
    """A step of one round: intervals from its seconds (batch means), each template's
    throughput too where it sent several."""
    # a replay's seconds follow its file's shape by design: not a steady state whose seconds
    # sample one mean (only rounds give it intervals)
    if step.arrivals is not None and step.arrivals.replay is not None:
        one.intervals = {}
        return
    values = {"throughput": one.throughput, **one.latency_us}
    one.intervals = within_run(seconds, one.duration_s, batch_sizes, values, confidence)
    if len(one.client) > 1:
        one.template_intervals = {n: within_run(
            seconds, one.duration_s, batch_sizes, {"throughput": c["throughput"]}, confidence,
            n) for n, c in one.client.items()}


def pooled_intervals(pooled: StepResult, confidence: float, how: str) -> None:
    """A pooled step: intervals across its rounds, each template's too."""
    pooled.intervals = across_rounds(pooled.rounds, pooled.to_json(), confidence, how)
    if len(pooled.client) > 1:
        pooled.template_intervals = {n: across_rounds(
            [(r.get("templates") or {}).get(n) or {} for r in pooled.rounds],
            {"throughput": c["throughput"], "latency_us": c["latency_us"]}, confidence, how)
            for n, c in pooled.client.items()}


class Looks:
    """`repeats: auto`: after each round from the design's first look, whether to stop: every
    comparison decided, the most rounds taken, or another round would pass `max_time_s`.
    Each look is judged at the design's nominal level (loadkit/stats/sequential.py), and the
    looks are kept in results.json's `sequential`."""

    def __init__(self, result: RunResult, confidence: float, noise: float, max_rounds: int,
                 max_time_s: float, baseline: dict[str, Any] | None = None) -> None:
        self.result, self.noise, self.max_time_s = result, noise, max_time_s
        self.baseline = baseline  # `--baseline`: its comparisons are looked at too
        self.design = design(confidence, max_rounds)
        self.started = self.last = time.monotonic()
        result.sequential = {
            "design": self.design.describe(), "confidence": confidence,
            "nominal_confidence": round(self.design.nominal, 6),
            "looks_at": list(self.design.looks), "max_rounds": max_rounds,
            "max_time_s": max_time_s or None, "looks": [], "rounds": 0, "stopped": ""}

    def _fit(self, round_s: float) -> None:
        """After the first round, before any look: the most rounds `max_time` leaves room
        for, so the design spends its alpha on looks that can happen (the schedule then
        depends on the round's length only, never on a result: the design stays valid)."""
        fits = int(self.max_time_s // max(round_s, 1e-3))
        most = max(self.design.looks[0], min(self.design.max_rounds, fits))
        if most < self.design.max_rounds:
            self.design = design(self.design.confidence, most)
            self.result.sequential.update(
                design=self.design.describe(), nominal_confidence=round(self.design.nominal, 6),
                looks_at=list(self.design.looks), max_rounds=most,
                fitted=f"max_time {self.max_time_s:g} s fits {fits} round(s) of "
                       f"{round_s:.1f} s")

    def stop(self, done: int) -> bool:
        """Round `done` has ended: True when no more rounds should be taken."""
        now = time.monotonic()
        round_s, self.last = now - self.last, now
        seq = self.result.sequential
        seq["rounds"] = self.result.repeats = done
        late = bool(self.max_time_s) and now - self.started + round_s > self.max_time_s
        if done == 1 and self.max_time_s:
            self._fit(round_s)
        if done < self.design.looks[0]:
            if late:  # judged at the design's level all the same, with the rounds there are
                seq["stopped"] = (f"max_time: another round would pass {self.max_time_s:g} "
                                  f"s, before the first look (round {self.design.looks[0]})")
            return late
        now_json = self.result.to_json()
        judged = (self.design.nominal, self.noise, self.design.max_rounds)
        changes = comparisons(now_json, *judged)
        if self.baseline is not None:
            changes += against_baseline(self.baseline, now_json, *judged)
        left = undecided(changes)
        look = {"round": done, "comparisons": len(changes), "undecided": len(left),
                "elapsed_s": round(now - self.started, 1)}
        if changes:
            what = "comparison(s) undecided"
            if not left:
                seq["stopped"] = "decided: every comparison is better, worse or same"
        else:
            # nothing to compare (a baseline for a later `--baseline` run): rounds until every
            # estimate is within half the noise threshold at the stated level, since a later
            # unpaired comparison can be no surer than the rounds it leans on here
            left = imprecise(now_json, self.noise / 2)
            look["imprecise"] = len(left)
            what = f"estimate(s) wider than ±{self.noise / 2:.1%}"
            if not left:
                seq["stopped"] = (f"precise: nothing to compare, and every estimate is within "
                                  f"±{self.noise / 2:.1%} at {self.result.confidence:.0%}")
        seq["looks"].append(look)
        if not left:
            pass  # stopped above: decided, or precise
        elif done >= self.design.max_rounds:
            seq["stopped"] = f"max_repeats: {done} rounds, {len(left)} {what}"
        elif late:
            seq["stopped"] = (f"max_time: another round would pass {self.max_time_s:g} s; "
                              f"{len(left)} {what}")
        return bool(seq["stopped"])
