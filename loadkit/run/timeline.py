"""The timeline: each measured step second by second, the client's side from the window's
per-second buckets (record.Second, merged across workers) and the server's from Triton's
metrics, sampled once a second by the conductor on the same clock (the window's opening).

A row per second: requests, errors by code, infer/s, p50/p99/max (µs), sent, scheduled and
dropped, in flight (this process's, sampled), and per model the server's successes, failures
by reason (REJECTED: a queue policy or max_queue_size refused it), queue and compute per
request, pending requests, and the server's CPU/GPU gauges. docs/results.md lists the fields.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from loadkit.control.metrics import MetricsSnapshot
from loadkit.record import StepWindow

GAUGE_NAMES = {
    "nv_cpu_utilization": "cpu_util",
    "nv_gpu_utilization": "gpu_util",
    "nv_gpu_memory_used_bytes": "gpu_memory_bytes",
    "nv_gpu_power_usage": "gpu_power_w",
}


def client_rows(window: StepWindow, duration_s: float,
                batch_sizes: dict[str, int]) -> list[dict[str, Any]]:
    """One row per second since the window opened (a second without a completion is a row of
    zeros: a stall shows); the seconds of the drain after the window are kept."""
    window.settle()
    if not window.seconds:
        return []
    rows = []
    for i in range(max(window.seconds) + 1):
        sec = window.seconds.get(i)
        length = duration_s - i if 0 < duration_s - i < 1 else 1.0
        if sec is None:
            rows.append({"t": i, "requests": 0, "errors": {}, "infer_s": 0.0, "sent": 0})
            continue
        ok = sum(sec.ok.values())
        row: dict[str, Any] = {
            "t": i,
            "requests": ok,
            "errors": dict(sec.errors),
            "infer_s": round(sum(n * batch_sizes.get(t, 1) for t, n in sec.ok.items())
                             / length, 2),
            "sent": sec.sent,
        }
        if length < 1.0:
            row["length_s"] = round(length, 3)  # the window's last, partial second
        if ok:
            h = sec.hist
            row.update(p50_us=h.get_value_at_percentile(50.0),
                       p99_us=h.get_value_at_percentile(99.0), max_us=h.get_max_value())
        if sec.scheduled or sec.dropped:
            row.update(scheduled=sec.scheduled, dropped=sec.dropped)
        rows.append(row)
    return rows


class Sampler:
    """Triton's metrics (and this process's in-flight requests) once a second during a
    measured window; `rows()` turns the samples into per-second server rows."""

    def __init__(self, scrape: Callable[[], MetricsSnapshot], models: tuple[str, ...],
                 in_flight: Callable[[], int | None]):
        self.scrape = scrape
        self.models = models
        self.in_flight = in_flight
        self.samples: list[tuple[float, MetricsSnapshot, int | None]] = []
        self.t0 = 0.0

    def start(self, first: MetricsSnapshot | None = None) -> None:
        self.t0 = time.monotonic()
        self.samples = [(0.0, first if first is not None else self.scrape(), self.in_flight())]

    def tick(self) -> None:
        if self.samples:
            self.samples.append((time.monotonic() - self.t0, self.scrape(), self.in_flight()))

    def rows(self) -> dict[int, dict[str, Any]]:
        """{second: {in_flight, server: {model: {...}}, gauges: {...}}} from consecutive
        samples; a second whose scrape failed says so."""
        out: dict[int, dict[str, Any]] = {}
        for (t_a, a, _), (_, b, flight) in zip(self.samples, self.samples[1:], strict=False):
            row: dict[str, Any] = {}
            if flight is not None:
                row["in_flight"] = flight
            if a.error or b.error:
                row["server_error"] = a.error or b.error
            else:
                row["server"] = {m: _model_delta(a, b, m) for m in self.models
                                 if (m, "nv_inference_request_success") in b.counters}
                gauges: dict[str, float] = {}
                for key, value in b.gauges.items():
                    name = GAUGE_NAMES.get(key.split("/")[0])
                    if name:
                        gauges[name] = round(gauges.get(name, 0.0) + value, 3)
                row["gauges"] = gauges
            out[int(t_a + 0.25)] = row  # the second the interval began in (ticks drift late)
        return out


def _model_delta(a: MetricsSnapshot, b: MetricsSnapshot, model: str) -> dict[str, Any]:
    def d(name: str) -> float:
        v = b.counters.get((model, name), 0.0) - a.counters.get((model, name), 0.0)
        return v if v >= 0 else b.counters.get((model, name), 0.0)  # reloaded in between

    ok = d("nv_inference_request_success")
    row: dict[str, Any] = {"success": int(ok)}
    failed = {k.split(":", 1)[1]: int(v) for (m, k), _ in b.counters.items()
              if m == model and k.startswith("nv_inference_request_failure:")
              and (v := d(k)) > 0}
    if failed:
        row["failure"] = failed
    if ok > 0:
        row["queue_us"] = round(d("nv_inference_queue_duration_us") / ok, 1)
        row["compute_infer_us"] = round(d("nv_inference_compute_infer_duration_us") / ok, 1)
    pending = b.counters.get((model, "nv_inference_pending_request_count"))
    if pending is not None:
        row["pending"] = int(pending)
    return row


def step_rows(client: list[dict[str, Any]], server: dict[int, dict[str, Any]]
              ) -> list[dict[str, Any]]:
    """The client's rows with the server's second by second (server rows for seconds without
    a client row are kept: a stalled second shows on both sides)."""
    by_t = {r["t"]: dict(r) for r in client}
    for t, row in server.items():
        by_t.setdefault(t, {"t": t, "requests": 0, "errors": {}, "infer_s": 0.0, "sent": 0})
        by_t[t].update(row)
    return [by_t[t] for t in sorted(by_t)]


def run_timeline(started_at: str, phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every measured second of the run, in time order, `at` in seconds since the run started.
    A step pooled from rounds lays its rounds' seconds end to end (`t`); each second goes back
    to its own round's time here (`round` says which), so the rounds interleave as they ran."""
    t0 = datetime.fromisoformat(started_at)

    def since(stamp: str) -> float:
        return (datetime.fromisoformat(stamp) - t0).total_seconds()

    out = []
    for p in phases:
        for s in p["steps"]:
            rounds = [r for r in s.get("rounds") or [] if "timeline_from_s" in r]
            for row in s.get("timeline", []):
                r = next((r for r in reversed(rounds) if r["timeline_from_s"] <= row["t"]),
                         None)
                if r is None:
                    at, extra = since(s["started_at"]) + row["t"], {}
                else:
                    at = since(r["started_at"]) + row["t"] - r["timeline_from_s"]
                    extra = {"round": r["round"]}
                out.append({"at": round(at, 3), "phase": p["name"], "step": s["index"],
                            **extra, **row})
    out.sort(key=lambda row: row["at"])
    return out
