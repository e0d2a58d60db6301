"""Loud failures, against the real embedded Triton: the server's own words are kept, the run
checks its own accounting, a run that measured nothing (or wrongly) exits 1 and says why, and
models loadkit never saw (no batching, sequences, decoupled) are served or refused up front."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import ROOT, loadkit, results, wait_for, write

from loadkit.control.embedded import EmbeddedServer

ERRORS = """
name: errs
target: {{transport: {transport}}}
requests:
  d:
    model: dense
    inputs: {{INPUT0: {{dtype: FP32, shape: [256]}}}}
phases:
  - name: guard
    load: {{concurrency: 8, step_duration: 1s, warmup: 0.2s}}
    config:
      dense:
        parameters: {{device_us: {{string_value: "3000"}}}}
        dynamic_batching: {{default_queue_policy: {{max_queue_size: 1}}}}
"""


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_the_servers_error_messages_are_kept(triton, tmp_path, transport) -> None:
    """Triton's queue guard rejects most requests: the kept message is Triton's own text, with
    its count, in results.json and summary.md, whichever way it arrived (a stream's
    error_message or a unary call's grpc-message)."""
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "e.yaml", ERRORS.format(transport=transport))),
                   "--target", triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]  # errors without thresholds: loud, exit 0
    step = results(out)["phases"][0]["steps"][0]
    assert step["errors"], step
    kept = [(code, m["message"], m["count"]) for code, ms in step["error_messages"].items()
            for m in ms]
    assert any("Exceeds maximum queue size" in text for _, text, _ in kept), kept
    assert sum(n for *_, n in kept) == sum(step["errors"].values())
    assert step["accounting"]["status"] == "ok", step["accounting"]
    summary = (out / "summary.md").read_text()
    top = summary.split("## guard")[0]
    assert "WARNING:" in top and "requests failed" in top and "maximum queue size" in top
    assert "Errors, as the server gave them" in summary


NON_BATCHING = """
name: addsub
requests:
  as:
    model: add_sub
    inputs:
      INPUT0: {dtype: FP32, shape: [4], data: ones}
      INPUT1: {dtype: FP32, shape: [4], data: ones}
phases:
  - name: only
    load: {concurrency: [1, 4], step_duration: 1.5s, warmup: 0.3s}
"""


def test_a_model_without_batching_gets_no_batch_dimension(triton, tmp_path) -> None:
    """Triton's add_sub shape (max_batch_size 0, FP32 [4]): requests are [4], not [1, 4], every
    one succeeds, and infer/s counts requests."""
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "a.yaml", NON_BATCHING)), "--target",
                   triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for step in results(out)["phases"][0]["steps"]:
        assert step["requests"] > 0 and not step["errors"], step["error_messages"]
        assert step["inferences"] == step["requests"]
        assert step["server"]["add_sub"]["success"] == step["requests"]
        assert step["accounting"]["status"] == "ok"


STATEFUL = """
name: refused
requests:
  s:
    model: {model}
    inputs: {inputs}
phases:
  - name: only
    load: {{concurrency: 1, step_duration: 1s}}
"""


@pytest.mark.parametrize("model,inputs,what", [
    # (decoupled models are measured now: tests/loads/test_streaming.py; a decoupled model over
    # unary transport is refused in tests/bad_scenarios/server/09)
    ("accumulate", "{INPUT0: {dtype: INT32, shape: [1]}}", "sequence batching"),
])
def test_models_loadkit_cannot_measure_as_written_are_refused_before_any_load(
        triton, control, tmp_path, model, inputs, what) -> None:
    before = control.counters((model,))[model]
    proc = loadkit("run", str(write(tmp_path / "s.yaml", STATEFUL.format(model=model,
                                                                          inputs=inputs))),
                   "--target", triton.grpc_address, "--out", str(tmp_path / "r"))
    assert proc.returncode == 2, proc.stderr
    assert f"s.yaml:5: requests.s.model: model '{model}'" in proc.stderr
    assert what in proc.stderr and "nothing was sent" in proc.stderr
    assert "Traceback" not in proc.stderr
    after = control.counters((model,))[model]
    assert (after.success, after.fail) == (before.success, before.fail)


SHARED = """
name: shared
requests:
  d:
    model: dense
    inputs: {INPUT0: {dtype: FP32, shape: [256]}}
phases:
  - name: only
    load: {concurrency: 2, step_duration: 3s, warmup: 0.3s}
"""


@pytest.mark.parametrize("shared", [False, True])
def test_an_accounting_mismatch_fails_the_run(triton, tmp_path, shared) -> None:
    """Another client sends to the same model during the run (a shared server): the server
    counts requests loadkit never sent, so client != server. The run itself notices: the step
    is `accounting: mismatch` with the numbers, the summary says so at the top, exit 1. A
    scenario that declares the server shared (target.shared) gets the check skipped, said so."""
    stop = threading.Event()
    sent = {"n": 0}

    def other_client() -> None:
        client = grpcclient.InferenceServerClient(triton.grpc_address)
        x = grpcclient.InferInput("INPUT0", [1, 256], "FP32")
        x.set_data_from_numpy(np.ones((1, 256), np.float32))
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline and sent["n"] < 3000:
            client.infer("dense", [x])
            sent["n"] += 1
            stop.wait(0.01)
        client.close()

    scenario = SHARED.replace("name: shared", "name: shared\ntarget: {shared: true}") if shared \
        else SHARED
    t = threading.Thread(target=other_client)
    t.start()
    out = tmp_path / "r"
    try:
        wait_for(lambda: sent["n"] > 0, 30, "the other client's first request")
        proc = loadkit("run", str(write(tmp_path / "m.yaml", scenario)), "--target",
                       triton.grpc_address, "--out", str(out), "--quiet")
    finally:
        stop.set()
        t.join()
    data = results(out)
    step = data["phases"][0]["steps"][0]
    acc = step["accounting"]
    if shared:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert acc["status"] == "unchecked" and "target.shared" in acc["unchecked"][0]
        assert step["server"]["dense"]["success"] > step["requests"]
        return
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert data["status"] == "failed" and "accounting mismatch" in data["reason"]
    assert acc["status"] == "mismatch"
    broken = [c for c in acc["checks"] if not c["ok"]]
    assert broken[0]["left"] == step["requests"] < broken[0]["right"]
    assert "accounting_mismatch" in {e["event"] for e in data["events"]}
    top = (out / "summary.md").read_text().split("## only")[0]
    assert "failed" in top and "WARNING: accounting mismatch" in top
    assert "run failed: " in proc.stderr


FAILING = """
name: nothing
requests:
  d:
    model: dense
    inputs: {{INPUT0: {{dtype: FP32, shape: [256]}}}}
{cnn}
thresholds: {{p99: 50ms, max_dropped: 1%}}
phases:
  - name: broken
    load: {{concurrency: 2, step_duration: 1s, warmup: 0.2s}}
    config:
      dense: {{parameters: {{error_every: {{string_value: "1"}}}}}}
"""
CNN = """  c:
    model: cnn
    inputs: {image: {dtype: FP32, shape: [3, 32, 32]}}
mix: {d: 50, c: 50}"""


def test_a_run_that_measured_nothing_exits_1_and_says_why(triton, tmp_path) -> None:
    """Every request fails (the model errors on every execute): exit 1, `failed`, the server's
    message in the reason; the p99 threshold is `no data`, never `pass`; max_dropped does not
    apply to a closed loop."""
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "n.yaml", FAILING.format(cnn=""))), "--target",
                   triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 1, proc.stderr[-2000:]
    data = results(out)
    assert data["status"] == "failed"
    assert "nothing was measured" in data["reason"] and "injected error" in data["reason"]
    outcomes = {o["threshold"]: o for o in data["thresholds"]}
    assert outcomes["p99"]["status"] == "no data"
    assert outcomes["max_dropped"]["status"] == "skipped"
    summary = (out / "summary.md").read_text()
    assert "nothing measured in broken at 2" in summary and "NO DATA" in summary
    junit = (out / "junit.xml").read_text()
    assert 'failures="1"' in junit


def test_a_template_that_never_succeeded_fails_the_run(triton, tmp_path) -> None:
    """dense fails every request while cnn works: the step has successes, but one template
    measured nothing, and the run says which and why (exit 1)."""
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "n.yaml", FAILING.format(cnn=CNN))), "--target",
                   triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 1, proc.stderr[-2000:]
    data = results(out)
    assert data["status"] == "failed"
    assert "request template 'd': all" in data["reason"] and "injected" in data["reason"]
    step = data["phases"][0]["steps"][0]
    assert step["client"]["c"]["requests"] > 0 and step["accounting"]["status"] == "ok"


def test_a_failed_restore_exits_1_and_names_the_config_left(tmp_path) -> None:
    """The model's files vanish while a phase's overlay is loaded: restoring the original config
    fails. The run exits 1 and the summary names the model and the config it was left on."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository" / "dense", repo / "dense")
    server = EmbeddedServer(model_repository=repo, models=("dense",),
                            log_path=tmp_path / "triton.log").start()
    scen = write(tmp_path / "r.yaml", """
name: restore
requests:
  d: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
phases:
  - name: batching
    load: {concurrency: 2, step_duration: 2s, warmup: 0.2s}
    config: {dense: {dynamic_batching: {max_queue_delay_microseconds: 200}}}
""")
    out = tmp_path / "r"
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "loadkit", "run", str(scen), "--target", server.grpc_address,
             "--out", str(out), "--quiet"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wait_for(lambda: (out / "results.json").exists() and any(
            e["event"] == "config_applied" for e in results(out)["events"]), 60,
            "the overlay to be applied")
        shutil.rmtree(repo / "dense" / "1")
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    assert proc.returncode == 1, stderr[-2000:]
    data = results(out)
    assert data["status"] == "failed" and "not restored" in data["reason"]
    summary = (out / "summary.md").read_text()
    assert "WARNING: model dense was not restored" in summary
    assert "phase 'batching'" in summary and "max_queue_delay_microseconds" in summary


SLO_GATE = (ROOT / "scenarios" / "slo-gate.yaml").read_text()


def test_shipped_slo_gate_with_a_relative_path_and_two_workers(triton, tmp_path) -> None:
    """The shipped CI-gate scenario, shortened, run as typed (a relative path) with --workers 2:
    both workers join (the fingerprint holds no file paths) and every step is counted exactly."""
    text = SLO_GATE
    for old, new in (("step_duration: 10s, warmup: 2s", "step_duration: 1.5s, warmup: 0.3s"),
                     ('rate: "400:800:200"', 'rate: "100:150:50"'), ("rate: 200,", "rate: 100,"),
                     ("min_throughput: 360", "min_throughput: 80")):
        text = text.replace(old, new)
    assert text.count("step_duration: 1.5s") == 2
    write(tmp_path / "slo-gate.yaml", text)
    out = tmp_path / "r"
    proc = subprocess.run(
        [sys.executable, "-m", "loadkit", "run", "slo-gate.yaml", "--target",
         triton.grpc_address, "--out", str(out), "--workers", "2", "--quiet"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)})
    data = results(out)
    events = [e["event"] for e in data["events"]]
    assert "worker_refused" not in events and events.count("worker_joined") == 2, events
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [s for p in data["phases"] for s in p["steps"]]
    assert len(steps) == 3
    for s in steps:
        assert s["workers"]["count"] == 2 and s["accounting"]["status"] == "ok", s["accounting"]
        assert s["server"]["dense"]["success"] == s["requests"] > 0


def test_a_refused_worker_is_named_and_the_run_stops(triton, tmp_path) -> None:
    """A worker started with a different scenario (another seed: other request bytes) is refused
    with the first field that differs; with no worker left the run stops before any step,
    exit 1, one line saying why."""
    from loadkit.control.embedded import free_port

    mine = write(tmp_path / "m.yaml", SHARED)
    other = write(tmp_path / "o.yaml", SHARED.replace("shape: [256]}", "shape: [256], seed: 9}"))
    port = str(free_port())
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    master = subprocess.Popen(
        [sys.executable, "-m", "loadkit", "run", str(mine), "--target", triton.grpc_address,
         "--out", str(tmp_path / "r"), "--master", "--expect-workers", "1", "--master-port",
         port, "--quiet"], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    worker = subprocess.Popen(
        [sys.executable, "-m", "loadkit", "worker", str(other), "--master-port", port],
        cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _, stderr = master.communicate(timeout=90)
        wlog, _ = worker.communicate(timeout=30)
    finally:
        for p in (master, worker):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
    assert master.returncode == 1, stderr[-2000:]
    assert "differs from the master's at 'requests.d.bytes'" in wlog
    line = [ln for ln in stderr.splitlines() if ln.startswith("loadkit: run aborted")]
    assert line and "no Locust worker is connected" in line[0] and "requests.d.bytes" in line[0]
    data = results(tmp_path / "r")
    assert data["status"] == "aborted" and not any(p["steps"] for p in data["phases"])
