"""The engine (native thread, gRPC over h2 in wire.py) against the real embedded Triton, for both
exact accounting, and per-request deadlines that count as errors instead of hanging."""

from __future__ import annotations

import time

import pytest
from conftest import loadkit, results, write

SCENARIO = """
name: engine-{transport}
target: {{transport: {transport}, timeout: {timeout}}}
requests:
  dense_b1:
    model: dense
    inputs: {{INPUT0: {{dtype: FP32, shape: [256], data: random, seed: 3}}}}
phases:
  - name: p
    load: {{concurrency: [1, 6], step_duration: 2s, warmup: 0.5s}}
{config}
"""


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_transport_accounts_for_every_request(triton, tmp_path, transport: str) -> None:
    scen = write(
        tmp_path / "s.yaml", SCENARIO.format(transport=transport, timeout="10s", config="")
    )
    out = tmp_path / "r"
    proc = loadkit("run", str(scen), "--target", triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = results(out)
    assert data["scenario"]["target"]["transport"] == transport
    for step in data["phases"][0]["steps"]:
        assert step["requests"] > 50, step
        assert step["errors"] == {}
        assert step["server"]["dense"]["success"] == step["requests"]
        assert step["generator"]["cpu_us_per_request"] > 0


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_slow_responses_hit_the_deadline_and_are_counted(triton, tmp_path, transport) -> None:
    """Every execute takes 0.6 s, the deadline is 0.2 s: each request fails DEADLINE_EXCEEDED."""
    config = '    config: {dense: {parameters: {device_us: "600000"}}}'
    scen = write(
        tmp_path / "s.yaml", SCENARIO.format(transport=transport, timeout="200ms", config=config)
    )
    out = tmp_path / "r"
    t0 = time.monotonic()
    proc = loadkit("run", str(scen), "--target", triton.grpc_address, "--out", str(out), "--quiet")
    # a run in which nothing succeeded measured nothing: it says so and fails
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 60
    data = results(out)
    assert data["status"] == "failed" and "nothing was measured" in data["reason"]
    assert "DEADLINE_EXCEEDED" in data["reason"]
    for step in data["phases"][0]["steps"]:
        assert step["requests"] == 0, "nothing can succeed within the deadline"
        n = step["errors"].get("DEADLINE_EXCEEDED", 0)
        # each user fails one request per 0.2 s deadline: about 10 per user in a 2 s step, and
        # never more (a request that failed before its deadline would be a bookkeeping bug)
        assert n >= 5 * step["load"]["concurrency"], step["errors"]
        assert n <= step["load"]["concurrency"] * (step["duration_s"] / 0.2 + 1), step["errors"]
        assert set(step["errors"]) == {"DEADLINE_EXCEEDED"}


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_latency_runs_from_the_write_to_the_read(triton, tmp_path, transport: str) -> None:
    """Latency is stamped at the socket write and the socket read (wire.py). One request in
    flight on a model that sleeps 20 ms per execute: each latency is at least the server's
    compute time and at most that plus a few ms. A stamp left from the previous request on the
    stream would add a whole round trip (~20 ms); a stale read stamp would make it ~0."""
    scenario = SCENARIO.format(
        transport=transport, timeout="10s",
        config='    config: {dense: {parameters: {device_us: "20000"}}}',
    ).replace("concurrency: [1, 6]", "concurrency: 1")
    scen = write(tmp_path / "s.yaml", scenario)
    out = tmp_path / "r"
    proc = loadkit("run", str(scen), "--target", triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (step,) = results(out)["phases"][0]["steps"]
    server = step["server"]["dense"]
    assert step["requests"] == server["success"] > 40
    lat = step["latency_us"]
    assert server["compute_infer_us"] >= 20_000
    assert lat["p50"] >= server["compute_infer_us"], (lat, server)
    # the median, not p90 or max: a stale stamp would move every request by a round trip
    # (~20 ms), while a busy 2-core box moved p90 by 9 ms in full-suite runs
    assert lat["p50"] < server["compute_infer_us"] + 10_000, (lat, server)
    # the generator's own framing is inside the latency, and small beside the server's 20 ms
    assert 0 < step["generator"]["own_us_per_request"] < 2_000, step["generator"]
    assert "us of each latency was loadkit's own framing" in (out / "summary.md").read_text()


def test_think_time_paces_each_user(triton, tmp_path) -> None:
    """`think_time` is a pause between a user's reply and its next request (the closed loop's
    callback chain schedules the next send after it). 3 users, 50 ms think, 2 s measured: no
    user can send more than 2 / 0.05 + 1 requests, and without the pause a user sends hundreds
    per second here. Every request still equals the server's count."""
    scenario = SCENARIO.format(transport="stream", timeout="10s", config="").replace(
        "phases:", "think_time: 50ms\nphases:").replace("concurrency: [1, 6]", "concurrency: 3")
    scen = write(tmp_path / "s.yaml", scenario)
    out = tmp_path / "r"
    proc = loadkit("run", str(scen), "--target", triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (step,) = results(out)["phases"][0]["steps"]
    ceiling = 3 * (step["duration_s"] / 0.05 + 1)
    assert 0.5 * ceiling < step["requests"] <= ceiling, (step["requests"], ceiling)
    assert step["server"]["dense"]["success"] == step["requests"]
    assert step["errors"] == {}
