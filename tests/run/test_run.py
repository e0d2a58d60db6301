"""End to end against the real embedded Triton: every request accounted for, the mix honoured,
HDR percentiles in microseconds, errors counted by gRPC status, and exits that never hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    assert_accounted,
    dense_cnn,
    loadkit,
    parent_of,
    processes,
    results,
    steps_on_disk,
    wait_for,
    wait_inside_step,
    write,
)

from loadkit.record import decode

# its module fixtures (a shared run or server) are built once: the file runs whole on one
# test worker (make test, --dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_run")


@pytest.fixture(scope="module")
def mix_run(triton, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("mix")
    scen = write(tmp / "mix.yaml", dense_cnn(name="mix", conc="[2, 4]", dur="4s"))
    out = tmp / "report"
    proc = loadkit("run", str(scen), "--target", triton.grpc_address, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return {"out": out, "proc": proc, "results": results(out)}


def test_every_request_is_accounted_for(mix_run) -> None:
    steps = mix_run["results"]["phases"][0]["steps"]
    assert [s["load"]["concurrency"] for s in steps] == [2, 4]
    for step in steps:
        assert step["requests"] > 500
        assert step["errors"] == {}
        assert_accounted(step)
        for model in ("dense", "cnn"):
            assert step["server"][model]["fail"] == 0
        gen = step["generator"]  # the generator's own cost over the window
        assert 0 < gen["cpu_s"] < 2 * step["duration_s"] and gen["rss_mb"] > 20
        # cpu_s is rounded in the file: within one rounding step (106.25 rounds either way)
        assert abs(gen["cpu_us_per_request"] - gen["cpu_s"] / step["requests"] * 1e6) <= 0.1


def test_mix_lands_near_70_30_by_server_counts(mix_run) -> None:
    dense = sum(s["server"]["dense"]["success"] for s in mix_run["results"]["phases"][0]["steps"])
    cnn = sum(s["server"]["cnn"]["success"] for s in mix_run["results"]["phases"][0]["steps"])
    assert abs(dense / (dense + cnn) - 0.70) < 0.03


def test_percentiles_are_ordered_microseconds(mix_run) -> None:
    for step in mix_run["results"]["phases"][0]["steps"]:
        lat = step["latency_us"]
        order = [lat[k] for k in ("p50", "p90", "p95", "p99", "p999", "max")]
        assert order == sorted(order)
        assert lat["p50"] > 50  # microseconds: a gRPC round trip is far above 50 us
        assert any(v % 1000 for v in order)  # not whole milliseconds
        inferences = (
            step["client"]["dense_b1"]["requests"] + 4 * step["client"]["cnn_b4"]["requests"]
        )
        assert step["inferences"] == inferences
        assert step["throughput"] == pytest.approx(inferences / step["duration_s"], rel=1e-3)


def test_report_files_and_saved_histograms(mix_run) -> None:
    out: Path = mix_run["out"]
    for name in ("results.json", "summary.md", "histograms.json", "loadkit.log"):
        assert (out / name).exists(), name
    hist = json.loads((out / "histograms.json").read_text())
    for step in mix_run["results"]["phases"][0]["steps"]:
        saved = hist["only"][str(step["index"])]
        assert sum(decode(v).get_total_count() for v in saved.values()) == step["requests"]
    summary = (out / "summary.md").read_text()
    assert ("| concurrency | infer/s | mean | p50 | p90 | p95 | p99 | p99.9 | max | errors |"
            in summary)
    assert "report:" in mix_run["proc"].stdout
    # two templates: the merged row says `all`, each template has its own row and numbers
    step = mix_run["results"]["phases"][0]["steps"][0]
    load = step["load"]["concurrency"]
    dense = step["client"]["dense_b1"]["latency_us"]
    assert f"| {load} all | {step['throughput']:.1f}" in summary
    assert f"| {load} dense_b1 | " in summary and f"| {load} cnn_b4 | " in summary
    assert f"| {dense['mean'] / 1000:.3f} | {dense['p50'] / 1000:.3f} |" in summary
    comparison = (out / "comparison.md").read_text()
    assert "| dense_b1 (dense) |" in comparison and "cnn: batch 4.00" in comparison
    assert "dense: batch 1.00" in comparison  # per model, never blended


def test_steps_csv_has_perf_analyzers_columns(mix_run) -> None:
    """perf_analyzer 2.34's `-f` header (bench/.tools/perf_analyzer -f, concurrency mode):
    every column loadkit measures keeps its name; one row per step and template."""
    import csv

    header = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,"
              "Server Queue,Server Compute Input,Server Compute Infer,"
              "Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,"
              "p99 latency")
    perf_analyzer = set(header.split(","))
    not_measured = {"Client Send", "Network+Server Send/Recv", "Client Recv"}
    rows = list(csv.DictReader((mix_run["out"] / "steps.csv").open()))
    assert perf_analyzer - not_measured <= set(rows[0])
    steps = mix_run["results"]["phases"][0]["steps"]
    assert len(rows) == sum(len(s["client"]) for s in steps)
    for row in rows:
        step = steps[int(row["Step"]) - 1]
        client = step["client"][row["Template"]]
        assert int(row["Requests"]) == client["requests"]
        assert int(row["p99 latency"]) == round(client["latency_us"]["p99"])
        assert int(row["Concurrency"]) == step["load"]["concurrency"]
        batch = 4 if row["Template"] == "cnn_b4" else 1
        assert float(row["Inferences/Second"]) == pytest.approx(
            client["requests"] * batch / step["duration_s"], abs=0.01)
        server = step["server"][row["Model"]]
        assert int(row["Server Queue"]) == round(server["queue_us"])


def test_requests_to_a_missing_model_are_counted_as_errors(triton, control, tmp_path) -> None:
    """cnn is unloaded in the middle of the measured step (and loaded again after the run):
    its requests fail with Triton's own message kept, its statistics cannot be read after the
    step and are reported as unavailable (never zeros), and dense stays exact."""
    scen = write(tmp_path / "m.yaml", dense_cnn(name="missing", w1=50, w2=50, conc="4", dur="5s"))
    out = tmp_path / "r"
    start = control.counters(("cnn",))["cnn"].success

    def unload_mid_step() -> None:
        # 1500 cnn requests (x4 inferences) served: past the 0.5 s warm-up, inside the step
        wait_for(lambda: control.counters(("cnn",))["cnn"].success - start > 1500, 60,
                 "load on cnn")
        control.unload("cnn")

    t = threading.Thread(target=unload_mid_step)
    t.start()
    try:
        proc = loadkit("run", str(scen), "--target", triton.grpc_address, "--out", str(out))
    finally:
        t.join()
        control.load("cnn")
    assert proc.returncode == 0, proc.stderr  # cnn was measured before it went: loud, not failed
    step = results(out)["phases"][0]["steps"][0]
    assert step["errors"], "unloading cnn mid-step must produce counted errors"
    assert all(code.isupper() for code in step["errors"])  # gRPC status names
    assert step["client"]["cnn_b4"]["errors"] == sum(step["errors"].values())
    assert step["client"]["cnn_b4"]["requests"] > 0
    kept = " ".join(m["message"] for ms in step["error_messages"].values() for m in ms)
    assert "cnn" in kept, step["error_messages"]  # Triton's words, e.g. "unknown model"
    assert "statistics unavailable" in step["server_unavailable"]["cnn"]
    assert step["accounting"]["status"] == "unchecked" and "cnn" not in step["server"]
    # dense was untouched: its accounting stays exact
    assert step["server"]["dense"]["success"] == step["client"]["dense_b1"]["requests"]
    summary = (out / "summary.md").read_text().split("## only")[0]
    assert "requests failed" in summary and "not checked for cnn" in summary


def _tritons(under: int | None = None) -> set[int]:
    return processes("bin/tritonserver", under)


def _orphans(before: set[int]) -> set[int]:
    """Servers started since `before` whose starter is gone: a python process starts every
    embedded server (a test's, a worker's), so one left to init or a shell was leaked."""
    def orphaned(pid: int) -> bool:
        try:
            return b"python" not in Path(f"/proc/{parent_of(pid)}/cmdline").read_bytes()
        except OSError:  # the parent is gone: orphaned, unless the server went too
            return parent_of(pid) != 0
    return {p for p in _tritons() - before if orphaned(p)}


def test_default_run_starts_and_stops_embedded_server_repeatedly(tmp_path) -> None:
    """Exit must never hang: two full `loadkit run`s with the embedded server, each bounded."""
    scen = write(tmp_path / "q.yaml", """
name: exit
requests:
  dense_b1: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
phases: [{name: only, load: {concurrency: 2, step_duration: 1s, warmup: 0.5s}}]
""")  # dense only: the cnn model's onnxruntime start-up adds seconds and tests nothing here
    before = _tritons()
    for i in range(2):
        out = tmp_path / f"r{i}"
        t0 = time.monotonic()
        proc = loadkit("run", str(scen), "--out", str(out), "--quiet", timeout=90)
        assert proc.returncode == 0, proc.stderr
        assert time.monotonic() - t0 < 60
        data = results(out)
        assert data["embedded"] is True and data["status"] == "complete"
        assert (out / "tritonserver.log").stat().st_size > 0
        assert_accounted(data["phases"][0]["steps"][0])
        assert not _orphans(before)


def test_plain_locust_headless_runs_the_scenario_and_exits(triton, tmp_path) -> None:
    scen = write(tmp_path / "l.yaml", dense_cnn(name="plain", conc="[1, 3]", dur="2s"))
    for i in range(2):
        out = tmp_path / f"r{i}"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "locust",
                "-f",
                str(ROOT / "locustfile.py"),
                "--headless",
                "--scenario",
                str(scen),
                "--triton-target",
                triton.grpc_address,
                "--loadkit-out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=90,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        steps = results(out)["phases"][0]["steps"]
        assert [s["load"]["concurrency"] for s in steps] == [1, 3]
        for s in steps:
            assert_accounted(s)


def test_sigint_mid_step_keeps_completed_steps_and_exits_130(triton, tmp_path) -> None:
    scen = write(tmp_path / "i.yaml", dense_cnn(name="intr", conc="[2, 4]", dur="4s", warmup="0s"))
    out = tmp_path / "r"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadkit",
            "run",
            str(scen),
            "--target",
            triton.grpc_address,
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    wait_inside_step(out, triton.grpc_address, "dense", 1)  # then interrupt step 2
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    data = results(out)
    assert data["status"] == "interrupted"
    steps = data["phases"][0]["steps"]
    assert steps[0]["status"] == "ok"
    assert steps[1]["status"] == "partial"
    for s in steps:
        assert_accounted(s)


def test_sigkill_keeps_finished_steps_on_disk_and_leaves_no_server(tmp_path) -> None:
    """SIGKILL runs no handler at all: results.json (written atomically per step) still holds the
    finished steps, and the kernel stops the embedded server (PR_SET_PDEATHSIG)."""
    scen = write(tmp_path / "k.yaml", dense_cnn(name="kill", conc="[1, 2, 4]", dur="3s"))
    out = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadkit", "run", str(scen), "--out", str(out), "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
    )
    try:
        wait_for(lambda: steps_on_disk(out) >= 1, 90, "step 1 on disk")
        mine = _tritons(under=proc.pid)
        assert mine, "the embedded server should be running"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    data = results(out)
    assert data["status"] == "running"  # it never got to say otherwise
    steps = data["phases"][0]["steps"]
    assert len(steps) >= 1 and steps[0]["status"] == "ok"
    assert_accounted(steps[0])
    wait_for(lambda: not mine & _tritons(), 20,
             "the embedded tritonserver to go with loadkit (no orphan)")
