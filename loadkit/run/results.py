"""The results a run produces: small dataclasses that the report stage renders.

Latencies are integer microseconds from HDR histograms; `throughput` is successful inferences
(requests x batch size) per second, as perf_analyzer counts them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

RESULTS_FORMAT = "loadkit.results/1"  # results.json's `format`: readers check it; never rename

# What each status means: docs/results.md.
RunStatus = Literal["running", "complete", "failed", "interrupted", "aborted"]
PhaseStatus = Literal["ok", "partial", "failed", "skipped"]
StepStatus = Literal["ok", "partial"]  # partial: interrupted, or the server or a worker went


@dataclass(kw_only=True)
class StepResult:
    phase: str
    index: int
    load: dict[str, Any]
    status: StepStatus
    started_at: str
    duration_s: float
    requests: int
    inferences: int
    errors: dict[str, int]
    throughput: float
    requests_per_s: float
    latency_us: dict[str, float]
    client: dict[str, dict[str, Any]]
    server: dict[str, dict[str, Any]]
    metrics: dict[str, Any] = field(default_factory=dict)
    # The load generator's own cost over the window: cpu_s, cpu_us_per_request, cpu_util, rss_mb,
    # own_us_per_request (the part of each latency spent in its own framing).
    generator: dict[str, Any] = field(default_factory=dict)
    histograms: dict[str, str] = field(default_factory=dict)
    out_of_range: int = 0
    # Open loop only: scheduled/sent/dropped/late counts and the latency from the actual send
    # (`latency_us` then counts from the scheduled send time).
    open_loop: dict[str, Any] = field(default_factory=dict)
    service_histograms: dict[str, str] = field(default_factory=dict)
    # Distributed runs only: how many workers sent load, which replied, which were lost.
    workers: dict[str, Any] = field(default_factory=dict)
    # Per status code, the first distinct messages the server (or the connection) gave, with
    # counts: [{"message": ..., "count": ...}] (record.MESSAGES_PER_CODE at most, truncated).
    error_messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # The run's own check that every request is accounted for (accounting.check_step).
    accounting: dict[str, Any] = field(default_factory=dict)
    # Models whose server statistics could not be read for this step, and why (never zeros).
    server_unavailable: dict[str, str] = field(default_factory=dict)
    # Decoupled (streaming) models only: the step's first_response_us, inter_response_us,
    # responses, tokens/s and goodput over every streaming template (run/streaming.py); each
    # template's own are in `client`.
    streaming: dict[str, Any] = field(default_factory=dict)
    # One row per second of the window (run/timeline.py): client and server side.
    timeline: list[dict[str, Any]] = field(default_factory=list)
    # `repeats: N`: each round's own numbers (the step's are the rounds pooled: run/rounds.py)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    # per metric, the value with its confidence interval and how it was had (loadkit/stats.py)
    intervals: dict[str, Any] = field(default_factory=dict)
    # a step of several templates: each template's own intervals (throughput within a run;
    # throughput and percentiles across rounds), so each is compared on its own
    template_intervals: dict[str, Any] = field(default_factory=dict)
    # until_stable: whether the step became stable, after how long, each window's numbers
    stability: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("histograms")
        out.pop("service_histograms")
        if not self.open_loop:
            out.pop("open_loop")
        if not self.workers:
            out.pop("workers")
        if not self.server_unavailable:
            out.pop("server_unavailable")
        if not self.streaming:
            out.pop("streaming")
        if not self.rounds:
            out.pop("rounds")
        if not self.stability:
            out.pop("stability")
        if not self.template_intervals:
            out.pop("template_intervals")
        return out


@dataclass(kw_only=True)
class PhaseResult:
    name: str
    status: PhaseStatus = "ok"
    reason: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    reload_s: dict[str, float] = field(default_factory=dict)
    steps: list[StepResult] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "reason": self.reason,
            "config": self.config,
            "reload_s": self.reload_s,
            "steps": [s.to_json() for s in self.steps],
        }


@dataclass(kw_only=True)
class RunResult:
    scenario_name: str
    scenario: dict[str, Any]
    target: str
    embedded: bool
    started_at: str
    finished_at: str = ""
    status: RunStatus = "running"
    reason: str = ""
    phases: list[PhaseResult] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    thresholds: list[dict[str, Any]] = field(default_factory=list)  # slo.Outcome as JSON
    capacity: dict[str, Any] = field(default_factory=dict)  # `loadkit capacity` only
    tune: dict[str, Any] = field(default_factory=dict)  # `loadkit tune` only
    # what each template with several distinct requests sends (plan.Plan.requests)
    requests: list[str] = field(default_factory=list)
    # `repeats: N` and `confidence`: how each step was measured and judged (loadkit/stats.py)
    repeats: int = 1
    confidence: float = 0.95
    noise_threshold: float = 0.05
    # `repeats: auto`: the sequential design, the looks taken and why the rounds stopped
    sequential: dict[str, Any] = field(default_factory=dict)
    # every phase against the reference phase, per load and metric, with its interval
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    # `loadkit tune --resume`: the earlier run's phases (JSON) and histograms, kept in front
    carried_phases: list[dict[str, Any]] = field(default_factory=list)
    carried_histograms: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {
            "format": RESULTS_FORMAT,
            "scenario_name": self.scenario_name,
            "scenario": self.scenario,
            "target": self.target,
            "embedded": self.embedded,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "status": self.status,
            "reason": self.reason,
            "events": self.events,
            "thresholds": self.thresholds,
            "phases": self.carried_phases + [p.to_json() for p in self.phases],
        }
        if self.requests:
            out["requests"] = self.requests
        out["repeats"], out["confidence"] = self.repeats, self.confidence
        out["noise_threshold"] = self.noise_threshold
        if self.sequential:
            out["sequential"] = self.sequential
        out["comparisons"] = self.comparisons
        if self.capacity:
            out["capacity"] = self.capacity
        if self.tune:
            out["tune"] = self.tune
        return out
