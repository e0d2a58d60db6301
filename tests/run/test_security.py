"""Secrets never reach the report folder or the console; loopback binds by default; SIGTERM mid-
run of a distributed run leaves no server or worker behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from conftest import ROOT, loadkit, processes, results, wait_for, wait_inside_step, write

TOKEN = "lk-test-token-7f3a9c0e51d2"


def test_header_token_from_env_is_sent_but_never_written(triton, tmp_path) -> None:
    scen = write(tmp_path / "s.yaml", """
name: secret
target:
  headers: {authorization: "Bearer ${TRITON_TOKEN}", x-team: loadkit}
requests:
  dense_b1:
    model: dense
    inputs:
      INPUT0: {dtype: FP32, shape: [256], data: random}
phases:
  - name: only
    load: {concurrency: 2, step_duration: 1s, warmup: 0s}
""")
    out = tmp_path / "r"
    proc = loadkit("run", str(scen), "--target", triton.grpc_address, "--out", str(out),
                   env={"TRITON_TOKEN": TOKEN})
    assert proc.returncode == 0, proc.stderr
    step = results(out)["phases"][0]["steps"][0]
    assert step["requests"] > 0 and step["server"]["dense"]["success"] == step["requests"]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) >= 5
    for path in files:
        assert TOKEN.encode() not in path.read_bytes(), path
    assert TOKEN not in proc.stdout and TOKEN not in proc.stderr
    # the redacted scenario still says a header was set, and where it came from
    headers = results(out)["scenario"]["target"]["headers"]
    assert "authorization" in headers and TOKEN not in str(headers)


def test_master_bound_beyond_loopback_warns(tmp_path) -> None:
    scen = write(tmp_path / "s.yaml", """
name: bind
target: {grpc: "127.0.0.1:1"}
requests:
  a: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
phases: [{name: x, load: {concurrency: 1, step_duration: 1s}}]
""")
    proc = loadkit("validate", "--offline", str(scen))
    assert proc.returncode == 0
    from loadkit.cli import build_parser
    from loadkit.locust.workers import master_address

    args = build_parser().parse_args(["run", str(scen), "--master", "--master-bind-host",
                                      "0.0.0.0"])
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert master_address(args) == ("0.0.0.0", 5557)
    assert "warning" in err.getvalue() and "0.0.0.0:5557" in err.getvalue()
    args = build_parser().parse_args(["run", str(scen), "--workers", "2"])
    host, port = master_address(args)
    assert host == "127.0.0.1" and port > 0


def test_sigterm_mid_distributed_run_exits_143_and_leaves_no_process(tmp_path) -> None:
    """Embedded server + master + 2 workers; SIGTERM in step 2."""
    scen = write(tmp_path / "s.yaml", """
name: term
requests:
  dense_b1:
    model: dense
    inputs:
      INPUT0: {dtype: FP32, shape: [256], data: random}
phases:
  - name: only
    load: {concurrency: [2, 2, 2], step_duration: 3s, warmup: 0s}
""")
    out = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadkit", "run", str(scen), "--workers", "2", "--out", str(out),
         "--quiet"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_inside_step(out, None, "dense", 1)  # step 2 is sending
        servers, workers = processes("bin/tritonserver", proc.pid), processes(
            "loadkit worker", proc.pid)
        assert servers and len(workers) == 2, (servers, workers)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr[-2000:]
    data = results(out)
    steps = data["phases"][0]["steps"]
    assert data["status"] == "interrupted" and steps[0]["status"] == "ok"
    assert steps[-1]["status"] == "partial"
    assert steps[0]["server"]["dense"]["success"] == steps[0]["requests"]
    wait_for(lambda: not servers & processes("bin/tritonserver"), 20, "the embedded server to go")
    wait_for(lambda: not workers & processes("loadkit worker"), 20, "the worker processes to go")
