"""Faults during a run, against a real embedded Triton of the test's own: the server killed mid-
step (on_server_loss abort and wait, with a restart) and stalled with SIGSTOP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, load, results, scenario, wait_inside_step, write

from loadkit.control.embedded import EmbeddedServer, free_port


def faults(address: str, timeout: str, policy: str, wait: str, dur: str) -> str:
    """Three closed steps on dense against `address`, with these loss settings."""
    return scenario("faults", [{"name": "only", "load": load([2, 2, 2], dur, "0s")}],
                    target={"grpc": address, "timeout": timeout, "on_server_loss": policy,
                            "server_loss_wait": wait})


def _server(tmp: Path, ports: tuple[int, int, int] | None = None) -> EmbeddedServer:
    g, h, m = ports or (free_port(), free_port(), free_port())
    return EmbeddedServer(models=("dense",), grpc_port=g, http_port=h, metrics_port=m,
                          log_path=tmp / f"triton-{time.monotonic_ns()}.log").start()


def _run(scen: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "loadkit", "run", str(scen), "--out", str(out), "--quiet"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _kill(server: EmbeddedServer) -> None:
    assert server.process is not None
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(10)


@pytest.mark.parametrize("policy", ["abort", "wait"])
def test_server_killed_mid_step(tmp_path, policy) -> None:
    server = _server(tmp_path)
    ports = (server.grpc_port, server.http_port, server.metrics_port)
    scen = write(tmp_path / "s.yaml", faults(
        address=server.grpc_address, timeout="2s", policy=policy,
        wait="2s" if policy == "abort" else "60s", dur="3s"))
    out = tmp_path / "r"
    proc = _run(scen, out)
    restarted: list[EmbeddedServer] = []
    try:
        wait_inside_step(out, server.grpc_address, "dense", 1)  # step 2 is sending
        _kill(server)
        if policy == "wait":
            time.sleep(3)  # not a wait for anything: how long the server stays down
            restarted.append(_server(tmp_path, ports))
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
        for s in restarted:
            s.stop()
    data = results(out)
    steps = data["phases"][0]["steps"]
    events = {e["event"]: e for e in data["events"]}
    assert steps[0]["status"] == "ok" and steps[0]["server"]["dense"]["success"] == steps[0][
        "requests"]
    hit = steps[1]
    assert hit["status"] == "partial"
    assert hit["duration_s"] < 3.0  # the step stopped when the server went, not at its end
    assert hit["errors"] and set(hit["errors"]) <= {"UNAVAILABLE", "CANCELLED", "INTERNAL"}, hit
    assert events["server_lost"]["step"] == "only/1"
    if policy == "abort":
        assert proc.returncode == 1, stderr
        assert data["status"] == "aborted" and "server lost" in data["reason"]
        assert len(steps) == 2
        assert "server_back" not in events
    else:
        assert proc.returncode == 0, stderr
        assert data["status"] == "complete"
        assert events["server_back"]["after_s"] > 2
        assert events["model_reloaded"]["model"] == "dense"
        last = steps[2]  # on the restarted server, counted exactly again
        assert last["status"] == "ok" and last["requests"] > 0 and not last["errors"]
        assert last["server"]["dense"]["success"] == last["requests"]
    assert "Traceback" not in stderr


def test_server_stalled_with_sigstop_counts_timeouts(tmp_path) -> None:
    server = _server(tmp_path)
    scen = write(tmp_path / "s.yaml", faults(
        address=server.grpc_address, timeout="500ms", policy="abort", wait="10s", dur="4s"))
    out = tmp_path / "r"
    proc = _run(scen, out)
    try:
        wait_inside_step(out, server.grpc_address, "dense", 1)  # step 2 is sending
        assert server.process is not None
        # the server process only: stopping its python-backend stubs too makes Triton 2.51
        # abort on resume (boost::interprocess::lock_exception), which loadkit then reports as
        # a lost server
        os.kill(server.process.pid, signal.SIGSTOP)
        resume = threading.Timer(2.0, os.kill, (server.process.pid, signal.SIGCONT))
        resume.start()
        stdout, stderr = proc.communicate(timeout=120)
        resume.join()
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    assert proc.returncode == 0, stderr
    data = results(out)
    assert data["status"] == "complete"  # a stall is not a lost server
    stalled = data["phases"][0]["steps"][1]
    # both users' requests in flight at the stall ran into the 500 ms deadline
    assert stalled["errors"].get("DEADLINE_EXCEEDED", 0) >= 2, stalled["errors"]
    # the rest stays honest: nothing that succeeded took longer than the deadline
    assert stalled["latency_us"]["max"] <= 600_000
    # and what the server finished for requests the client gave up on is the difference
    assert stalled["server"]["dense"]["success"] >= stalled["requests"]
    after = data["phases"][0]["steps"][2]
    assert after["status"] == "ok" and not after["errors"]
    assert after["server"]["dense"]["success"] == after["requests"]
