"""System shared memory (`shared_memory: system`, control/shared_memory.py) against the
embedded Triton over both doors: inputs written into registered regions once, outputs read
back from them (validation), every request accounted for, and nothing left behind, not even
after a worker is killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    ROOT,
    dense_b1,
    load,
    loadkit,
    processes,
    results,
    scenario,
    wait_for,
    write,
)

from loadkit.control.client import ServerControl
from loadkit.transport.shm import SHM_DIR

pytestmark = pytest.mark.xdist_group("shm")


def _leftovers(control: ServerControl, pids: set[int]) -> tuple[list[str], list[str]]:
    """Regions of these processes still registered on the server, and still in /dev/shm."""
    names = tuple(f"loadkit-{p}-" for p in pids)
    return ([n for n in control.system_shm_regions() if n.startswith(names)],
            [p.name for p in SHM_DIR.iterdir() if p.name.startswith(names)])


def _add_sub(path: Path) -> Path:
    rng = np.random.default_rng(5)
    data, expected = [], []
    for k in range(20):
        a, b = rng.integers(-5, 5, 4).astype(float), rng.integers(-5, 5, 4).astype(float)
        total = a + b
        if k % 5 == 0:
            total[1] += 1.0  # 4 of 20 expect a wrong sum
        data.append({"INPUT0": a.tolist(), "INPUT1": b.tolist()})
        expected.append({"OUTPUT0": total.tolist(), "OUTPUT1": (a - b).tolist()})
    path.write_text(json.dumps({"data": data, "validation_data": expected}))
    return path


@pytest.mark.parametrize("door", ["grpc", "http"])
def test_tensors_go_through_registered_regions(triton, control, tmp_path, door) -> None:
    """add_sub with validation and dense beside it: the outputs validation reads are the
    ones the server wrote into the regions (4 in 20 expected wrong: MISMATCH, the rest
    right); client == server; afterwards no region of the run on the server or in /dev/shm."""
    data = _add_sub(tmp_path / "v.json")
    requests = {"dense_b1": dense_b1(),
                "add_sub": {"model": "add_sub", "dataset": str(data), "validate": True,
                            "inputs": {"INPUT0": {"dtype": "FP32", "shape": [4],
                                                  "data": "dataset"},
                                       "INPUT1": {"dtype": "FP32", "shape": [4],
                                                  "data": "dataset"}}}}
    yaml = scenario("shm", [{"name": "c", "load": load(3, "1.5s")},
                            {"name": "o", "load": load("200/s", "1.5s")}], requests,
                    target={"shared_memory": "system"}, mix={"dense_b1": 50, "add_sub": 50})
    address = triton.grpc_address if door == "grpc" else f"http://{triton.http_address}"
    out = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "loadkit", "run",
                             str(write(tmp_path / "s.yaml", yaml)), "--target", address,
                             "--out", str(out), "--quiet"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # while it runs, its regions are registered (and named by its pid)
    # per template: its inputs' region and its outputs'
    wait_for(lambda: len([n for n in control.system_shm_regions()
                          if n.startswith(f"loadkit-{proc.pid}-")]) == 4, 60,
             "4 regions registered")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    assert "tensors through system shared memory" in (out / "summary.md").read_text()
    for phase in results(out)["phases"]:
        (step,) = phase["steps"]
        assert step["accounting"]["status"] == "ok", step["accounting"]
        mismatches = step["errors"].get("MISMATCH", 0)
        total = step["client"]["add_sub"]["requests"] + mismatches
        assert abs(mismatches / total - 0.2) < 0.06, (mismatches, total)
        assert step["server"]["add_sub"]["success"] == total
        assert step["server"]["dense"]["success"] == step["client"]["dense_b1"]["requests"] > 0
        messages = [m["message"] for m in step["error_messages"]["MISMATCH"]]
        assert all("output 'OUTPUT0' element 1: expected" in m for m in messages), messages
    assert _leftovers(control, {proc.pid}) == ([], [])


@pytest.mark.fast
def test_a_request_in_shared_memory_carries_no_tensor() -> None:
    """The encoders name the region, offset and size instead of the bytes (both doors)."""
    from tritonclient.grpc import service_pb2

    from loadkit.scenario import InputSpec, RequestTemplate
    from loadkit.transport.grpc_door import GrpcEncoder
    from loadkit.transport.http_door import HttpEncoder

    spec = InputSpec(name="INPUT0", dtype="FP32", shape=(256,))
    t = RequestTemplate(name="d", model="dense", batch_size=1, inputs=(spec,))
    tensors = [(spec, np.ones((1, 256), np.float32))]
    refs_in, refs_out = {"INPUT0": ("loadkit-1-0", 64, 1024)}, {"OUTPUT0": ("loadkit-1-1", 0, 1024)}
    req = service_pb2.ModelInferRequest.FromString(
        GrpcEncoder().encode(t, tensors, refs_in, refs_out)[5:])
    assert not req.raw_input_contents
    params = req.inputs[0].parameters
    assert (params["shared_memory_region"].string_param, params["shared_memory_offset"]
            .int64_param, params["shared_memory_byte_size"].int64_param) == ("loadkit-1-0", 64,
                                                                             1024)
    assert req.outputs[0].parameters["shared_memory_region"].string_param == "loadkit-1-1"
    wire = HttpEncoder(None, "h:1").encode(t, tensors, refs_in, refs_out)
    body = json.loads(wire.split(b"\r\n\r\n", 1)[1])
    assert body["inputs"][0]["parameters"] == {"shared_memory_region": "loadkit-1-0",
                                               "shared_memory_offset": 64,
                                               "shared_memory_byte_size": 1024}
    assert body["outputs"][0]["parameters"]["shared_memory_region"] == "loadkit-1-1"


def test_a_killed_worker_leaves_no_region(triton, control, tmp_path) -> None:
    """--workers 2 with shared memory; one worker killed with SIGKILL mid-step: when the run
    ends, none of its regions is registered on the server or left in /dev/shm."""
    yaml = scenario("kill", [{"name": "c", "load": load("[4, 4]", "4s")}],
                    target={"shared_memory": "system"})
    out = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "loadkit", "run",
                             str(write(tmp_path / "s.yaml", yaml)), "--target",
                             triton.grpc_address, "--workers", "2", "--out", str(out),
                             "--quiet"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        workers = wait_for(lambda: (lambda w: w if len(w) == 2 else None)(
            processes("loadkit worker", under=proc.pid)), 60, "two workers")
        wait_for(lambda: {n.split("-")[1] for n in control.system_shm_regions()
                          if n.startswith("loadkit-")} >= {str(p) for p in workers}, 60,
                 "both workers' regions registered")
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, 1), stderr[-2000:]  # a lost worker's step fails the run
    assert _leftovers(control, {*workers, proc.pid}) == ([], []), stderr[-2000:]


@pytest.mark.parametrize(("target", "flags", "message"), [
    ("192.0.2.1:8001", (), "needs Triton on this host"),
    (None, ("--output-shared-memory-size", "100"), "give at least 1024"),
    (None, ("--shared-memory", "cuda"), "does not create CUDA regions yet"),
])
def test_shared_memory_refusals(triton, tmp_path, target, flags, message) -> None:
    """Exit 2, one message naming the fix, nothing sent."""
    yaml = scenario("bad", [{"name": "c", "load": load(1, "1s")}],
                    target={"shared_memory": "system"})
    proc = loadkit("run", str(write(tmp_path / "s.yaml", yaml)), "--target",
                   target or triton.grpc_address, *flags, "--out", str(tmp_path / "r"),
                   timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_ctrl_c_leaves_no_region(triton, control, tmp_path) -> None:
    """SIGINT mid-step: the run stops (exit 130) and its regions are gone."""
    yaml = scenario("int", [{"name": "c", "load": load(2, "30s")}],
                    target={"shared_memory": "system"})
    proc = subprocess.Popen([sys.executable, "-m", "loadkit", "run",
                             str(write(tmp_path / "s.yaml", yaml)), "--target",
                             triton.grpc_address, "--out", str(tmp_path / "r"), "--quiet"],
                            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: [n for n in control.system_shm_regions()
                          if n.startswith(f"loadkit-{proc.pid}-")], 60, "regions registered")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    assert _leftovers(control, {proc.pid}) == ([], [])
