"""Model kinds loadkit never saw, on the real embedded Triton, each against the server's own
evidence: sequences left open at a phase end, perf_analyzer's sequence data sets, an ensemble
beside a direct call of its member (and a BLS model beside its callee), and streams that end
with no response. The fixture models are in tests/models (its README)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from conftest import loadkit, results, write


def _steps(out: Path) -> list[dict]:
    return [s for p in results(out)["phases"] for s in p["steps"]]


def _run(triton, tmp_path: Path, text: str, *extra: str) -> tuple[Path, object]:
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "s.yaml", text)), "--target",
                   triton.grpc_address, "--out", str(out), "--quiet", *extra)
    return out, proc


def _recorded(record_dir: Path, ids: range) -> dict[int, list[tuple[int, int, int, int]]]:
    """seq_record's log, per correlation id in `ids`: (start, end, value, sum) in order."""
    per: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)
    for line in (record_dir / "seq_record.log").read_text().splitlines():
        corr, start, end, value, total = map(int, line.split())
        if corr in ids:
            per[corr].append((start, end, value, total))
    return per


def _sequences(per: dict[int, list[tuple[int, int, int, int]]]) -> list[list[int]]:
    """Every sequence the server saw, as its values, checking that each started with START,
    ended with END, and never started again while open."""
    done: list[list[int]] = []
    for corr, rows in per.items():
        current: list[int] | None = None
        for start, end, value, _ in rows:
            if start:
                assert current is None, f"id {corr}: START while its sequence was still open"
                current = []
            assert current is not None, f"id {corr}: a request outside any sequence"
            current.append(value)
            if end:
                done.append(current)
                current = None
        assert current is None, f"id {corr}: its last sequence never got an END: {rows[-3:]}"
    return done


SEQ_PHASES = """
name: seq-phases
requests:
  s:
    model: seq_record
    sequence: {{length: 10, ids: [{first}, {last}]}}
    inputs:
      INPUT0: {{dtype: INT32, shape: [1], data: ones}}
phases:
  - name: first
    load: {{concurrency: 4, step_duration: 2s, warmup: 0s}}
  - name: second
    load: {{concurrency: 4, step_duration: 2s, warmup: 0s}}
  - name: third
    load: {{concurrency: [2, 4], step_duration: 1.5s, warmup: 0.3s}}
"""


def test_sequences_open_at_a_phase_end_are_ended_before_the_next(triton, tmp_path,
                                                                 record_dir) -> None:
    """seq_record has 4 sequence slots and a 5 s idle timeout. Sequences still open when a
    phase ends get their END before the next phase (and at a ramp and the run's end), so the
    next phase runs as fast as the first; on the server every sequence began with START and
    ended with END, and no id started again while open."""
    ids = range(1_000_000, 2_000_000)  # wide: an id coming round would end its old sequence
    out, proc = _run(triton, tmp_path, SEQ_PHASES.format(first=ids[0], last=ids[-1]))
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = _steps(out)
    first, second = steps[0], steps[1]
    for s in steps:
        assert s["accounting"]["status"] == "ok", s["accounting"]
        assert not s["errors"], s["error_messages"]
    # stalled, the second phase's new sequences waited for the idle timeout (5 s) behind
    # the slots the first phase's open ones held
    assert second["throughput"] >= 0.5 * first["throughput"], (first["throughput"],
                                                               second["throughput"])
    assert second["latency_us"]["max"] < 2_000_000, second["latency_us"]
    ended = [e for e in results(out)["events"] if e["event"] == "sequences_ended"]
    assert [e["before"] for e in ended][:2] == ["the end of phase first",
                                                "the end of phase second"], ended
    sequences = _sequences(_recorded(record_dir, ids))
    assert sum(len(s) for s in sequences) >= sum(s["requests"] for s in steps)


def test_perf_analyzer_sequence_data_set_walks_each_sequence_in_order(triton, tmp_path,
                                                                       record_dir) -> None:
    """perf_analyzer's nested form: each inner list is one sequence, walked in order by one
    user even at concurrency 3, so every validated running sum matches (a shared cursor
    started sequences mid-way: MISMATCH); the server received exactly the file's sequences."""
    data = [[{"INPUT0": [10 * k + j]} for j in range(1, 3 + k % 3)] for k in range(7)]
    expected = [[{"OUTPUT0": [sum(e["INPUT0"][0] for e in seq[:j + 1])]}
                 for j in range(len(seq))] for seq in data]
    write(tmp_path / "seqs.json", json.dumps({"data": data, "validation_data": expected}))
    ids = range(2_000_000, 3_000_000)
    out, proc = _run(triton, tmp_path, f"""
name: seq-data
requests:
  s:
    model: seq_record
    dataset: seqs.json
    validate: true
    sequence: {{ids: [{ids[0]}, {ids[-1]}]}}
    inputs:
      INPUT0: {{dtype: INT32, shape: [1], data: dataset}}
phases:
  - name: x
    load: {{concurrency: 3, step_duration: 2s, warmup: 0.2s}}
""")
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = _steps(out)[0]
    assert step["accounting"]["status"] == "ok", step["accounting"]
    assert not step["errors"], step["error_messages"]
    assert step["client"]["s"]["distinct_payloads"] == sum(len(s) for s in data)
    assert "7 sequences of 2..4 steps" in (out / "summary.md").read_text()
    files = [[e["INPUT0"][0] for e in seq] for seq in data]
    seen = _sequences(_recorded(record_dir, ids))
    # whole sequences from the file; those the run's end cut short are prefixes, END-ed early
    assert all(any(s == f[:len(s)] for f in files) for s in seen), seen
    assert sum(s in files for s in seen) >= len(seen) - 3


def test_an_ensemble_beside_a_direct_call_of_its_member_is_accounted(triton, tmp_path) -> None:
    """image_pipeline (preprocess -> cnn) and cnn called directly: cnn's server count is its
    direct requests plus one per ensemble request, exactly (it was compared with the direct
    ones alone: a false mismatch, exit 1). dense under a BLS model that declares it is
    unchecked, with why."""
    out, proc = _run(triton, tmp_path, """
name: ensemble-and-member
requests:
  pipe:
    model: image_pipeline
    inputs:
      RAW: {dtype: UINT8, shape: [32, 32, 3]}
  cnn_direct:
    model: cnn
    inputs:
      image: {dtype: FP32, shape: [3, 32, 32]}
  bls:
    model: bls_dense
    composing_models: [dense]       # it calls dense from its code
    inputs:
      INPUT0: {dtype: FP32, shape: [1, 256]}
  dense_direct:
    model: dense
    inputs:
      INPUT0: {dtype: FP32, shape: [256]}
mix: {pipe: 2, cnn_direct: 1, bls: 1, dense_direct: 1}
phases:
  - name: x
    load: {concurrency: 4, step_duration: 2s, warmup: 0.2s}
""")
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = _steps(out)[0]
    acc = step["accounting"]
    assert acc["status"] == "unchecked", acc
    client = step["client"]
    cnn = next(c for c in acc["checks"] if c["check"].startswith("cnn:"))
    assert cnn["ok"] and cnn["left"] == cnn["right"] == (
        client["pipe"]["requests"] + client["cnn_direct"]["requests"]), cnn
    assert "from pipe" in cnn["check"] and "from cnn_direct" in cnn["check"], cnn
    assert step["server"]["cnn"]["success"] == cnn["right"]
    pre = next(c for c in acc["checks"] if c["check"].startswith("preprocess:"))
    assert pre["ok"] and pre["left"] == client["pipe"]["requests"], pre
    assert any(u.startswith("dense: client == server not checked") and "BLS" in u
               for u in acc["unchecked"]), acc["unchecked"]
    assert results(out)["status"] == "complete"


def test_a_stream_with_no_response_has_no_first_response(triton, tmp_path) -> None:
    """silent_stream with N = 0 sends only the final flag: such requests are counted apart
    (no_response) with their latency kept, and never enter the first-response histogram
    (they were timed as 1 µs first responses, halving the step's mean)."""
    out, proc = _run(triton, tmp_path, """
name: silent
requests:
  none:
    model: silent_stream
    inputs: {N: {dtype: INT32, shape: [1], data: constant, value: 0}}
  two:
    model: silent_stream
    inputs: {N: {dtype: INT32, shape: [1], data: constant, value: 2}}
phases:
  - name: x
    load: {concurrency: 2, step_duration: 2s, warmup: 0.2s}
""")
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = _steps(out)[0]
    assert step["accounting"]["status"] == "ok", step["accounting"]
    none, two = step["client"]["none"], step["client"]["two"]
    assert none["no_response"] == none["requests"] > 0, none
    # an empty histogram has no percentile: null in results.json, `-` in every table
    assert none["responses"] == 0, none
    assert none["first_response_us"] == {k: None for k in none["first_response_us"]}, none
    assert none["latency_us"]["p50"] > 0
    assert "no_response" not in two and two["responses"] == 2 * two["requests"], two
    # every first response recorded is a real one: after the model's 1 ms sleep
    assert step["streaming"]["first_response_us"]["p50"] >= 1000, step["streaming"]
    assert step["streaming"]["no_response"] == none["requests"]
    assert "ended with no response" in (out / "summary.md").read_text()
    csv_rows = (out / "steps.csv").read_text().splitlines()
    assert all(",0,0,0," not in row for row in csv_rows), csv_rows


def test_a_data_set_not_a_multiple_of_the_batch_size_sends_every_entry(triton,
                                                                         tmp_path) -> None:
    """5 entries at batch_size 2: three requests, the last wrapping round to the first entry
    (the fifth entry was never sent), and the plan and summary say so."""
    rng = __import__("numpy").random.default_rng(5)
    data = [{"INPUT0": [float(x) for x in rng.random(256)]} for _ in range(5)]
    write(tmp_path / "five.json", json.dumps({"data": data}))
    text = """
name: wrap
requests:
  d:
    model: dense
    batch_size: 2
    dataset: five.json
    inputs:
      INPUT0: {dtype: FP32, shape: [256], data: dataset}
phases:
  - name: x
    load: {concurrency: 1, step_duration: 1s, warmup: 0.1s}
"""
    plan = loadkit("validate", str(write(tmp_path / "s.yaml", text)))
    assert plan.returncode == 0, plan.stderr
    wraps = "the last request takes the last 1 and wraps round to the first 1"
    assert "3 distinct requests from five.json (5 entries" in plan.stdout + plan.stderr
    assert wraps in plan.stdout + plan.stderr
    out, proc = _run(triton, tmp_path, text)
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = _steps(out)[0]
    assert step["accounting"]["status"] == "ok", step["accounting"]
    assert step["client"]["d"]["distinct_payloads"] == 3
    assert wraps in (out / "summary.md").read_text()
