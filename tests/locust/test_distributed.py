"""Distributed runs: a Locust master and local workers against the real embedded Triton."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import (
    CNN_B4,
    ROOT,
    assert_accounted,
    dense_b1,
    load,
    results,
    scenario,
    wait_inside_step,
    write,
)


def dist(conc: str, dur: str, rate: int) -> str:
    """dense and cnn 80:20, a closed phase then an open one."""
    return scenario("dist", [{"name": "closed", "load": load(conc, dur, "0s")},
                             {"name": "open", "load": load(f"{rate}/s", dur)}],
                    {"dense_b1": dense_b1(), "cnn_b4": CNN_B4},
                    mix={"dense_b1": 80, "cnn_b4": 20})


def _start(scen: Path, out: Path, target: str, workers: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "loadkit", "run", str(scen), "--target", target,
         "--out", str(out), "--workers", str(workers), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _workers_of(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", "loadkit worker"],
                         capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_two_workers_merged_counts_equal_server_delta(triton, tmp_path) -> None:
    scen = write(tmp_path / "d.yaml", dist(conc="[2, 4]", dur="3s", rate=300))
    out = tmp_path / "r"
    proc = _start(scen, out, triton.grpc_address, 2)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    data = results(out)
    assert data["status"] == "complete"
    assert [e["event"] for e in data["events"]].count("worker_joined") == 2
    steps = [s for p in data["phases"] for s in p["steps"]]
    assert len(steps) == 3
    for step in steps:
        assert step["status"] == "ok"
        w = step["workers"]
        assert w["count"] == 2 and len(w["replied"]) == 2 and not w["lost"]
        # the master's merged histograms hold exactly the workers' samples, which the server saw
        assert sum(w["requests"].values()) == step["requests"] > 0
        assert_accounted(step)
    closed = data["phases"][0]["steps"]
    assert [sum(s["workers"]["users"].values()) for s in closed] == [2, 4]
    ol = data["phases"][1]["steps"][0]["open_loop"]
    # each worker ran half the schedule; together they sent the target rate
    assert ol["dropped"] == 0 and ol["scheduled"] == ol["sent"]
    assert abs(ol["sent"] / 3.0 - 300) / 300 < 0.02, ol
    assert (out / "workers" / "worker-0.log").exists()


def test_worker_killed_mid_step_is_reported_and_the_run_goes_on(triton, tmp_path) -> None:
    scen = write(tmp_path / "k.yaml", dist(conc="[4, 4, 4]", dur="4s", rate=100))
    out = tmp_path / "r"
    proc = _start(scen, out, triton.grpc_address, 2)
    try:
        wait_inside_step(out, triton.grpc_address, "dense", 1)  # step 2 is sending
        victims = _workers_of(proc.pid)
        assert len(victims) == 2, victims
        os.kill(victims[0], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the run goes on to the end, but a step missing a worker's samples is known to be wrong
    assert proc.returncode == 1, stderr
    data = results(out)
    assert data["status"] == "failed" and "step closed/1: accounting mismatch" in data["reason"]
    assert len(data["phases"][1]["steps"]) == 1  # walked to the end
    lost = [e for e in data["events"] if e["event"] == "worker_lost"]
    assert len(lost) == 1 and lost[0]["users"] == 2 and lost[0]["step"] == "closed/1", lost
    closed = data["phases"][0]["steps"]
    assert closed[0]["status"] == "ok" and not closed[0]["workers"]["lost"]
    assert_accounted(closed[0])
    hit = closed[1]
    assert hit["status"] == "partial" and len(hit["workers"]["lost"]) == 1
    # what the lost worker had sent is missing on the client side, and the report says so
    assert hit["server"]["dense"]["success"] >= hit["client"]["dense_b1"]["requests"]
    assert hit["accounting"]["status"] == "mismatch"
    after = closed[2]
    # the survivor took over all 4 users (Locust re-spreads them) and counts stay exact
    assert after["status"] == "ok" and after["workers"]["count"] == 1
    assert sum(after["workers"]["users"].values()) == 4
    assert_accounted(after)
    open_step = data["phases"][1]["steps"][0]
    assert open_step["status"] == "ok" and open_step["open_loop"]["sent"] > 0
    assert_accounted(open_step)
    assert "worker" in (out / "summary.md").read_text().lower()


def test_plain_locust_master_and_workers(triton, tmp_path) -> None:
    """The documented multi-machine commands, on one host: `locust --master` + 2 `--worker`."""
    from loadkit.control.embedded import free_port

    scen = write(tmp_path / "p.yaml", dist(conc="[2, 4]", dur="2s", rate=200))
    out, port = tmp_path / "r", str(free_port())
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    base = [sys.executable, "-m", "locust", "-f", "locustfile.py", "--scenario", str(scen)]
    workers = [
        subprocess.Popen([*base, "--worker", "--master-port", port], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        master = subprocess.run(
            [*base, "--headless", "--master", "--expect-workers", "2", "--master-bind-host",
             "127.0.0.1", "--master-bind-port", port, "--triton-target", triton.grpc_address,
             "--triton-metrics", triton.metrics_url, "--loadkit-out", str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=150,
        )
        assert master.returncode == 0, master.stderr[-3000:]
        for w in workers:  # the master's quit ends them
            assert w.wait(30) == 0, w.stderr.read()[-2000:]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    data = results(out)
    assert data["status"] == "complete"
    for step in (s for p in data["phases"] for s in p["steps"]):
        assert step["status"] == "ok" and step["workers"]["count"] == 2
        assert_accounted(step)


SEQUENCES = """
name: dist-seq
requests:
  acc:
    model: accumulate
    sequence: {length: 6, ids: [1, 40]}
    inputs: {INPUT0: {dtype: INT32, shape: [1], data: ones}}
phases:
  - name: closed
    load: {concurrency: 4, step_duration: 2s, warmup: 0s}
  - name: open
    load: {rate: 30, step_duration: 2s, warmup: 0.3s, max_concurrency: 20}
"""


def test_workers_run_sequences_on_their_own_correlation_ids(triton, tmp_path) -> None:
    """Three workers, ids [1, 40], 20 sequences in flight at most per worker: the third to join
    is refused and says why (results.json, summary.md); the two that fit open sequences only on
    their own run of ids, closed and open loop, every request and sequence accounted for."""
    scen = write(tmp_path / "s.yaml", SEQUENCES)
    out = tmp_path / "r"
    proc = _start(scen, out, triton.grpc_address, 3)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    data = results(out)
    why = "has room for 2 workers of 20 sequences each; this is worker 3"
    refused = [e for e in data["events"] if e["event"] == "worker_refused"]
    assert len(refused) == 1 and why in refused[0]["detail"], data["events"]
    assert why in (out / "summary.md").read_text()
    steps = [s for p in data["phases"] for s in p["steps"]]
    assert len(steps) == 2
    for step in steps:
        assert step["status"] == "ok" and not step["errors"], step["error_messages"]
        assert step["workers"]["count"] == 2
        c = step["client"]["acc"]
        assert step["accounting"]["status"] == "ok"
        assert step["server"]["accumulate"]["success"] == c["requests"] > 0
        assert c["requests"] / 8 <= c["sequences"] <= c["requests"] / 5, c
