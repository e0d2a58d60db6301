"""One measured step's result, built from what the drive collected and the server's counters
before and after it: client and server sides, the generator's own cost, the open loop's
schedule, and the run's own accounting check (run/accounting.py).

Each section has its own builder over one `StepContext`, so a new measurement family adds a
builder and a context field, not a parameter to every caller."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadkit.control.client import diff_counters
from loadkit.control.controller import Snapshot
from loadkit.control.metrics import diff_metrics
from loadkit.plan import Step
from loadkit.record import StepWindow, latency_summary
from loadkit.run.accounting import ANY, check_step
from loadkit.run.drive import Collected
from loadkit.run.offered import per_second
from loadkit.run.results import StepResult
from loadkit.run.streaming import streaming_results
from loadkit.run.timeline import client_rows, step_rows


@dataclass(frozen=True, kw_only=True)
class StepContext:
    """Everything one step's result is built from."""

    step: Step
    got: Collected
    before: Snapshot | None
    after: Snapshot | None
    started_at: str
    duration_s: float
    status: str
    batch_sizes: dict[str, int]
    # template -> {model: requests there per request} (accounting.template_calls); a plain
    # template -> model map means each template reaches its own model only
    calls: dict[str, Any]
    shared: bool = False
    models: dict[str, str] = field(default_factory=dict)  # template -> the model it calls
    composing: dict[str, str] = field(default_factory=dict)  # model -> ensemble/BLS model
    goodput: bool = False
    input_tokens: dict[str, tuple[float, str]] = field(default_factory=dict)
    server_rows: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def window(self) -> StepWindow:
        return self.got.window

    def per_s(self, n: float) -> float:
        return round(n / self.duration_s, 2) if self.duration_s > 0 else 0.0


def build_step_result(ctx: StepContext) -> StepResult:
    window = ctx.window
    streamed, streaming = streaming_results(window, ctx.duration_s, ctx.goodput,
                                            ctx.input_tokens)
    merged = window.merged()
    requests = merged.get_total_count()
    inferences = sum(window.successes(n) * b for n, b in ctx.batch_sizes.items())
    calls = {n: ({m: 1} if isinstance(m, str) else m) for n, m in ctx.calls.items()
             if n in ctx.batch_sizes}
    server, metrics, unavailable = _server(ctx, calls)
    return StepResult(
        phase=ctx.step.phase,
        index=ctx.step.index,
        load=ctx.step.load,
        status=ctx.status,
        started_at=ctx.started_at,
        duration_s=round(ctx.duration_s, 4),
        requests=requests,
        inferences=inferences,
        errors=_errors(window),
        throughput=ctx.per_s(inferences),
        requests_per_s=ctx.per_s(requests),
        latency_us=latency_summary(merged),
        client=_client(ctx, streamed),
        server=server,
        metrics=metrics,
        generator=_generator(ctx, requests),
        histograms=window.encoded(),
        out_of_range=window.out_of_range,
        open_loop=_open_loop(ctx),
        service_histograms=window.encoded_service(),
        workers=ctx.got.workers,
        error_messages={
            code: [{"message": t, "count": n} for t, n in kept.items()]
            for code, kept in window.messages.items()
        },
        accounting=check_step(window, calls, server, unavailable,
                              ctx.step.arrivals is not None, ctx.shared),
        server_unavailable=unavailable,
        streaming=streaming,
        timeline=step_rows(client_rows(window, ctx.duration_s, ctx.batch_sizes),
                           ctx.server_rows),
    )


def _errors(window: StepWindow) -> dict[str, int]:
    out: dict[str, int] = {}
    for counter in window.errors.values():
        for code, n in counter.items():
            out[code] = out.get(code, 0) + n
    return out


def _client(ctx: StepContext, streamed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per template that sent anything: its requests, errors, latencies and extras."""
    window = ctx.window
    out: dict[str, Any] = {}
    for name in ctx.batch_sizes:
        if not (window.successes(name) or window.errors.get(name)
                or window.cancelled.get(name)):
            continue
        c: dict[str, Any] = {"requests": window.successes(name),
                             "errors": sum(window.errors.get(name, {}).values())}
        if name in ctx.models:
            c["model"] = ctx.models[name]
        c["throughput"] = ctx.per_s(window.successes(name) * ctx.batch_sizes[name])
        if window.errors.get(name):
            c["errors_by_code"] = dict(window.errors[name])
        for key, counter in (("dropped", window.dropped), ("late", window.late)):
            if counter.get(name):
                c[key] = counter[name]
        c["latency_us"] = (latency_summary(window.histograms[name])
                           if name in window.histograms else {})
        if name in window.payloads:
            c["distinct_payloads"] = len(window.payloads[name])
        if name in window.sequences:
            c["sequences"] = window.sequences[name].get_total_count()
            c["sequence_latency_us"] = latency_summary(window.sequences[name])
        c.update(streamed.get(name, {}))
        if window.cancelled.get(name):
            c["cancelled"] = window.cancelled[name]
        out[name] = c
    return out


def _server(ctx: StepContext, calls: dict[str, dict[str, int | None]]
            ) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """(the server's counter deltas per model, its metrics' deltas, {model: why unread})."""
    before, after = ctx.before, ctx.after
    if before is None or after is None:
        why = "the server's statistics could not be read " + (
            "before the step" if before is None else "after the step")
        return {}, {}, dict.fromkeys({m for c in calls.values() for m in c if m != ANY}, why)
    server: dict[str, Any] = {}
    unavailable = {**before.unavailable, **after.unavailable}
    for m in after.counters:
        if m not in before.counters:
            continue
        if after.counters[m].success < before.counters[m].success:
            unavailable[m] = "its statistics restarted during the step (the model was loaded again)"
            continue
        server[m] = diff_counters(before.counters[m], after.counters[m])
        if m in ctx.composing:
            server[m]["composing_of"] = ctx.composing[m]
    return server, diff_metrics(before.metrics, after.metrics, tuple(after.counters)), unavailable


def _generator(ctx: StepContext, requests: int) -> dict[str, Any]:
    """What the generator cost: its CPU (per request sent, failed ones included: they cost as
    much), memory, and the mean µs of each latency spent in loadkit's own framing (in the
    latency, as a C client's is in perf_analyzer's)."""
    window, cpu, d = ctx.window, ctx.got.cpu_s, ctx.duration_s
    return {
        "cpu_s": round(cpu, 4),
        "cpu_us_per_request": round(cpu / window.sent * 1e6, 1) if window.sent else 0.0,
        "cpu_util": round(cpu / d, 3) if d > 0 else 0.0,
        "rss_mb": round(ctx.got.rss_bytes / 2**20, 1),
        "own_us_per_request": round(window.own_us / requests, 1) if requests else 0.0,
    }


def _open_loop(ctx: StepContext) -> dict[str, Any]:
    """The schedule against what was sent: dropped, late, achieved rate (open loops only)."""
    a = ctx.step.arrivals
    if a is None:
        return {}
    window = ctx.window
    dropped, late = sum(window.dropped.values()), sum(window.late.values())
    sent, scheduled = window.sent, window.scheduled
    return {
        "rate": a.rate,
        "arrival": a.arrival,
        "max_concurrency": a.max_concurrency,
        "scheduled": scheduled,
        "sent": sent,
        "dropped": dropped,
        "late": late,
        "late_tolerance_ms": round(a.late_tolerance_s * 1000, 3),
        # each send's delay after its scheduled time: the generator's own faithfulness
        "lateness_us": latency_summary(window.merged_lateness()),
        "dropped_ratio": round(dropped / scheduled, 5) if scheduled else 0.0,
        "achieved_rate": ctx.per_s(sent),
        "latency_from": "scheduled send time (service_latency_us: from the actual send)",
        "service_latency_us": latency_summary(window.merged_service()),
        # what held the schedule back: arrivals that found every slot busy waited on the
        # server (its queue filled the in-flight slots); sends that left late, on loadkit
        "limited_by": "server" if dropped else "generator" if late > 0.01 * max(sent, 1)
        else "",
        "generator_limited": late > 0.01 * max(sent, 1),
        **({"replay": {**a.replay.summary(), "per_second": per_second(
            a.replay, window, ctx.step.warmup_s, ctx.step.duration_s)}}
           if a.replay is not None else {}),
    }
