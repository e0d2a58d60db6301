"""Open-loop arrival rates against the real embedded Triton: coordinated omission shown (and
not hidden), rates held, drops counted, every request accounted for."""

from __future__ import annotations

import pytest
from conftest import loadkit, results, write

# its module fixtures (a shared run or server) are built once: the file runs whole on one
# test worker (make test, --dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_open_loop")

STALL = '{dense: {parameters: {stall_every_s: "1", stall_ms: "200"}}}'
SCENARIO = f"""
name: open-loop
requests:
  dense_b1:
    model: dense
    inputs: {{INPUT0: {{dtype: FP32, shape: [256], data: random, seed: 1}}}}
phases:
  - name: closed
    load: {{concurrency: 2, step_duration: 5s, warmup: 1s}}
    config: {STALL}
  - name: open
    load: {{rate: 300, step_duration: 5s, warmup: 1s}}
    config: {STALL}
  - name: poisson
    load: {{rate: 200/s, arrival: poisson, seed: 5, step_duration: 3s, warmup: 0.5s}}
  - name: capped
    load: {{rate: 3000, max_concurrency: 3, step_duration: 3s, warmup: 0.5s}}
"""


@pytest.fixture(scope="module")
def run(triton, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("open")
    scen = write(tmp / "open.yaml", SCENARIO)
    out = tmp / "r"
    proc = loadkit("run", str(scen), "--target", triton.grpc_address, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = results(out)
    return {"data": data, "out": out, "stdout": proc.stdout,
            "steps": {p["name"]: p["steps"][0] for p in data["phases"]}}


def test_a_stall_shows_in_open_loop_p99_and_hides_in_closed_loop(run) -> None:
    closed, opened = run["steps"]["closed"], run["steps"]["open"]
    # 200 ms stalls every second: a closed loop of 2 users has ~2 slow requests per stall
    assert closed["latency_us"]["p99"] < 50_000, closed["latency_us"]
    assert closed["latency_us"]["max"] > 150_000  # the stall happened
    # 300/s scheduled through the stall: ~60 requests wait behind each one, measured from the
    # time they were due
    assert opened["latency_us"]["p99"] > 100_000, opened["latency_us"]
    assert opened["open_loop"]["latency_from"].startswith("scheduled")
    service = opened["open_loop"]["service_latency_us"]
    assert 0 < service["p50"] <= opened["latency_us"]["p50"]


def test_constant_rate_is_held_within_two_percent(run) -> None:
    o = run["steps"]["open"]["open_loop"]
    duration = run["steps"]["open"]["duration_s"]
    assert o["dropped"] == 0 and o["sent"] == o["scheduled"]
    assert abs(o["scheduled"] / 5.0 - 300) / 300 < 0.02, o
    assert abs(o["achieved_rate"] - 300) / 300 < 0.02 * 5.0 / duration + 0.02, o


def test_poisson_arrivals_average_the_rate(run) -> None:
    o = run["steps"]["poisson"]["open_loop"]
    assert o["arrival"] == "poisson"
    assert abs(o["scheduled"] / 3.0 - 200) / 200 < 0.15, o


def test_full_in_flight_cap_drops_and_says_so(run) -> None:
    s = run["steps"]["capped"]
    o = s["open_loop"]
    assert o["dropped"] > 0 and o["limited_by"] == "server"
    assert o["scheduled"] == o["sent"] + o["dropped"]
    assert o["sent"] == s["requests"] + sum(s["errors"].values())
    assert "the server did not keep up" in run["stdout"] and "were dropped" in run["stdout"]


def test_every_sent_request_is_accounted_for(run) -> None:
    for name, step in run["steps"].items():
        assert step["server"]["dense"]["success"] == step["requests"], name
    assert (run["out"] / "service_histograms.json").exists()
