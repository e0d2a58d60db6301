"""One measured step's result, built from what the drive collected and the server's counters
before and after it: client and server sides, the generator's own cost, the open loop's
schedule, and the run's own accounting check (run/accounting.py)."""

from __future__ import annotations

from typing import Any

from loadkit.control.client import diff_counters
from loadkit.control.controller import Snapshot
from loadkit.control.metrics import diff_metrics
from loadkit.plan import Step
from loadkit.record import latency_summary
from loadkit.run.accounting import ANY, check_step
from loadkit.run.drive import Collected
from loadkit.run.results import StepResult
from loadkit.run.streaming import streaming_results
from loadkit.run.timeline import client_rows, step_rows


def build_step_result(
    step: Step,
    got: Collected,
    before: Snapshot | None,
    after: Snapshot | None,
    started_at: str,
    duration_s: float,
    status: str,
    batch_sizes: dict[str, int],
    template_models: dict[str, str] | dict[str, dict[str, int | None]],
    shared: bool = False,
    composing: dict[str, str] | None = None,
    goodput: bool = False,
    input_tokens: dict[str, tuple[float, str]] | None = None,
    server_rows: dict[int, dict[str, Any]] | None = None,
) -> StepResult:
    window = got.window
    streamed, streaming = streaming_results(window, duration_s, goodput, input_tokens or {})
    merged = window.merged()
    requests = merged.get_total_count()
    inferences = sum(window.successes(n) * b for n, b in batch_sizes.items())
    errors: dict[str, int] = {}
    for counter in window.errors.values():
        for code, n in counter.items():
            errors[code] = errors.get(code, 0) + n
    client = {
        name: {
            "requests": window.successes(name),
            "errors": sum(window.errors.get(name, {}).values()),
            **({"errors_by_code": dict(window.errors[name])} if window.errors.get(name)
               else {}),
            **({"dropped": window.dropped[name]} if window.dropped.get(name) else {}),
            **({"late": window.late[name]} if window.late.get(name) else {}),
            "latency_us": latency_summary(window.histograms[name])
            if name in window.histograms
            else {},
            **({"distinct_payloads": len(window.payloads[name])}
               if name in window.payloads else {}),
            **({"sequences": window.sequences[name].get_total_count(),
                "sequence_latency_us": latency_summary(window.sequences[name])}
               if name in window.sequences else {}),
            **streamed.get(name, {}),
            **({"cancelled": window.cancelled[name]} if window.cancelled.get(name) else {}),
        }
        for name in batch_sizes
        if window.successes(name) or window.errors.get(name) or window.cancelled.get(name)
    }
    server: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    # template -> {model: requests there per request} (accounting.template_calls); a plain
    # template -> model map means each template reaches its own model only
    calls = {n: ({m: 1} if isinstance(m, str) else m) for n, m in template_models.items()
             if n in batch_sizes}
    unavailable: dict[str, str] = {}
    if before is not None and after is not None:
        unavailable = {**before.unavailable, **after.unavailable}
        for m in after.counters:
            if m not in before.counters:
                continue
            if after.counters[m].success < before.counters[m].success:
                unavailable[m] = ("its statistics restarted during the step (the model was "
                                  "loaded again)")
                continue
            server[m] = diff_counters(before.counters[m], after.counters[m])
            if composing and m in composing:
                server[m]["composing_of"] = composing[m]
        metrics = diff_metrics(before.metrics, after.metrics, tuple(after.counters))
    else:
        why = "the server's statistics could not be read " + (
            "before the step" if before is None else "after the step")
        unavailable = dict.fromkeys({m for c in calls.values() for m in c if m != ANY}, why)
    cpu = got.cpu_s
    generator: dict[str, Any] = {
        "cpu_s": round(cpu, 4),
        # per request sent, failed ones included: they cost the generator as much
        "cpu_us_per_request": round(cpu / window.sent * 1e6, 1) if window.sent else 0.0,
        "cpu_util": round(cpu / duration_s, 3) if duration_s > 0 else 0.0,
        "rss_mb": round(got.rss_bytes / 2**20, 1),
        # the mean µs of each latency spent in loadkit's own framing (in the latency, as a C
        # client's is in perf_analyzer's); what the server and the network took is the rest
        "own_us_per_request": round(window.own_us / requests, 1) if requests else 0.0,
    }
    open_loop: dict[str, Any] = {}
    if step.arrivals is not None:
        a = step.arrivals
        dropped = sum(window.dropped.values())
        late = sum(window.late.values())
        sent = window.sent
        scheduled = window.scheduled
        open_loop = {
            "rate": a.rate,
            "arrival": a.arrival,
            "max_concurrency": a.max_concurrency,
            "scheduled": scheduled,
            "sent": sent,
            "dropped": dropped,
            "late": late,
            "late_tolerance_ms": round(a.late_tolerance_s * 1000, 3),
            "dropped_ratio": round(dropped / scheduled, 5) if scheduled else 0.0,
            "achieved_rate": round(sent / duration_s, 2) if duration_s > 0 else 0.0,
            "latency_from": "scheduled send time (service_latency_us: from the actual send)",
            "service_latency_us": latency_summary(window.merged_service()),
            "generator_limited": bool(dropped or late > 0.01 * max(sent, 1)),
        }
    return StepResult(
        phase=step.phase,
        index=step.index,
        load=step.load,
        status=status,
        started_at=started_at,
        duration_s=round(duration_s, 4),
        requests=requests,
        inferences=inferences,
        errors=errors,
        throughput=round(inferences / duration_s, 2) if duration_s > 0 else 0.0,
        requests_per_s=round(requests / duration_s, 2) if duration_s > 0 else 0.0,
        latency_us=latency_summary(merged),
        client=client,
        server=server,
        metrics=metrics,
        generator=generator,
        histograms=window.encoded(),
        out_of_range=window.out_of_range,
        open_loop=open_loop,
        service_histograms=window.encoded_service(),
        workers=got.workers,
        error_messages={
            code: [{"message": t, "count": n} for t, n in kept.items()]
            for code, kept in window.messages.items()
        },
        accounting=check_step(window, calls, server, unavailable, step.arrivals is not None,
                              shared),
        server_unavailable=unavailable,
        streaming=streaming,
        timeline=step_rows(client_rows(window, duration_s, batch_sizes), server_rows or {}),
    )
