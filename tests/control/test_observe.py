"""Watching a run: the per-second timeline (with the server's rejections at the second they
happened), live Prometheus metrics that end at results.json's numbers, and the Grafana
dashboard's queries against the series loadkit and Triton really expose."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ROOT,
    dense_b1,
    load,
    loadkit,
    prom_api,
    results,
    scenario,
    start_prometheus,
    wait_for,
    write,
)

from loadkit.control.metrics import GAUGES


def observe(name: str, conc: str, dur: str, config: dict[str, Any] | None = None) -> str:
    """One closed phase on dense (seed 7), with a config overlay if given."""
    phase = {"name": name, "load": load(conc, dur), **({"config": config} if config else {})}
    return scenario("observe", [phase], {"dense_b1": dense_b1(seed=7)})


# a queue of at most 2 behind a 3 ms "device"
GUARD = {"dense": {"parameters": {"device_us": "3000"},
                   "dynamic_batching": {"max_queue_delay_microseconds": 100,
                                        "default_queue_policy": {"max_queue_size": 2}}}}
SERIES = re.compile(r"\b((?:loadkit|nv)_[a-z_]+)\b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float] | None:
    """{'name{labels}': value} of one scrape, None when nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    out = {}
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                "gauge": ("",)}
    for line in text.splitlines():
        if line.startswith("# TYPE "):  # a family with no samples yet is still served
            _, _, name, kind = line.split()
            name = name.removesuffix("_total")  # prometheus_client writes counters' TYPE so
            for suffix in suffixes.get(kind, ("",)):
                out[f"#{name}{suffix}"] = 0.0
        elif line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_live_metrics_end_at_the_reports_numbers_and_the_dashboard_queries_exist(
        tmp_path: Path, triton: Any) -> None:
    scen = write(tmp_path / "p.yaml", observe(name="live", conc="[2, 4]", dur="2s",
                                                  config=""))
    out, port = tmp_path / "live", free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadkit", "run", str(scen), "--target", triton.grpc_address,
         "--metrics", triton.metrics_url, "--out", str(out), "--quiet",
         "--prometheus-port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    scrapes: list[dict[str, float]] = []
    try:
        wait_for(lambda: scrape(port) is not None, 60, "the live metrics port")
        while proc.poll() is None:
            got = scrape(port)
            if got is not None:
                scrapes.append(got)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert scrape(port) is None  # closed when the run ended
    data = results(out)
    steps = data["phases"][0]["steps"]
    final = sum(s["client"]["dense_b1"]["requests"] for s in steps)
    key = 'loadkit_requests_total{model="dense",template="dense_b1"}'
    seen = [s[key] for s in scrapes if key in s]
    assert seen == sorted(seen), "a counter went down"
    assert seen[-1] == final, (seen[-5:], final)  # the last scrape holds the report's numbers
    assert any(v for v in seen[:-1] if 0 < v < final)  # and it was counting while it ran
    assert any('stage="measuring"' in k for s in scrapes for k in s if "step_info" in k)
    # the last scrape with the run's series (one taken as the exporter shut down can be empty)
    last = next(s for s in reversed(scrapes) if key in s)
    assert last['loadkit_latency_seconds_count{template="dense_b1"}'] == final
    assert last['loadkit_latency_seconds_bucket{le="+Inf",template="dense_b1"}'] == final

    # every series the Grafana dashboard asks for: one loadkit serves, or Triton's endpoint
    # (scraped now), or one of Triton's GPU gauges (this host has no GPU: control/metrics.py)
    exposed = {k.lstrip("#").split("{")[0] for s in scrapes for k in s}
    with urllib.request.urlopen(triton.metrics_url, timeout=5) as resp:
        exposed |= {m for m in SERIES.findall(resp.read().decode())}
    exposed |= set(GAUGES)
    dash = json.loads((ROOT / "deploy" / "grafana" / "loadkit-triton.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in dash["annotations"]["list"]]
    asked = {m for e in exprs for m in SERIES.findall(e)}
    assert {"loadkit_requests_total", "nv_inference_count", "nv_gpu_utilization"} <= asked
    assert asked <= exposed, asked - exposed


def test_the_queue_guards_rejections_show_at_the_second_they_happened(
        tmp_path: Path, triton: Any) -> None:
    scen = write(tmp_path / "g.yaml", observe(name="guard", conc="16", dur="3s",
                                                  config=GUARD))
    out = tmp_path / "guard"
    r = loadkit("run", str(scen), "--target", triton.grpc_address, "--metrics",
                triton.metrics_url, "--out", str(out), "--quiet")
    step = results(out)["phases"][0]["steps"][0]
    assert step["accounting"]["status"] == "ok", step["accounting"]
    errors = sum(step["errors"].values())
    assert errors > 0 and step["requests"] > 0, step["errors"]
    timeline = step["timeline"]
    assert sum(sum(row["errors"].values()) for row in timeline) == errors
    # per second, not one number for the step; every second of the window refused some
    refused = [sum(row["errors"].values()) for row in timeline if row.get("length_s", 1) == 1]
    assert len(refused) >= 3 and all(refused), refused
    # Triton 2.51 does not count these in nv_inference_request_failure (REJECTED stays 0): the
    # client's side, with the server's own words, is where the guard shows
    summary = (out / "summary.md").read_text()
    assert "Errors over time" in summary and "Exceeds maximum queue size" in summary
    assert (out / "timeline.png").stat().st_size > 10_000
    assert r.returncode in (0, 1), r.stderr[-2000:]


# a run that gives every panel something to show: the queue guard's rejections (loadkit's
# errors, Triton's failures) in closed loop, then sends dropped at max_concurrency
DASHBOARD_RUN = """
name: dash
requests:
  dense_b1: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
phases:
  - name: guard
    load: {concurrency: [2, 8], step_duration: 3s, warmup: 0.5s}
    config:
      dense:
        parameters: {device_us: "3000"}
        dynamic_batching:
          max_queue_delay_microseconds: 100
          default_queue_policy: {max_queue_size: 2}
  - name: drops
    load: {rate: 600, max_concurrency: 1, step_duration: 3s, warmup: 0.5s}
    config:
      dense:
        parameters: {device_us: "3000"}
"""


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="no prometheus (make test installs Debian's package as root)")
def test_every_dashboard_query_returns_data_in_a_real_prometheus(tmp_path: Path,
                                                                triton: Any) -> None:
    """A real Prometheus scrapes the embedded Triton and a run; every expression of the
    Grafana dashboard, the step annotation included, returns data over the run (the GPU
    gauges aside: this host has no GPU). Requests per model match between loadkit and
    Triton (the throughput panel compared requests per template with inferences per model)."""
    import time

    lk_port = free_port()
    prom, prom_port = start_prometheus(tmp_path, triton, lk_port)
    try:
        scen = write(tmp_path / "p.yaml", DASHBOARD_RUN)
        t0 = time.time()
        proc = loadkit("run", str(scen), "--target", triton.grpc_address, "--metrics",
                       triton.metrics_url, "--out", str(tmp_path / "r"), "--quiet",
                       "--prometheus-port", str(lk_port), timeout=120)
        assert proc.returncode == 0, proc.stderr
        t1 = time.time() + 2
        dash = json.loads((ROOT / "deploy" / "grafana" / "loadkit-triton.json").read_text())
        exprs = {t["expr"]: p["title"] for p in dash["panels"] for t in p["targets"]}
        annotation = dash["annotations"]["list"][0]["expr"]
        exprs[annotation] = "annotation"

        def series(expr: str) -> list[dict[str, Any]]:
            q = expr.replace("$__rate_interval", "4s").replace("$__interval", "1s")
            got = prom_api(prom_port, "/api/v1/query_range", query=q, start=f"{t0:.3f}",
                        end=f"{t1:.3f}", step="1")
            assert got["status"] == "success", (expr, got)
            return got["data"]["result"]

        # the scrapes of the run's last seconds arrive within a scrape interval or two
        wait_for(lambda: series(annotation), 10, "the step annotation's series")
        empty = {e: title for e, title in exprs.items() if not series(e)}
        assert {e for e in empty if "nv_gpu_" not in e} == set(), empty  # only GPU gauges
        regions = series(annotation)
        steps = {(s["metric"]["phase"], s["metric"]["step"]) for s in regions}
        assert steps == {("guard", "1"), ("guard", "2"), ("drops", "1")}  # a region a step
        # each region lies within its step's warm-up and window (a scrape late, at most),
        # never into the next phase; its label names the step
        data = results(tmp_path / "r")
        starts = {(p["name"], str(s["index"] + 1)): (s["started_at"], s["duration_s"])
                  for p in data["phases"] for s in p["steps"]}
        from datetime import datetime
        for r in regions:
            key = (r["metric"]["phase"], r["metric"]["step"])
            began = datetime.fromisoformat(starts[key][0]).timestamp()
            times = [float(t) for t, _ in r["values"]]
            assert began - 0.5 - 1.5 <= min(times) and max(times) <= began + starts[key][1] + 2, (
                key, began, min(times), max(times))
            assert r["metric"]["load"], r
        swaps = series(dash["annotations"]["list"][1]["expr"])
        assert {s["metric"]["phase"] for s in swaps} <= {"guard", "drops"}
        # the HDR p99 of the measured windows so far ends at the report's numbers' scale: no
        # bucket interpolation (which read up to 2x)
        (p99,) = series('loadkit_latency_quantile_seconds{quantile="0.99"}')
        last = float(p99["values"][-1][1]) * 1e6
        worst = max(s["latency_us"]["p99"] for p in data["phases"] for s in p["steps"])
        assert last <= worst * 1.01, (last, worst)
        # the throughput panel's two lines are the same quantity, requests/s per model: over
        # the seconds where loadkit counted, the areas under them agree (second by second they
        # are scraped apart, and Triton also counts the warm-ups loadkit leaves out)
        panel = next(p for p in dash["panels"] if p["id"] == 1)
        lines = []
        for target in panel["targets"]:
            got = series(target["expr"].replace("$__rate_interval", "3s"))
            lines.append({r["metric"]["model"]: dict(r["values"]) for r in got})
        ours, theirs = lines
        assert set(ours) == {"dense"} and "dense" in theirs, lines
        seconds = [t for t, v in ours["dense"].items() if float(v) > 0]
        area = sum(float(ours["dense"][t]) for t in seconds)
        their_area = sum(float(theirs["dense"].get(t, 0)) for t in seconds)
        print(f"areas: loadkit {area:.0f}, triton {their_area:.0f}, {len(seconds)} s")
        # Triton's counter restarts when a phase reloads the model (the rate around a reload
        # loses a scrape or two), and it counts warm-ups: 0.87-1.22 measured; a per-template
        # or per-inference line would be off by the mix or the batch, beyond these bounds
        assert len(seconds) >= 3 and 0.6 < area / their_area < 1.4, (area, their_area, lines)
    finally:
        prom.terminate()
        prom.wait(20)
