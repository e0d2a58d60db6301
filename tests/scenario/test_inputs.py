"""Real inputs: data sets (perf_analyzer's JSON, JSON Lines, .npz), BYTES, pools of distinct
requests, mixed shapes, request parameters and a mix per phase, on the real embedded Triton
with the shipped models; plus the serialization itself, checked against tritonclient's."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, loadkit, results, write
from tritonclient.grpc import service_pb2
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from loadkit.plan import build_plan
from loadkit.scenario import load_scenario
from loadkit.transport.grpc_door import GrpcEncoder
from loadkit.transport.payloads import prepare_pool, tensor_bytes


def _steps(out: Path) -> list[dict]:
    return [s for p in results(out)["phases"] for s in p["steps"]]


def _run_shipped(name: str, triton, tmp_path: Path, shorten: tuple[str, str],
                 *paths: str) -> Path:
    """Run scenarios/<name>.yaml against the session Triton with shorter steps (`shorten`:
    the load line's text and its replacement; `paths`: data files made absolute); exit 0."""
    scen = (ROOT / "scenarios" / f"{name}.yaml").read_text().replace(*shorten)
    for rel in paths:
        scen = scen.replace(rel, str(ROOT / "scenarios" / rel))
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / f"{name}.yaml", scen)), "--target",
                   triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def _assert_exact(step: dict, model: str) -> None:
    """Every request accounted for: the run's own check, and client == server here too."""
    assert step["accounting"]["status"] == "ok", step["accounting"]
    client = sum(c["requests"] for c in step["client"].values())
    assert step["server"][model]["success"] == client > 0, (step["server"], client)
    assert not step["errors"], step["error_messages"]


# ---- serialization (no server) ---------------------------------------------------------------
@pytest.mark.fast
def test_bytes_tensors_are_serialized_as_tritonclient_does() -> None:
    arr = np.array([[b"hello"], [b""], ["na\u00efve".encode()]], dtype=object)
    assert tensor_bytes(arr, "BYTES") == serialize_byte_tensor(arr).item()
    assert list(deserialize_bytes_tensor(tensor_bytes(arr, "BYTES"))) == list(arr.ravel())


@pytest.mark.fast
def test_perf_analyzer_json_becomes_one_request_per_entry(tmp_path: Path) -> None:
    """content / shape / b64 forms, flat content reshaped to the input's shape, nested lists
    (perf_analyzer's sequences) taken in order; parameters go into every request."""
    b = np.arange(4, dtype=np.float32) + 10
    data = {"data": [
        {"INPUT0": [1, 2, 3, 4], "INPUT1": {"content": [5, 6, 7, 8], "shape": [4]}},
        [{"INPUT0": {"content": [[0, 0], [0, 1]], "shape": [4]},
          "INPUT1": {"b64": base64.b64encode(b.tobytes()).decode()}}],
    ]}
    (tmp_path / "d.json").write_text(json.dumps(data))
    scen = load_scenario(write(tmp_path / "s.yaml", """
requests:
  a:
    model: add_sub
    dataset: d.json
    parameters: {priority: 2, tag: x}
    inputs:
      INPUT0: {dtype: FP32, shape: [4], data: dataset}
      INPUT1: {dtype: FP32, shape: [4], data: dataset}
phases: [{name: p, load: {concurrency: 1, step_duration: 1s}}]
"""))
    import dataclasses
    t = dataclasses.replace(scen.requests["a"], batched=False)
    pool = [service_pb2.ModelInferRequest.FromString(p[5:])
            for p in prepare_pool(t, GrpcEncoder())]
    assert len(pool) == 2
    got = [[np.frombuffer(c, np.float32).tolist() for c in r.raw_input_contents] for r in pool]
    assert got == [[[1, 2, 3, 4], [5, 6, 7, 8]], [[0, 0, 0, 1], b.tolist()]]
    assert [list(i.shape) for i in pool[1].inputs] == [[4], [4]]  # no batch dimension
    assert pool[0].parameters["priority"].int64_param == 2
    assert pool[0].parameters["tag"].string_param == "x"


@pytest.mark.fast
def test_mixed_shapes_hold_their_weights_in_the_pool(tmp_path: Path) -> None:
    scen = load_scenario(write(tmp_path / "s.yaml", """
requests:
  a:
    model: dense
    pool: 100
    inputs:
      INPUT0:
        dtype: FP32
        shapes: [{shape: [16], weight: 50}, {shape: [64], weight: 30}, {shape: [256], weight: 20}]
phases: [{name: p, load: {concurrency: 1, step_duration: 1s}}]
"""))
    pool = [service_pb2.ModelInferRequest.FromString(p[5:])
            for p in prepare_pool(scen.requests["a"], GrpcEncoder())]
    dims = [int(r.inputs[0].shape[1]) for r in pool]
    assert {d: dims.count(d) for d in set(dims)} == {16: 50, 64: 30, 256: 20}
    assert dims[:10].count(16) in (4, 5, 6)  # interleaved, not 50 x 16 first
    assert len({r.raw_input_contents[0] for r in pool}) == 100  # every request distinct
    # the plan says what the pool sends, not only the weights: 7 at 1:1:1 are 3, 2, 2
    seven = load_scenario(write(tmp_path / "s7.yaml", """
requests:
  a:
    model: dense
    pool: 7
    inputs:
      INPUT0:
        dtype: FP32
        shapes: [{shape: [3], weight: 1}, {shape: [5], weight: 1}, {shape: [7], weight: 1}]
phases: [{name: p, load: {concurrency: 1, step_duration: 1s}}]
"""))
    said = build_plan(seven).describe()
    assert "[3] x1, [5] x1, [7] x1 (the pool of 7: [3] 3, [5] 2, [7] 2)" in said, said


# ---- against the real Triton -----------------------------------------------------------------
def test_text_model_with_prompts_and_random_strings(triton, tmp_path: Path) -> None:
    """BYTES in and out, prompts from JSON Lines in random order, a seeded pool of strings:
    every request succeeds, client == server, and the report says how many distinct requests
    each step sent."""
    out = _run_shipped("text-classifier", triton, tmp_path, (
        "step_duration: 8s, warmup: 2s", "step_duration: 2s, warmup: 0.5s"), "data/prompts.jsonl")
    for step in _steps(out):
        _assert_exact(step, "text_classifier")
        prompts, synthetic = step["client"]["prompts"], step["client"]["synthetic"]
        assert 1 < prompts["distinct_payloads"] <= min(200, prompts["requests"])
        assert synthetic["distinct_payloads"] == min(100, synthetic["requests"])
    assert "Distinct requests sent per step: prompts" in (out / "summary.md").read_text()


def test_perf_analyzer_input_data_file_on_a_model_without_batching(triton, tmp_path) -> None:
    out = _run_shipped("dataset-json", triton, tmp_path, (
        "step_duration: 5s, warmup: 1s", "step_duration: 1.5s, warmup: 0.2s"), "data/add_sub.json")
    for step in _steps(out):
        _assert_exact(step, "add_sub")
        c = step["client"]["add_sub"]
        assert c["distinct_payloads"] == min(50, c["requests"])


def test_one_payload_measures_the_response_cache_a_pool_measures_the_model(
        triton, control, tmp_path) -> None:
    """The fixed-payload trap, from Triton's own counters: with the cache on, one repeated
    payload is served from it; a pool of distinct requests never hits it. Each phase sends
    only its own template (a mix per phase); the cache is off again after the run."""
    out = _run_shipped("response-cache", triton, tmp_path, (
        "step_duration: 6s, warmup: 1s", "step_duration: 2s, warmup: 0.2s"))
    phases = {p["name"]: p["steps"][0] for p in results(out)["phases"]}
    for step in phases.values():
        _assert_exact(step, "text_classifier")
    assert set(phases["no-cache-one-payload"]["client"]) == {"same"}
    assert "cache_hits" not in phases["no-cache-one-payload"]["server"]["text_classifier"]
    one = phases["cache-one-payload"]
    assert one["server"]["text_classifier"]["cache_hits"] >= one["requests"] - 2
    pool = phases["cache-distinct-payloads"]
    assert set(pool["client"]) == {"distinct"}
    assert pool["client"]["distinct"]["distinct_payloads"] == pool["requests"] < 10_000
    assert pool["server"]["text_classifier"]["cache_hits"] == 0
    assert "response_cache" not in control.config("text_classifier")  # restored
    assert "cache 0 hits" in (out / "summary.md").read_text()


@pytest.mark.fast
def test_sequence_flags_ride_on_the_prepared_request() -> None:
    """The prepared request with the id and flags appended decodes as one request carrying
    sequence_id, sequence_start and sequence_end, its inputs untouched."""
    from loadkit.loads.sequence import Ids
    from loadkit.scenario import SequenceSpec
    from loadkit.transport.grpc_door import END, START

    sequence_id = GrpcEncoder().sequence_id

    base = service_pb2.ModelInferRequest(model_name="accumulate")
    base.raw_input_contents.append(b"\x01\x00\x00\x00")
    spec = SequenceSpec(length=4, ids=(7, 8))
    ids = Ids(spec)
    first, second = ids.take(), ids.take()
    assert (first, second) == (7, 8)
    ids.give_back(first)
    assert ids.take() == 7  # the only free one
    req = service_pb2.ModelInferRequest.FromString(
        base.SerializeToString() + sequence_id(spec.id_type, 7) + START + END)
    assert req.parameters["sequence_id"].int64_param == 7
    assert req.parameters["sequence_start"].bool_param
    assert req.parameters["sequence_end"].bool_param
    assert req.raw_input_contents[0] == b"\x01\x00\x00\x00"
    text = sequence_id("string", 12)
    assert service_pb2.ModelInferRequest.FromString(text).parameters[
        "sequence_id"].string_param == "12"


@pytest.mark.fast
def test_workers_get_disjoint_runs_of_correlation_ids(tmp_path: Path) -> None:
    from loadkit.loads.sequence import most_open, slice_ids

    scen = load_scenario(write(tmp_path / "s.yaml", """
requests:
  a: {model: accumulate, sequence: {length: 4, ids: [101, 160]},
      inputs: {INPUT0: {dtype: INT32, shape: [1]}}}
phases:
  - {name: c, load: {concurrency: [2, 8], step_duration: 1s}}
  - {name: o, load: {rate: 5, step_duration: 1s, max_concurrency: 20}}
"""))
    assert most_open(scen) == 20
    slices = [slice_ids(scen, k, 20) for k in range(3)]
    assert [s.requests["a"].sequence.ids for s in slices] == [(101, 120), (121, 140), (141, 160)]
    assert "has room for 3 workers" in slice_ids(scen, 3, 20)


def test_sequences_on_a_stateful_model(triton, tmp_path: Path) -> None:
    """Sequences of ~10 (+-20%) on accumulate: no request refused (a missing START would be),
    every request accounted for, and the sequences counted with their latencies."""
    scen = (ROOT / "scenarios" / "stateful.yaml").read_text()
    out = _run_shipped("stateful", triton, tmp_path, (
        "step_duration: 5s, warmup: 1s", "step_duration: 2s, warmup: 0.3s"))
    steps = _steps(out)
    assert len(steps) == 4 and scen.count("step_duration: 5s, warmup: 1s") == 2
    for step in steps:
        _assert_exact(step, "accumulate")
        c = step["client"]["accumulate"]
        assert c["requests"] / 13 <= c["sequences"] <= c["requests"] / 7, c
        assert c["sequence_latency_us"]["p50"] > c["latency_us"]["p50"] * 5
    for step, rate in zip(steps[2:], (20, 50), strict=True):
        # open loop: sequences start at the rate; their later requests count as scheduled
        # when sent, so scheduled == sent + dropped still holds
        ol = step["open_loop"]
        assert ol["scheduled"] == ol["sent"] + ol["dropped"] and ol["dropped"] == 0, ol
        sequences = step["client"]["accumulate"]["sequences"]
        assert rate * 2 * 0.7 <= sequences <= rate * 2 * 1.3, (rate, sequences)


def test_an_ensemble_reports_each_composing_model_beside_it(triton, tmp_path: Path) -> None:
    """image_pipeline = preprocess -> cnn: the ensemble's own count matches the client's, and
    each composing model's statistics are in the step, marked, with one execution per
    ensemble request."""
    out = _run_shipped("ensemble", triton, tmp_path, (
        "step_duration: 5s, warmup: 1s", "step_duration: 1.5s, warmup: 0.2s"))
    for step in _steps(out):
        _assert_exact(step, "image_pipeline")
        for inner in ("preprocess", "cnn"):
            s = step["server"][inner]
            assert s["composing_of"] == "image_pipeline"
            assert s["success"] == step["requests"], (inner, s, step["requests"])
    assert "cnn (in image_pipeline): batch" in (out / "summary.md").read_text()


def test_outputs_are_validated_against_perf_analyzers_validation_data(triton, tmp_path) -> None:
    """add_sub with perf_analyzer's validation_data: right answers pass; entries whose expected
    sum is wrong fail as MISMATCH with the first differing element, client == server still."""
    rng = np.random.default_rng(4)
    data, expected = [], []
    for k in range(20):
        a = rng.integers(-5, 5, 4).astype(float).tolist()
        b = rng.integers(-5, 5, 4).astype(float).tolist()
        data.append({"INPUT0": a, "INPUT1": b})
        total = [x + y for x, y in zip(a, b, strict=True)]
        if k % 5 == 0:
            total[2] += 1.0  # 4 of 20 entries expect a wrong sum
        expected.append({"OUTPUT0": total,
                         "OUTPUT1": [x - y for x, y in zip(a, b, strict=True)]})
    (tmp_path / "v.json").write_text(json.dumps({"data": data, "validation_data": expected}))
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "v.yaml", """
requests:
  add_sub:
    model: add_sub
    dataset: v.json
    validate: true
    inputs:
      INPUT0: {dtype: FP32, shape: [4], data: dataset}
      INPUT1: {dtype: FP32, shape: [4], data: dataset}
phases: [{name: p, load: {concurrency: 2, step_duration: 1.5s, warmup: 0s}}]
""")), "--target", triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]  # errors without thresholds: exit 0, loud
    (step,) = _steps(out)
    assert step["accounting"]["status"] == "ok", step["accounting"]
    mismatches = step["errors"]["MISMATCH"]
    total = step["requests"] + mismatches
    assert abs(mismatches / total - 0.2) < 0.02, (mismatches, total)  # 4 of every 20, in turn
    messages = [m["message"] for m in step["error_messages"]["MISMATCH"]]
    assert any("output 'OUTPUT0' element 2: expected" in m for m in messages), messages
    # the server answered every one: its successes are client successes + mismatches
    assert step["server"]["add_sub"]["success"] == total
