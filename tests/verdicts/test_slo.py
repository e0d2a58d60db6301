"""SLO gates against the real embedded Triton: a pass/fail table, junit.xml, exit 1 on a broken
threshold, and abort_on_fail stopping early with the report written and configs restored."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from conftest import loadkit, results, write

from loadkit.scenario import Threshold
from loadkit.slo import check_phase

GATES = """
name: gates
requests:
  dense_b1:
    model: dense
    inputs: {INPUT0: {dtype: FP32, shape: [256], data: random, seed: 1}}
thresholds:
  p99: 500ms
  error_rate: 1%
  templates:
    dense_b1: {p50: 200ms}
phases:
  - name: easy
    load: {concurrency: [1, 2], step_duration: 1.5s, warmup: 0.5s}
  - name: strict
    load: {rate: 200, step_duration: 1.5s, warmup: 0.5s}
    thresholds: {p99: 10us, min_throughput: 100000}
"""

ABORT = """
name: abort
requests:
  dense_b1:
    model: dense
    inputs: {INPUT0: {dtype: FP32, shape: [256], data: random, seed: 1}}
thresholds: {p99: 10us, abort_on_fail: true}
phases:
  - name: first
    load: {concurrency: [1, 2, 4], step_duration: 1s, warmup: 0.2s}
    config: {dense: {dynamic_batching: {max_queue_delay_microseconds: 300}}}
  - name: never
    load: {concurrency: 1, step_duration: 1s}
"""


def test_broken_thresholds_fail_the_run_with_junit(triton, tmp_path) -> None:
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "g.yaml", GATES)), "--target",
                   triton.grpc_address, "--out", str(out))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Thresholds: FAILED (5 of 7 hold)" in proc.stdout
    data = results(out)
    assert data["status"] == "complete"
    by = {(o["phase"], o["threshold"]): o for o in data["thresholds"]}
    assert by[("easy", "p99")]["status"] == "pass"
    assert by[("easy", "p50[dense_b1]")]["status"] == "pass"
    assert by[("strict", "p99")]["status"] == "fail"  # the phase's own 10 µs overrides 500 ms
    assert by[("strict", "p99")]["limit"] == 10.0
    assert by[("strict", "min_throughput")]["status"] == "fail"
    # the worst step's HDR p99 is what the gate compared
    worst = max(s["latency_us"]["p99"] for s in data["phases"][0]["steps"])
    assert by[("easy", "p99")]["value"] == worst
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures")) == ("7", "2")
    failed = {c.get("name") for c in suite if c.find("failure") is not None}
    assert failed == {"p99", "min_throughput"}
    text = (out / "junit.xml").read_text()
    assert "g.yaml:17: p99" in text  # file:line of the broken threshold


def test_abort_on_fail_stops_early_writes_report_and_restores(triton, control, tmp_path) -> None:
    before = control.config("dense")
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "a.yaml", ABORT)), "--target",
                   triton.grpc_address, "--out", str(out))
    assert proc.returncode == 1, proc.stderr[-2000:]
    data = results(out)
    assert data["status"] == "interrupted" and "threshold p99 failed" in data["reason"]
    assert [p["name"] for p in data["phases"]] == ["first"]
    assert len(data["phases"][0]["steps"]) == 1  # stopped after the first broken step
    assert any(e["event"] == "threshold_abort" for e in data["events"])
    assert (out / "junit.xml").exists()
    assert control.config("dense") == before


@pytest.mark.fast
def test_a_threshold_holds_only_when_every_step_holds() -> None:
    """Pure: the worst step decides, and a step with nothing measured is `no data`, never a
    pass (unless another step fails outright)."""
    def step(load: int, p99: float, requests: int = 10) -> dict:
        return {"load": {"concurrency": load}, "requests": requests, "errors": {},
                "latency_us": {"p99": p99}, "client": {}, "throughput": 1.0}

    t = Threshold(metric="p99", limit=1000.0)
    phase = {"name": "p", "status": "ok", "reason": "", "steps": [step(1, 500), step(2, 1500)]}
    (o,) = check_phase((t,), phase)
    assert (o.status, o.value, o.step) == ("fail", 1500, "2")
    phase["steps"] = [step(1, 500), step(2, 900)]
    assert check_phase((t,), phase)[0].status == "pass"
    phase["steps"] = [step(1, 500), step(2, 0, requests=0)]
    assert check_phase((t,), phase)[0].status == "no data"
    phase["steps"] = [step(1, 1500), step(2, 0, requests=0)]
    assert check_phase((t,), phase)[0].status == "fail"
    skipped = {"name": "p", "status": "skipped", "reason": "no GPU", "steps": []}
    assert check_phase((t,), skipped)[0].status == "skipped"


@pytest.mark.fast
def test_an_slo_held_with_confidence_or_inconclusive() -> None:
    from loadkit.slo import slo_confidence

    slo = (Threshold(metric="p99", limit=50_000), Threshold(metric="p50", limit=5_000),
           Threshold(metric="error_rate", limit=0.01))
    intervals = {"p99": {"value": 40_000, "ci": [35_000, 45_000]},
                 "p50": {"value": 4_800, "ci": [4_500, 5_100]}}
    got = {c["metric"]: c["verdict"] for c in slo_confidence(slo, intervals, 0.95)}
    assert got == {"p99": "held", "p50": "inconclusive"}  # no interval for error_rate
    intervals["p99"]["value"] = 51_000
    assert slo_confidence(slo, intervals, 0.95)[0]["verdict"] == "broken"
