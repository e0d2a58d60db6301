"""Triton's generate extension over the HTTP door: `endpoint: generate_stream` (server-sent
events, one per streamed response) and `endpoint: generate` (one JSON response), against a
Triton of their own with the streaming simulator; responses, tokens and cancellations counted
as over gRPC streams, every request accounted for."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import loadkit, results, tokenizer_file, write

from loadkit.control.embedded import EmbeddedServer

pytestmark = pytest.mark.xdist_group("generate")
PROMPT = "one two three four five six seven eight nine ten"


@pytest.fixture(scope="module")
def gen_triton(tmp_path_factory: pytest.TempPathFactory) -> EmbeddedServer:
    log = tmp_path_factory.mktemp("gen-triton") / "tritonserver.log"
    server = EmbeddedServer(models=("token_generator", "dense"), log_path=log)
    server.start()
    yield server
    server.stop()


def _run(server: EmbeddedServer, tmp_path: Path, text: str, *more: str) -> Path:
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "s.yaml", text)), "--target",
                   f"http://{server.http_address}", "--metrics", server.metrics_url,
                   "--out", str(out), "--quiet", *more)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_generate_stream_counts_every_event_and_token(gen_triton, tmp_path: Path) -> None:
    """An llm template over generate_stream, closed then open loop: 5 events per request (the
    simulator streams exactly the max_tokens asked), the tokenizer's count of their text, and
    client == server per model, with `generate` for dense beside it."""
    from tokenizers import Tokenizer

    tok = tokenizer_file(tmp_path / "tokenizer.json")
    out = _run(gen_triton, tmp_path, f"""
name: gen
requests:
  chat:
    model: token_generator
    endpoint: generate_stream
    llm: {{style: tensorrt_llm, input_tokens: 6, output_tokens: 5, count: 8,
          tokenizer: {tok.name}}}
  one:
    model: dense
    endpoint: generate
    inputs: {{INPUT0: {{dtype: FP32, shape: [256]}}}}
mix: {{chat: 70, one: 30}}
phases:
  - {{name: c, load: {{concurrency: 3, step_duration: 2s, warmup: 0.3s}}}}
  - {{name: o, load: {{rate: 40, step_duration: 2s, warmup: 0.3s}}}}
""")
    per_request = len(Tokenizer.from_file(str(tok)).encode(
        "".join(f" tok{k}" for k in range(1, 6))).ids)
    for phase in results(out)["phases"]:
        (step,) = phase["steps"]
        assert step["accounting"]["status"] == "ok", step["accounting"]
        assert not step["errors"], step["error_messages"]
        chat, one = step["client"]["chat"], step["client"]["one"]
        assert step["server"]["token_generator"]["success"] == chat["requests"] > 5
        assert step["server"]["dense"]["success"] == one["requests"] > 0
        assert chat["responses"] == 5 * chat["requests"], chat
        assert chat["output_tokens"] == per_request * chat["requests"], (chat, per_request)
        assert step["streaming"]["first_response_us"]["p50"] < chat["latency_us"]["p50"]


def test_a_cancelled_generate_stream_closes_its_connection(gen_triton, tmp_path) -> None:
    """cancel: {after: 3, share: 50%} over generate_stream: the client closes the request's
    connection after 3 events (HTTP/1.1's only cancel); Triton cancels it; counted apart."""
    out = _run(gen_triton, tmp_path, f"""
name: cancel
requests:
  gen:
    model: token_generator
    endpoint: generate_stream
    parameters: {{decode_us_per_step: 5000}}
    cancel: {{after: 3, share: 50%}}
    inputs:
      text_input: {{dtype: BYTES, shape: [1], data: constant, value: "{PROMPT}"}}
      max_tokens: {{dtype: INT32, shape: [1], data: constant, value: 12}}
phases:
  - {{name: c, load: {{concurrency: 2, step_duration: 3s, warmup: 0.3s}}}}
""")
    step = results(out)["phases"][0]["steps"][0]
    c = step["client"]["gen"]
    assert step["accounting"]["status"] == "ok", step["accounting"]
    assert not step["errors"], step["error_messages"]
    done, cancelled = c["requests"], c["cancelled"]
    assert 0.25 < cancelled / (done + cancelled) < 0.75, (done, cancelled)
    assert c["responses"] == 12 * done
    server = step["server"]["token_generator"]
    assert server["success"] + server["fail"] == done + cancelled, (server, done, cancelled)


def test_the_generate_extension_is_refused_over_grpc_and_infer_for_a_stream(gen_triton,
                                                                           tmp_path) -> None:
    text = """
name: r
requests:
  chat:
    model: token_generator{endpoint}
    inputs:
      text_input: {{dtype: BYTES, shape: [1], data: constant, value: "hi"}}
phases: [{{name: c, load: {{concurrency: 1, step_duration: 1s}}}}]
"""
    path = write(tmp_path / "g.yaml", text.format(endpoint="\n    endpoint: generate_stream"))
    proc = loadkit("run", str(path), "--target", gen_triton.grpc_address, "--out",
                   str(tmp_path / "g"))
    assert proc.returncode == 2 and "HTTP generate extension" in proc.stderr, proc.stderr
    path = write(tmp_path / "i.yaml", text.format(endpoint=""))
    proc = loadkit("run", str(path), "--target", f"http://{gen_triton.http_address}", "--out",
                   str(tmp_path / "i"))
    assert proc.returncode == 2 and "set endpoint: generate_stream" in proc.stderr, proc.stderr
    path = write(tmp_path / "o.yaml", text.format(endpoint="\n    endpoint: generate"))
    proc = loadkit("run", str(path), "--target", f"http://{gen_triton.http_address}", "--out",
                   str(tmp_path / "o"))
    assert proc.returncode == 2 and "use endpoint: generate_stream" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.fast
def test_server_sent_events_are_read_whatever_the_packets() -> None:
    """Triton's generate_stream body (chunked, one `data:` event per chunk) read whole, split
    at every byte, and with two events in one chunk: the same events, then the end."""
    from loadkit.transport.sse import SseReader

    events = [b'{"text_output":" tok1"}', b'{"text_output":" tok2"}', b'{"error":"x"}']
    body = b"".join(f"{len(e) + 8:x}\r\n".encode() + b"data: " + e + b"\n\n\r\n"
                    for e in events[:2])
    both = b"data: " + events[2] + b"\n\ndata: " + events[0] + b"\n\n"
    body += f"{len(both):x}\r\n".encode() + both + b"\r\n0\r\n\r\n"
    want = [*events, events[0]]
    whole = SseReader()
    assert whole.feed(body) == want and whole.ended
    split, got = SseReader(), []
    for k in range(len(body)):
        assert not split.ended
        got += split.feed(body[k:k + 1])
    assert got == want and split.ended and split.raw == b""
