"""Prometheus parsing and per-step diffs (pure functions; the live check is in test_controller)."""

from __future__ import annotations

import pytest

from loadkit.control.metrics import diff_metrics, parse_metrics

TEXT = """# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="dense",version="1"} 120
nv_inference_request_success{model="other",version="1"} 7
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="dense",reason="REJECTED",version="1"} 3
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-1"} 0.5
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.25
"""


pytestmark = pytest.mark.fast


def test_parse_keeps_triton_names_reasons_and_gpu_labels() -> None:
    snap = parse_metrics(TEXT)
    assert snap.counters[("dense", "nv_inference_request_success")] == 120
    assert snap.counters[("dense", "nv_inference_request_failure:REJECTED")] == 3
    assert snap.gauges == {"nv_gpu_utilization/GPU-1": 0.5, "nv_cpu_utilization": 0.25}
    assert snap.has_gpu


def test_diff_per_model_and_counter_reset_after_reload() -> None:
    before = parse_metrics(TEXT)
    after = parse_metrics(TEXT.replace("} 120", "} 150").replace("} 7", "} 9"))
    d = diff_metrics(before, after, ("dense",))
    assert d["models"] == {"dense": {"request_success": 30.0, "request_failure:REJECTED": 0.0}}
    reloaded = parse_metrics(TEXT.replace("} 120", "} 5"))  # counters restarted from zero
    assert diff_metrics(before, reloaded, ("dense",))["models"]["dense"]["request_success"] == 5
    assert "error" in diff_metrics(parse_metrics(""), type(before)(error="down"), ("dense",))
