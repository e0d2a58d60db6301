"""Config overlays against the real embedded Triton: applied and read back, batching visible in
the server's own statistics, a rejected overlay fails only its phase, and the model is restored."""

from __future__ import annotations

from conftest import loadkit, results, write

SCENARIO = """
name: ctl
requests:
  d: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
phases:
  - name: baseline
    load: {concurrency: 8, step_duration: 2s, warmup: 0.5s}
  - name: batching
    load: {concurrency: 8, step_duration: 2s, warmup: 0.5s}
    config:
      dense:
        dynamic_batching: {preferred_batch_size: [4, 8], max_queue_delay_microseconds: 500}
  - name: rejected
    load: {concurrency: 8, step_duration: 1s, warmup: 0.2s}
    config:
      dense:
        dynamic_batching: {priority_levels: 2, default_priority_level: 5}
  - name: gpu
    load: {concurrency: 8, step_duration: 1s, warmup: 0.2s}
    config:
      dense:
        instance_group: [{count: 1, kind: KIND_GPU}]
  - name: plan
    load: {concurrency: 8, step_duration: 1s, warmup: 0.2s}
    requires: {files: [no_such/model.plan]}
"""


def test_overlay_applied_read_back_failed_and_restored(triton, control, tmp_path) -> None:
    assert "dynamic_batching" not in control.config("dense")
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "c.yaml", SCENARIO)), "--target",
                   triton.grpc_address, "--metrics", triton.metrics_url, "--out", str(out))
    # the refused phase measured nothing the user asked for: the run goes on, then fails
    assert proc.returncode == 1, proc.stderr
    data = results(out)
    assert data["status"] == "failed" and "phase 'rejected' failed" in data["reason"]
    assert "gpu" not in data["reason"] and "plan" not in data["reason"]  # skips are not failures
    base, batching, rejected, gpu, plan = data["phases"]
    assert "dynamic_batching" not in base["config"]["dense"]
    assert batching["config"]["dense"]["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert batching["reload_s"]["dense"] > 0
    assert base["steps"][0]["server"]["dense"]["avg_batch"] == 1.0
    assert batching["steps"][0]["server"]["dense"]["avg_batch"] > 1.0
    for phase in (base, batching):
        s = phase["steps"][0]
        assert s["server"]["dense"]["success"] == s["requests"]
        # Prometheus counters (parsed by prometheus_client) agree with the statistics API.
        assert s["metrics"]["models"]["dense"]["request_success"] == s["requests"]
        assert "nv_cpu_utilization" in s["metrics"]["gauges"]
    assert rejected["status"] == "failed" and rejected["reason"].startswith("dense: ")
    assert rejected["steps"] == []
    # Requirements the host lacks skip the phase with the reason; they are not failures.
    assert gpu["status"] == "skipped" and "no GPU" in gpu["reason"], gpu
    assert plan["status"] == "skipped" and "model.plan" in plan["reason"], plan
    assert gpu["steps"] == plan["steps"] == []
    assert control.model_ready("dense")  # Triton kept the last good config serving
    assert "dynamic_batching" not in control.config("dense")  # restored after the run
