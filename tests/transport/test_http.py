"""The HTTP/REST door (transport/http_door.py, control/http_client.py) against the embedded
Triton's HTTP port: closed and open loops, BYTES, data sets with validation, sequences, JSON
tensors, config swaps with the gRPC port closed; every request accounted for."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import dense_b1, load, loadkit, results, scenario, write

from loadkit.control.embedded import EmbeddedServer

pytestmark = pytest.mark.xdist_group("http")


def _steps(out: Path) -> list[dict]:
    return [s for p in results(out)["phases"] for s in p["steps"]]


def _per_model(step: dict, models: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, c in step["client"].items():
        out[models[name]] = out.get(models[name], 0) + c["requests"]
    return out


def _add_sub_data(path: Path, wrong_every: int = 0) -> Path:
    """add_sub entries with perf_analyzer's validation_data (every `wrong_every`-th expects a
    wrong sum)."""
    rng = np.random.default_rng(4)
    data, expected = [], []
    for k in range(20):
        a = rng.integers(-5, 5, 4).astype(float).tolist()
        b = rng.integers(-5, 5, 4).astype(float).tolist()
        total = [x + y for x, y in zip(a, b, strict=True)]
        if wrong_every and k % wrong_every == 0:
            total[2] += 1.0
        data.append({"INPUT0": a, "INPUT1": b})
        expected.append({"OUTPUT0": total, "OUTPUT1": [x - y for x, y in zip(a, b, strict=True)]})
    path.write_text(json.dumps({"data": data, "validation_data": expected}))
    return path


MODELS = {"dense_b1": "dense", "text": "text_classifier", "add_sub": "add_sub",
          "acc": "accumulate"}


@pytest.fixture(scope="module")
def http_run(triton: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run over HTTP: four templates (FP32, BYTES, a validated data set with 4 wrong
    answers in 20, sequences) in a closed and an open loop."""
    tmp = tmp_path_factory.mktemp("http")
    data = _add_sub_data(tmp / "v.json", wrong_every=5)
    requests = {
        "dense_b1": dense_b1(),
        "text": {"model": "text_classifier", "inputs": {"TEXT": {
            "dtype": "BYTES", "shape": [1], "data": "random", "length": [8, 64]}},
            "outputs": ["LABEL"]},
        "add_sub": {"model": "add_sub", "dataset": str(data), "validate": True, "inputs": {
            "INPUT0": {"dtype": "FP32", "shape": [4], "data": "dataset"},
            "INPUT1": {"dtype": "FP32", "shape": [4], "data": "dataset"}}},
        "acc": {"model": "accumulate", "sequence": {"length": 5, "ids": [1, 100000]},
                "inputs": {"INPUT0": {"dtype": "INT32", "shape": [1]}}},
    }
    yaml = scenario("http", [{"name": "closed", "load": load(4, "2s")},
                             {"name": "open", "load": load("150/s", "2s", max_concurrency=64)}],
                    requests, mix={"dense_b1": 40, "text": 20, "add_sub": 20, "acc": 20})
    out = tmp / "r"
    proc = loadkit("run", str(write(tmp / "s.yaml", yaml)), "--target",
                   f"http://{triton.http_address}", "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_every_request_over_http_is_accounted_for(http_run: Path) -> None:
    data = results(http_run)
    assert data["status"] == "complete" and data["target"].startswith("http://"), data["target"]
    steps = _steps(http_run)
    assert len(steps) == 2
    for step in steps:
        assert step["accounting"]["status"] == "ok", step["accounting"]
        client = _per_model(step, MODELS)
        mismatches = step["errors"].pop("MISMATCH", 0)
        assert not step["errors"], step["error_messages"]
        for model, n in client.items():
            extra = mismatches if model == "add_sub" else 0
            assert step["server"][model]["success"] == n + extra > 0, (model, step["server"])
        # sequences: START/END rode on the JSON parameters (a missing START is refused)
        assert step["client"]["acc"]["sequences"] > 0
    open_loop = steps[1]["open_loop"]
    assert open_loop["scheduled"] == open_loop["sent"] + open_loop["dropped"]
    assert open_loop["sent"] > 200


def test_validation_reads_binary_outputs_over_http(http_run: Path) -> None:
    """4 of every 20 add_sub entries expect a wrong sum: MISMATCH, named by element."""
    step = _steps(http_run)[0]
    mismatches = step["errors"]["MISMATCH"]
    total = step["client"]["add_sub"]["requests"] + mismatches
    assert abs(mismatches / total - 0.2) < 0.05, (mismatches, total)
    messages = [m["message"] for m in step["error_messages"]["MISMATCH"]]
    assert any("output 'OUTPUT0' element 2: expected" in m for m in messages), messages


def test_json_tensors_round_trip(triton: EmbeddedServer, tmp_path: Path) -> None:
    """http: {binary: false}: inputs and outputs as JSON; right answers validate, BYTES too."""
    data = _add_sub_data(tmp_path / "v.json")
    requests = {
        "add_sub": {"model": "add_sub", "dataset": str(data), "validate": True, "inputs": {
            "INPUT0": {"dtype": "FP32", "shape": [4], "data": "dataset"},
            "INPUT1": {"dtype": "FP32", "shape": [4], "data": "dataset"}}},
        "text": {"model": "text_classifier", "inputs": {"TEXT": {
            "dtype": "BYTES", "shape": [1], "data": "random", "length": [8, 64]}}},
    }
    yaml = scenario("json", [{"name": "p", "load": load(2, "1.5s")}], requests,
                    target={"url": f"http://{triton.http_address}", "http": {"binary": False}},
                    mix={"add_sub": 50, "text": 50})
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "s.yaml", yaml)), "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (step,) = _steps(out)
    assert not step["errors"], step["error_messages"]
    assert step["accounting"]["status"] == "ok", step["accounting"]
    assert step["client"]["add_sub"]["requests"] > 0 and step["client"]["text"]["requests"] > 0


def test_a_decoupled_model_over_http_is_refused_before_sending(triton, tmp_path) -> None:
    yaml = scenario("dec", [{"name": "p", "load": load(1, "1s")}], {
        "gen": {"model": "repeat", "inputs": {
            "IN": {"dtype": "INT32", "shape": [5], "data": "ones"},
            "DELAY_MS": {"dtype": "INT32", "shape": [1], "data": "constant", "value": 2}}}})
    proc = loadkit("run", str(write(tmp_path / "s.yaml", yaml)), "--target",
                   f"http://{triton.http_address}", "--out", str(tmp_path / "r"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "model repeat is decoupled" in proc.stderr and "generate_stream" in proc.stderr, (
        proc.stderr)
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def http_only(tmp_path_factory: pytest.TempPathFactory) -> EmbeddedServer:
    """A Triton whose gRPC port is closed (--allow-grpc=false)."""
    base = tmp_path_factory.mktemp("http_only")
    server = EmbeddedServer(models=("dense",), log_path=base / "tritonserver.log",
                            extra_args=("--allow-grpc=false",))
    server.start()
    yield server
    server.stop()


def test_a_target_with_grpc_closed_runs_with_config_swaps(http_only, tmp_path) -> None:
    """validate and run (two phases, the second swapping dense's config) over HTTP alone:
    metadata, config, statistics and load/unload all went through the HTTP control plane."""
    from loadkit.control.client import ServerControl

    with ServerControl(http_only.grpc_address) as grpc:
        assert not grpc.is_live(1.0)  # nothing answers gRPC there
    url = f"http://{http_only.http_address}"
    yaml = scenario("swap", [
        {"name": "plain", "load": load(2, "1.5s")},
        {"name": "batched", "load": load(4, "1.5s"),
         "config": {"dense": {"dynamic_batching": {"max_queue_delay_microseconds": 200}}}}])
    path = write(tmp_path / "s.yaml", yaml)
    proc = loadkit("validate", str(path), "--target", url)
    assert proc.returncode == 0 and "checked against the models on http://" in proc.stdout, (
        proc.stdout + proc.stderr)
    out = tmp_path / "r"
    proc = loadkit("run", str(path), "--target", url, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = results(out)
    plain, batched = data["phases"]
    assert "dynamic_batching" in json.dumps(batched["config"]["dense"])
    assert "dynamic_batching" not in json.dumps(plain["config"]["dense"])
    for phase in (plain, batched):
        for step in phase["steps"]:
            assert step["accounting"]["status"] == "ok", step["accounting"]
            assert step["server"]["dense"]["success"] == step["requests"] > 0



def test_perf_analyzer_flag_i_http_picks_the_door(triton, tmp_path: Path) -> None:
    """-i http with -m (perf_analyzer's way) and beside a scenario file: both run over HTTP;
    a scenario whose target.transport is gRPC's is refused by name, never dropped."""
    out = tmp_path / "m"
    proc = loadkit("run", "-m", "dense", "-i", "http", "--target", triton.http_address,
                   "--concurrency-range", "2", "-p", "1000", "--warmup", "0.2s",
                   "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = results(out)
    assert data["target"] == f"http://{triton.http_address}"
    (step,) = data["phases"][0]["steps"]
    assert step["accounting"]["status"] == "ok" and step["requests"] > 0
    path = write(tmp_path / "s.yaml", scenario("f", [{"name": "p", "load": load(1, "1s")}]))
    out = tmp_path / "f"
    proc = loadkit("run", str(path), "-i", "http", "--target", triton.http_address,
                   "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results(out)["target"] == f"http://{triton.http_address}"
    assert "protocol: http" in (out / "scenario.yaml").read_text()
    unary = write(tmp_path / "u.yaml", scenario("u", [{"name": "p", "load": load(1, "1s")}],
                                                target={"transport": "unary"}))
    proc = loadkit("run", str(unary), "-i", "http", "--out", str(tmp_path / "u"))
    assert proc.returncode == 2 and "target.transport (unary)" in proc.stderr, proc.stderr


def test_workers_send_over_http_with_exact_accounting(triton, tmp_path: Path) -> None:
    """--workers 2 over HTTP: each worker's engine opens its own HTTP connections; the merged
    step equals the server's count per model (a sequence template included)."""
    requests = {"dense_b1": dense_b1(),
                "acc": {"model": "accumulate", "sequence": {"length": 4, "ids": [1, 1000]},
                        "inputs": {"INPUT0": {"dtype": "INT32", "shape": [1]}}}}
    yaml = scenario("w", [{"name": "c", "load": load(4, "2s")}], requests,
                    mix={"dense_b1": 70, "acc": 30})
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "s.yaml", yaml)), "--target",
                   f"http://{triton.http_address}", "--workers", "2", "--out", str(out),
                   "--quiet", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (step,) = _steps(out)
    assert step["accounting"]["status"] == "ok", step["accounting"]
    assert not step["errors"], step["error_messages"]
    for name, model in (("dense_b1", "dense"), ("acc", "accumulate")):
        assert step["server"][model]["success"] == step["client"][name]["requests"] > 0


def test_json_tensors_refuse_bytes_that_are_not_text(triton, tmp_path: Path) -> None:
    """A BYTES data set entry that is not UTF-8 cannot travel as a JSON string: exit 2, the
    template and input named, the binary extension offered, nothing sent."""
    import base64

    data = tmp_path / "b.json"
    data.write_text(json.dumps({"data": [{"TEXT": {"b64": base64.b64encode(
        b"\xff\xfe raw").decode()}}]}))
    requests = {"t": {"model": "text_classifier", "dataset": str(data),
                      "inputs": {"TEXT": {"dtype": "BYTES", "shape": [1], "data": "dataset"}}}}
    yaml = scenario("b", [{"name": "p", "load": load(1, "1s")}], requests,
                    target={"url": f"http://{triton.http_address}", "http": {"binary": False}})
    proc = loadkit("run", str(write(tmp_path / "s.yaml", yaml)), "--out", str(tmp_path / "r"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "request template 't' input 'TEXT': a BYTES element is not UTF-8" in proc.stderr
    assert "binary: true" in proc.stderr and "Traceback" not in proc.stderr


def test_trace_settings_over_http(triton) -> None:
    """`loadkit trace`'s calls over the HTTP control plane: read a model's settings, set a
    capture, see it, put the old ones back."""
    from loadkit.control.http_client import connect
    from loadkit.control.trace import capture_settings, read_settings, restore, write_settings

    with connect(f"http://{triton.http_address}") as control:
        before = read_settings(control, "dense")
        assert "trace_level" in before and "trace_file" in before, before
        got = write_settings(control, capture_settings(7, 50), "dense")
        assert got["trace_rate"] == ["7"] and got["trace_level"] == ["TIMESTAMPS"], got
        restore(control, before, "dense")
        after = read_settings(control, "dense")
        assert {k: after[k] for k in ("trace_rate", "trace_level")} == {
            k: before[k] for k in ("trace_rate", "trace_level")}, (before, after)
