"""Decoupled (streaming) models on the real embedded Triton: a request ends at its final
response; time to the first response, gaps between responses, responses per request, goodput;
closed and open loop; the shipped token_generator simulator and Triton's `repeat` shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import loadkit, results, tokenizer_file, write

from loadkit.control.embedded import EmbeddedServer
from loadkit.scenario import load_scenario
from loadkit.transport.grpc_door import GrpcEncoder
from loadkit.transport.payloads import prepare_pool

# its module fixtures (a shared run or server) are built once: the file runs whole on one
# test worker (make test, --dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_streaming")


@pytest.fixture(scope="module")
def stream_triton(tmp_path_factory: pytest.TempPathFactory) -> EmbeddedServer:
    """A Triton of its own, so a crash of the streaming models cannot take the session's
    server down with them: Triton 2.51 crashed (SIGSEGV in TRITONBACKEND_ResponseSend) when a
    decoupled and a plain model's requests shared one gRPC stream, which loadkit no longer
    does (docs/streaming.md)."""
    log = tmp_path_factory.mktemp("stream-triton") / "tritonserver.log"
    server = EmbeddedServer(models=("token_generator", "repeat", "dense"), log_path=log)
    server.start()
    yield server
    server.stop()

PROMPT = "one two three four five six seven eight nine ten"  # 10 input tokens (words)
TOKENS = 6

SCENARIO = f"""
name: stream
requests:
  gen:
    model: token_generator
    inputs:
      text_input: {{dtype: BYTES, shape: [1], data: constant, value: "{PROMPT}"}}
      max_tokens: {{dtype: INT32, shape: [1], data: constant, value: {TOKENS}}}
  slow_prefill:   # the simulator's clock per request (request parameters): no model reload
    model: token_generator
    parameters: {{prefill_us_per_token: 2000}}
    inputs:
      text_input: {{dtype: BYTES, shape: [1], data: constant, value: "{PROMPT}"}}
      max_tokens: {{dtype: INT32, shape: [1], data: constant, value: {TOKENS}}}
  slow_decode:
    model: token_generator
    parameters: {{decode_us_per_step: 8000}}
    inputs:
      text_input: {{dtype: BYTES, shape: [1], data: constant, value: "{PROMPT}"}}
      max_tokens: {{dtype: INT32, shape: [1], data: constant, value: {TOKENS}}}
  dense:
    model: dense
    inputs: {{INPUT0: {{dtype: FP32, shape: [256]}}}}
goodput: {{first_response: 15ms, inter_response: 40ms}}
phases:
  - name: base
    load: {{concurrency: 1, step_duration: 2s, warmup: 0.3s}}
    mix: {{gen: 3, dense: 1}}
  - name: slow-prefill
    load: {{concurrency: 1, step_duration: 2s, warmup: 0.3s}}
    mix: {{slow_prefill: 3, dense: 1}}
  - name: slow-decode
    load: {{concurrency: 1, step_duration: 2s, warmup: 0.3s}}
    mix: {{slow_decode: 3, dense: 1}}
  - name: open
    load: {{rate: 20, step_duration: 2s, warmup: 0.3s}}
    mix: {{gen: 3, dense: 1}}
"""


def _phase(data: dict, name: str) -> dict:
    [step] = next(p for p in data["phases"] if p["name"] == name)["steps"]
    return step


def test_streaming_requests_end_at_their_final_response(stream_triton, tmp_path: Path) -> None:
    """Every request of the simulator streams exactly TOKENS responses; the measured first
    response and gaps follow the model's configured prefill and decode times; the request's
    latency is first response + its gaps; dense beside it is measured as before."""
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "s.yaml", SCENARIO)), "--target",
                   stream_triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = results(out)
    for phase, name in zip(data["phases"], ("gen", "slow_prefill", "slow_decode", "gen"),
                           strict=True):
        step = phase["steps"][0]
        assert step["accounting"]["status"] == "ok", step["accounting"]
        assert not step["errors"], step["error_messages"]
        gen, dense = step["client"][name], step["client"]["dense"]
        assert step["server"]["token_generator"]["success"] == gen["requests"] > 5
        assert step["server"]["dense"]["success"] == dense["requests"] > 0
        # exact: the model sends TOKENS per request, the last with the final flag
        assert gen["responses"] == TOKENS * gen["requests"], gen
        assert gen["responses_per_request"] == TOKENS
        assert "first_response_us" not in dense and "responses" not in dense
        first, gap, lat = gen["first_response_us"], gen["inter_response_us"], gen["latency_us"]
        assert first["p50"] < lat["p50"]
        # latency = first response + (TOKENS - 1) gaps, per request; so for the means
        assert abs(lat["mean"] - first["mean"] - (TOKENS - 1) * gap["mean"]) < 0.05 * lat["mean"]
        assert step["streaming"]["responses"] == gen["responses"]

    base, prefill, decode = (_phase(data, p)["client"][t] for p, t in (
        ("base", "gen"), ("slow-prefill", "slow_prefill"), ("slow-decode", "slow_decode")))
    # the model sleeps 50 us/token -> 2000 us/token before its first response: 10 tokens add
    # 19.5 ms to the first response (the stub's own per-response cost, ~1-2 ms, is in both)
    added = prefill["first_response_us"]["p50"] - base["first_response_us"]["p50"]
    assert 19_500 * 0.85 < added < 19_500 * 1.25, (added, base, prefill)
    assert abs(prefill["inter_response_us"]["p50"] - base["inter_response_us"]["p50"]) < 1500
    # each decode step: 2000 + 100 us -> 8000 + 100 us: every gap grows by 6 ms
    added = decode["inter_response_us"]["p50"] - base["inter_response_us"]["p50"]
    assert 6_000 * 0.85 < added < 6_000 * 1.25, (added, base, decode)
    # the server's own view: one execution per request at concurrency 1, its compute time
    # covers the whole stream; the client's latency is that plus queue and transport
    server = _phase(data, "base")["server"]["token_generator"]
    assert server["compute_infer_us"] * 0.9 < base["latency_us"]["mean"] < (
        server["compute_infer_us"] + server["queue_us"] + 5_000), (server, base)
    # goodput (first response within 15 ms, mean gap within 40 ms): base and slow decode meet
    # it, slow prefill (first response ~20 ms later) does not
    good = {p: _phase(data, p)["streaming"]["goodput"]["ratio"]
            for p in ("base", "slow-prefill", "slow-decode")}
    assert good["base"] > 0.9 and good["slow-decode"] > 0.9 and good["slow-prefill"] < 0.1, good
    # open loop: first response and latency count from the scheduled send
    ol = _phase(data, "open")
    assert ol["open_loop"]["scheduled"] == ol["open_loop"]["sent"] > 30
    assert ol["client"]["gen"]["first_response_us"]["p50"] >= base["first_response_us"]["p50"] * 0.8
    # the web UI's Triton tab shows the same streaming numbers as results.json
    from loadkit.locust.webui import triton_rows
    from loadkit.report.units import ms

    rows = {r["phase"]: r for r in triton_rows(data, None, {}) if r.get("step")}
    st = _phase(data, "slow-decode")["streaming"]
    row = rows["slow-decode"]
    assert row["first_response"] == (f"{ms(st['first_response_us']['p50'])} / "
                                     f"{ms(st['first_response_us']['p99'])}")
    assert row["inter_response"].startswith(ms(st["inter_response_us"]["p50"]))
    assert row["tokens_s"] == f"{st['output_tokens_per_s']:.1f}" and "%" in row["goodput"]
    summary = (out / "summary.md").read_text()
    assert "time to first token" in summary and ms(st["first_response_us"]["p99"]) in summary
    assert ms(st["inter_response_us"]["p99"]) in (out / "comparison.md").read_text()
    assert (out / "streaming_vs_load.png").stat().st_size > 10_000
    assert "streaming_vs_load" in (out / "report.html").read_text()


REPEAT = """
name: repeat
requests:
  r:
    model: repeat
    inputs:
      IN: {dtype: INT32, shape: [5], data: ones}
      DELAY_MS: {dtype: INT32, shape: [1], data: constant, value: 2}
phases:
  - name: c
    load: {concurrency: 2, step_duration: 1.5s, warmup: 0.3s}
thresholds:
  first_response_p99: 1ms
  inter_response_p99: 1s
"""


def test_a_final_flag_sent_alone_is_not_a_response_and_gates_read_the_new_metrics(
        stream_triton, tmp_path: Path) -> None:
    """repeat sends its final flag as an empty response (Triton's example): 5 responses per
    request, not 6; a first_response_p99 gate below what the model can do fails the run."""
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "s.yaml", REPEAT)), "--target",
                   stream_triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 1, proc.stderr[-3000:]
    data = results(out)
    step = data["phases"][0]["steps"][0]
    c = step["client"]["r"]
    assert step["server"]["repeat"]["success"] == c["requests"] > 10
    assert c["responses_per_request"] == 5 and c["responses"] == 5 * c["requests"]
    assert c["inter_response_us"]["p50"] >= 2000  # DELAY_MS 2 between responses
    outcomes = {o["threshold"]: o for o in data["thresholds"]}
    assert outcomes["first_response_p99"]["status"] == "fail", outcomes
    assert outcomes["inter_response_p99"]["status"] == "pass", outcomes


@pytest.mark.fast
def test_llm_templates_build_each_backends_inputs(tmp_path: Path) -> None:
    """vLLM: text_input + stream + sampling_parameters JSON (max_tokens) +
    exclude_input_in_output; TensorRT-LLM: max_tokens as an INT32 input. Synthetic prompts have
    the seeded lengths; with a tokenizer, exactly the drawn token count."""
    tok_file = tokenizer_file(tmp_path / "tokenizer.json")
    scen = load_scenario(write(tmp_path / "s.yaml", f"""
requests:
  v:
    model: token_generator
    llm: {{style: vllm, input_tokens: 20, output_tokens: {{mean: 8, stddev: 2}}, count: 50,
          sampling_parameters: {{temperature: 0.5}}}}
  t:
    model: token_generator
    llm: {{style: tensorrt_llm, input_tokens: 12, output_tokens: 5, count: 10,
          tokenizer: {tok_file.name}}}
phases: [{{name: x, load: {{concurrency: 1, step_duration: 1s}}}}]
"""))
    v, t = scen.requests["v"], scen.requests["t"]
    assert [s.name for s in v.inputs] == ["text_input", "stream", "exclude_input_in_output",
                                          "sampling_parameters"]
    entries = v.dataset.entries
    assert len(entries) == 50 and v.llm.input_tokens_mean == 20 and v.llm.tokens_by == "words"
    params = [json.loads(e["sampling_parameters"][0]) for e in entries]
    assert all(p["temperature"] == 0.5 and p["ignore_eos"] for p in params)
    wanted = [p["max_tokens"] for p in params]
    assert 7 <= sum(wanted) / 50 <= 9 and len(set(wanted)) > 2  # drawn, seeded
    assert all(len(e["text_input"][0].split()) == 20 for e in entries)
    assert "max_tokens" in [s.name for s in t.inputs]
    assert all(int(e["max_tokens"][0]) == 5 for e in t.dataset.entries)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tok_file))
    counts = [len(tok.encode(e["text_input"][0].decode()).ids) for e in t.dataset.entries]
    assert t.llm.tokens_by == "tokenizer.json" and t.llm.input_tokens_mean == sum(counts) / 10
    assert all(abs(c - 12) <= 1 for c in counts), counts  # cut to 12 tokens (a re-encode may merge)
    # every request is a distinct prepared payload
    assert len(set(prepare_pool(v, GrpcEncoder()))) == 50


LLM = """
name: llm
requests:
  chat:
    model: token_generator
    llm: {style: vllm, prompts: prompts.jsonl, output_tokens: {mean: 6, stddev: 2}, count: 40}
goodput: {first_response: 1s, inter_response: 1s}
phases:
  - name: open
    load: {rate: 15, step_duration: 2s, warmup: 0s}
thresholds: {goodput_min: 1}
"""


def test_an_llm_template_streams_its_requested_tokens_in_an_open_loop(stream_triton,
                                                                       tmp_path: Path) -> None:
    """Prompts from JSON Lines; each request asks for its own max_tokens (vLLM's
    sampling_parameters) and gets exactly that many responses: responses == the sum asked."""
    prompts = ["hello there", {"prompt": "tell me about load tests"}, {"text_input": "a b c"}]
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps(p) for p in prompts))
    scen_path = write(tmp_path / "s.yaml", LLM)
    out = tmp_path / "r"
    proc = loadkit("run", str(scen_path), "--target", stream_triton.grpc_address, "--out", str(out),
                   "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    step = results(out)["phases"][0]["steps"][0]
    c = step["client"]["chat"]
    assert step["accounting"]["status"] == "ok" and not step["errors"]
    assert step["server"]["token_generator"]["success"] == c["requests"] > 20
    ol = step["open_loop"]
    assert ol["scheduled"] == ol["sent"] == c["requests"]
    # sequential order over the 40-entry pool: the sum of max_tokens of the entries sent
    pool = load_scenario(scen_path).requests["chat"].dataset.entries
    asked = [json.loads(e["sampling_parameters"][0])["max_tokens"] for e in pool]
    sent = c["distinct_payloads"]
    assert c["responses"] == sum(asked[i % 40] for i in range(c["requests"])), (c, sent)
    assert c["input_tokens_per_request"] == sum(
        len(str(p if isinstance(p, str) else next(iter(p.values()))).split())
        for p in (prompts * 14)[:40]) / 40
    assert results(out)["thresholds"][0]["status"] == "pass"


CANCEL = f"""
name: cancel
requests:
  gen:
    model: token_generator
    parameters: {{decode_us_per_step: 5000}}
    cancel: {{after: 3, share: 50%}}
    inputs:
      text_input: {{dtype: BYTES, shape: [1], data: constant, value: "{PROMPT}"}}
      max_tokens: {{dtype: INT32, shape: [1], data: constant, value: 12}}
phases:
  - name: c
    load: {{concurrency: 2, step_duration: 3s, warmup: 0.3s}}
"""


def test_a_share_of_requests_is_cancelled_after_its_first_responses(stream_triton,
                                                                   tmp_path: Path) -> None:
    """cancel: {after: 3, share: 50%}: about half the requests are cancelled by the client
    after 3 responses (their streams reset, so Triton cancels them), counted apart from
    successes and errors; the rest stream all 12 responses; every request is accounted for."""
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "s.yaml", CANCEL)), "--target",
                   stream_triton.grpc_address, "--metrics", stream_triton.metrics_url,
                   "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    step = results(out)["phases"][0]["steps"][0]
    c = step["client"]["gen"]
    assert step["accounting"]["status"] == "ok", step["accounting"]
    assert not step["errors"], step["error_messages"]
    done, cancelled = c["requests"], c["cancelled"]
    assert 0.3 < cancelled / (done + cancelled) < 0.7, (done, cancelled)
    assert c["responses"] == 12 * done  # only completed requests' responses are counted
    assert step["streaming"]["cancelled"] == cancelled
    # Triton counts a cancelled request its model ended (is_cancelled -> final flag) as a
    # success: every request sent is one of the server's, cancelled or not
    server = step["server"]["token_generator"]
    assert server["success"] + server["fail"] == done + cancelled, (server, done, cancelled)
    canceled_metric = step["metrics"]["models"]["token_generator"]["request_failure:CANCELED"]
    summary = (out / "summary.md").read_text()
    assert "cancelled (Triton)" in summary and f"| {cancelled} ({canceled_metric:.0f}) |" in summary


def test_a_tokenizer_counts_the_streamed_output_exactly(stream_triton, tmp_path: Path) -> None:
    """With tokenizer: the output tokens are the tokenizer's count of the text the responses
    streamed (the simulator streams " tok1", " tok2", ...), not the number of responses."""
    from tokenizers import Tokenizer

    tok_file = tokenizer_file(tmp_path / "tokenizer.json")
    scen = write(tmp_path / "s.yaml", f"""
name: tok
requests:
  chat:
    model: token_generator
    llm: {{style: tensorrt_llm, input_tokens: 6, output_tokens: 5, count: 4,
          tokenizer: {tok_file.name}}}
phases:
  - name: c
    load: {{concurrency: 1, step_duration: 1.5s, warmup: 0.3s}}
""")
    out = tmp_path / "r"
    proc = loadkit("run", str(scen), "--target", stream_triton.grpc_address, "--out", str(out),
                   "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    c = results(out)["phases"][0]["steps"][0]["client"]["chat"]
    per_request = len(Tokenizer.from_file(str(tok_file)).encode(
        "".join(f" tok{k}" for k in range(1, 6))).ids)
    assert per_request != 5  # word pieces: the count differs from the responses'
    assert c["responses"] == 5 * c["requests"] > 10
    assert c["output_tokens"] == per_request * c["requests"], (c, per_request)
    assert c["tokens_counted_as"] == "tokenizer.json"


MOONCAKE = """
name: mooncake
requests:
  chat: {model: token_generator, llm: {style: vllm, trace: m.jsonl}}
phases:
  - name: all
    load: {replay: m.jsonl}
  - name: late-half
    load: {replay: m.jsonl, window: [1s, 2s], speed: 2}
"""


def test_a_mooncake_trace_replays_each_lines_request_at_its_time(stream_triton,
                                                                 tmp_path: Path) -> None:
    """AIPerf's mooncake trace as the load and as the llm template's requests: every line is
    sent once at its timestamp with its own prompt and max_tokens, so the responses streamed
    are exactly the sum of the lines' output lengths (of the window's lines, for a slice)."""
    import random

    rng = random.Random(3)
    rows = [{"timestamp": round(i * 50 + rng.random() * 20, 1),
             "input_length": rng.randint(5, 40), "output_length": rng.randint(1, 6),
             "hash_ids": [i % 3, 100 + i]} for i in range(40)]  # 2 s, three shared prefixes
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "s.yaml", MOONCAKE)), "--target",
                   stream_triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    full, half = (p["steps"][0] for p in results(out)["phases"])
    for step, lines in ((full, rows), (half, [r for r in rows if r["timestamp"] >= 1000])):
        ol, c = step["open_loop"], step["client"]["chat"]
        assert ol["replay"]["format"] == "mooncake" and ol["scheduled"] == len(lines), ol
        assert ol["sent"] == c["requests"] == len(lines) and not step["errors"], step["errors"]
        assert step["accounting"]["status"] == "ok", step["accounting"]
        assert c["distinct_payloads"] == len(lines)  # each line its own request, once
        assert c["responses"] == sum(r["output_length"] for r in lines), c
    assert abs(half["duration_s"] - 0.5) < 0.1, half["duration_s"]  # 1 s of file at speed 2
