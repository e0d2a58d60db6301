"""The comparison report: deltas and best phases (pure), and against the real embedded Triton:
Ctrl-C in the middle of a config phase restores the model and still renders the report, and
`loadkit report` / `loadkit compare` regenerate identical tables from the saved data."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from conftest import ROOT, loadkit, results, wait_inside_step, write

from loadkit.report.compare import build
from loadkit.report.markdown import comparison_table


def _step(index: int, conc: int, infer_s: float, p99: float, batch: float) -> dict:
    execs = round(100 / batch)
    return {
        "index": index,
        "load": {"concurrency": conc},
        "status": "ok",
        "throughput": infer_s,
        "requests": 100,
        "errors": {},
        "latency_us": {"p50": p99 / 2, "p90": p99, "p95": p99, "p99": p99, "p999": p99,
                       "max": p99, "mean": p99 / 2},
        "server": {"m": {"success": 100, "exec_count": execs, "inference_count": 100,
                         "queue_us": 10.0, "compute_input_us": 1.0, "compute_infer_us": 50.0,
                         "compute_output_us": 1.0, "batch_executions": {}}},
        "intervals": {m: {"value": v, "se": 0.02 * v, "df": 9}
                      for m, v in (("throughput", infer_s), ("p99", p99))},
    }


def _phase(name: str, steps: list, status: str = "ok", reason: str = "") -> dict:
    return {"name": name, "status": status, "reason": reason, "reload_s": {}, "steps": steps}


@pytest.mark.fast
def test_build_deltas_best_phases_and_not_measured() -> None:
    run = {
        "scenario_name": "s",
        "phases": [
            _phase("base", [_step(0, 2, 100.0, 2000.0, 1.0), _step(1, 8, 200.0, 8000.0, 1.0)]),
            _phase("batch", [_step(0, 2, 150.0, 1000.0, 2.0), _step(1, 8, 500.0, 4000.0, 4.0)]),
            _phase("gpu", [], "skipped", "skipped: no GPU"),
        ],
    }
    cmp = build([("", run, {})])
    assert cmp.reference == "base" and cmp.loads == ("2", "8") and cmp.common == ("2", "8")
    row = next(r for r in cmp.rows if r.entry == "batch" and r.load == "8")
    assert row.changes["throughput"]["delta_pct"] == 150.0
    assert row.changes["p99"]["delta_pct"] == -50.0
    assert row.changes["throughput"]["verdict"] == row.changes["p99"]["verdict"] == "better"
    assert [(f.model, f.avg_batch, f.compute_us) for f in row.point.server] == [("m", 4.0, 52.0)]
    assert cmp.best_throughput[0] == "batch" and cmp.best_p99[:2] == ("batch", "8")
    md = comparison_table(cmp)
    assert "| 8 | batch | 500.0 | +150.0% [+" in md  # never a bare percentage
    assert "- gpu: skipped: skipped: no GPU" in md


@pytest.mark.fast
def test_plots_label_their_points_and_start_at_zero(monkeypatch) -> None:
    """p99 vs throughput: every point says its load, both axes from 0 (a ratio is read off
    them); throughput vs load from 0 too."""
    from loadkit.report import plots

    monkeypatch.setattr(plots, "_png", lambda fig: fig)  # the figure itself, to read back
    run = {"scenario_name": "s", "phases": [
        _phase("base", [_step(0, 2, 3000.0, 2000.0, 1.0), _step(1, 8, 3100.0, 8000.0, 1.0)])]}
    cmp = build([("", run, {})])
    fig = plots.p99_vs_throughput(cmp)
    ax = fig.axes[0]
    assert ax.get_xlim()[0] == 0 and ax.get_ylim()[0] == 0
    assert sorted(t.get_text() for t in ax.texts) == ["2", "8"]
    assert plots.throughput_vs_load(cmp).axes[0].get_ylim()[0] == 0


@pytest.mark.fast
def test_timeline_marks_say_each_steps_load() -> None:
    from loadkit.report.timeline import marks

    run = {"started_at": "2026-12-07T00:00:00+00:00", "events": [], "phases": [
        {"name": "a", "steps": [{"started_at": "2026-12-07T00:00:01+00:00",
                                 "load": {"concurrency": 4}},
                                {"started_at": "2026-12-07T00:00:05+00:00",
                                 "load": {"rate": 200.0}}]}]}
    phases, steps, _ = marks(run)
    assert phases == [(1.0, "a")] and [label for _, label in steps] == ["c=4", "200/s"]


SCENARIO = """
name: interrupted-tour
requests:
  d: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
phases:
  - name: baseline
    load: {concurrency: [4, 8], step_duration: 1.5s, warmup: 0.3s}
  - name: batching
    load: {concurrency: [4, 8, 12], step_duration: 3s, warmup: 0s}
    config:
      dense:
        dynamic_batching: {preferred_batch_size: [4, 8], max_queue_delay_microseconds: 500}
"""


def test_ctrl_c_mid_phase_restores_and_report_rerenders_identically(
    triton, control, tmp_path
) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadkit", "run", str(write(tmp_path / "t.yaml", SCENARIO)),
         "--target", triton.grpc_address, "--metrics", triton.metrics_url, "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    # the batching phase's first step on disk and its second one sending, then Ctrl-C
    wait_inside_step(out, triton.grpc_address, "dense", 1, phase=1)
    assert "dynamic_batching" in control.config("dense")  # the overlay is live mid-phase
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "dynamic_batching" not in control.config("dense")  # restored on Ctrl-C
    assert control.model_ready("dense")
    data = results(out)
    assert data["status"] == "interrupted"
    assert [e["event"] for e in data["events"]][-1] == "config_restored"
    base, batching = data["phases"]
    assert batching["status"] == "partial" and batching["steps"][-1]["status"] == "partial"

    md = (out / "comparison.md").read_text()
    assert "| 4 | batching |" in md and "Reference: **baseline**" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4
    for png in ("throughput_vs_concurrency.png", "p99_vs_throughput.png", "latency_spectrum.png",
                "timeline.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    before = {n: (out / n).read_text() for n in ("comparison.md", "summary.md")}
    for n in before:
        (out / n).unlink()
    proc2 = loadkit("report", str(out))
    assert proc2.returncode == 0, proc2.stderr
    assert {n: (out / n).read_text() for n in before} == before
    assert proc2.stdout == before["comparison.md"]

    cmp_dir = tmp_path / "cmp"
    proc3 = loadkit("compare", str(out), str(out), "--labels", "A,B", "--out", str(cmp_dir))
    assert proc3.returncode == 0, proc3.stderr
    md3 = (cmp_dir / "comparison.md").read_text()
    assert "Reference: **A/baseline**" in md3
    assert "| 8 | B/baseline |" in md3
    assert "+0.0% (no interval)" in md3  # 1.5 s steps: too short for a within-run interval
    assert (cmp_dir / "report.html").exists()


def test_report_of_a_folder_without_results_is_one_clear_error(tmp_path) -> None:
    proc = loadkit("report", str(tmp_path))
    assert proc.returncode == 2
    assert "results.json: not found" in proc.stderr and "Traceback" not in proc.stderr
