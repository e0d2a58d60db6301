"""Triton's Prometheus endpoint: nv_inference_* counters per model, CPU/GPU gauges per step.

The text format is parsed with prometheus_client's own parser. The statistics API stays the
source of truth for accounting; the metrics add what only they carry (failure reasons,
pending requests, CPU and GPU utilization and memory).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# Per-model counters, summed over versions; diffed per step.
MODEL_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "nv_inference_pending_request_count",  # a gauge: requests waiting or executing now
)
# Server-wide gauges, taken at the end of a step (Triton refreshes them every metrics interval).
GAUGES = (
    "nv_cpu_utilization",
    "nv_cpu_memory_used_bytes",
    "nv_cpu_memory_total_bytes",
    "nv_gpu_utilization",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_power_usage",
)


@dataclass
class MetricsSnapshot:
    """One scrape: counters keyed (model, metric[, reason]) and gauges keyed metric[/gpu]."""

    counters: dict[tuple[str, str], float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    error: str = ""

    @property
    def has_gpu(self) -> bool:
        return any(k.startswith("nv_gpu_") for k in self.gauges)


def parse_metrics(text: str) -> MetricsSnapshot:
    snap = MetricsSnapshot()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # prometheus_client names counter samples <family>_total; Triton's have no suffix.
            name = family.name if family.type == "counter" else sample.name
            labels, value = sample.labels, float(sample.value)
            if name in MODEL_COUNTERS and "model" in labels:
                key = name if "reason" not in labels else f"{name}:{labels['reason']}"
                k = (labels["model"], key)
                snap.counters[k] = snap.counters.get(k, 0.0) + value
            elif name in GAUGES:
                gpu = labels.get("gpu_uuid")
                snap.gauges[f"{name}/{gpu}" if gpu else name] = value
    return snap


def scrape(url: str, timeout_s: float = 5.0) -> MetricsSnapshot:
    """Scrape once; an unreachable endpoint is recorded, never fatal to the run."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (http only)
            return parse_metrics(resp.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return MetricsSnapshot(error=f"{url}: {exc}")


def diff_metrics(
    before: MetricsSnapshot, after: MetricsSnapshot, models: tuple[str, ...]
) -> dict[str, Any]:
    """{models: {model: {metric: delta}}, gauges: {...}} for one step, or the scrape error."""
    if before.error or after.error:
        return {"error": before.error or after.error}
    per_model: dict[str, dict[str, float]] = {}
    for (model, key), value in after.counters.items():
        if model not in models:
            continue
        delta = value - before.counters.get((model, key), 0.0)
        if key == "nv_inference_pending_request_count":
            delta = value  # a gauge: its value at the end, not a difference
        elif delta < 0:  # the model was reloaded in between: Triton restarted its counters
            delta = value
        name = key.removeprefix("nv_inference_")
        per_model.setdefault(model, {})[name] = round(delta, 3)
    return {"models": per_model, "gauges": dict(sorted(after.gauges.items()))}
