"""Recorded traffic replayed against the real embedded Triton (docs/replay.md): a request
intervals file at speed 1 and 2, a rate profile, and a trace captured through Triton's trace
API (`loadkit trace`) of a known run, replayed at speed 1 and 2, its per-model, per-second
counts checked against the original's as Triton itself traced them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ROOT,
    assert_accounted,
    loadkit,
    prom_api,
    results,
    start_prometheus,
    wait_for,
    write,
)

TEMPLATES = """
requests:
  dense_b1: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
  add: {model: add_sub}  # inputs from the model's metadata
"""


def _run(tmp: Path, name: str, scenario: str, triton: Any) -> dict[str, Any]:
    scen = write(tmp / f"{name}.yaml", f"name: {name}\n{TEMPLATES}{scenario}")
    out = tmp / name
    proc = loadkit("run", str(scen), "--target", triton.grpc_address, "--out", str(out),
                   "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stderr
    return results(out)


def test_intervals_replay_at_speed_1_and_2(triton, tmp_path) -> None:
    """100/s for a second, 400/s for a second, 100/s for a second: every request of the file
    is scheduled once per step, and the shape holds at twice the speed in half the time."""
    gaps = ["10000"] * 100 + ["2500"] * 400 + ["10000"] * 100
    write(tmp_path / "gaps.txt", "\n".join(gaps) + "\n")
    data = _run(tmp_path, "gaps", """
mix: {dense_b1: 1}
phases:
  - name: replay
    load: {replay: gaps.txt, speed: [1, 2]}
""", triton)
    one, two = data["phases"][0]["steps"]
    for step, seconds in ((one, 3.0), (two, 1.5)):
        ol = step["open_loop"]
        assert ol["replay"]["in_window"] == 600 and ol["replay"]["format"] == "intervals"
        assert ol["scheduled"] == 600 and ol["sent"] + ol["dropped"] == 600, ol
        assert abs(step["duration_s"] - seconds) < 0.05 * seconds, step["duration_s"]
        assert_accounted(step)
        # the file's seconds beside the served ones: every scheduled request offered once,
        # every success served once, the burst where the file has it
        per = ol["replay"]["per_second"]
        assert sum(per["offered"]["dense_b1"]) == 600, per
        assert sum(per["served"]["dense_b1"]) == step["client"]["dense_b1"]["requests"], per
        assert per["peak_offered_per_s"] >= 400 * min(seconds / 3, 1) * 0.95, per
        assert 0 < ol["lateness_us"]["p50"] <= ol["lateness_us"]["p99"], ol["lateness_us"]
    offered = one["open_loop"]["replay"]["per_second"]["offered"]["dense_b1"]
    assert all(abs(a - b) <= 1 for a, b in zip(offered, (100, 400, 100), strict=True)), offered
    sent = [r["sent"] for r in one["timeline"]]
    assert abs(sent[0] - 100) <= 10 and abs(sent[1] - 400) <= 20 and abs(sent[2] - 100) <= 10
    sent2 = [r["sent"] for r in two["timeline"]]
    assert abs(sent2[0] - 500) <= 25 and abs(sent2[1] - 100) <= 10, sent2


def test_a_rate_profile_follows_its_points(triton, tmp_path) -> None:
    data = _run(tmp_path, "burst", """
mix: {dense_b1: 1}
phases:
  - name: burst
    load: {rate: {profile: [[0s, 100], [1s, 100], [1.001s, 400], [2s, 400], [2.001s, 100],
                            [3s, 100]]}}
""", triton)
    step = data["phases"][0]["steps"][0]
    sent = [r["sent"] for r in step["timeline"]]
    assert abs(sent[0] - 100) <= 10 and abs(sent[1] - 400) <= 20 and abs(sent[2] - 100) <= 10
    assert_accounted(step)


def _per_second(parts: list[Path]) -> dict[str, Counter[int]]:
    """Triton's own record of what it received: top-level traces per model per second (read
    here directly from the JSON, not with the reader under test)."""
    entries: dict[tuple[str, Any], dict[str, Any]] = {}
    for part in parts:
        for e in json.loads(part.read_text()):
            entry = entries.setdefault((part.name, e["id"]), {})
            entry.update({k: v for k, v in e.items() if k != "timestamps"})
            for t in e.get("timestamps", []):
                if t["name"] == "REQUEST_START":
                    entry["start"] = t["ns"]
    top = [e for e in entries.values() if not e.get("parent_id") and "start" in e]
    t0 = min(e["start"] for e in top)
    out: dict[str, Counter[int]] = {}
    for e in top:
        out.setdefault(e["model_name"], Counter())[int((e["start"] - t0) // 1_000_000_000)] += 1
    return out


def _trace_base(triton: Any) -> Path:
    """The session Triton's trace file (tests/conftest.py starts it with one)."""
    arg = next(a for a in triton.extra_args if "triton,file=" in a)
    return Path(arg.split("file=", 1)[1])


def _traced(triton: Any, run: Any) -> tuple[list[Path], dict[str, Counter[int]]]:
    """`loadkit trace` around `run()`, dense and add_sub traced: the parts it wrote (as it
    names them) and what they hold."""
    from loadkit.cli.trace import trace_parts

    before = set(trace_parts(_trace_base(triton)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadkit", "trace", "-u", triton.grpc_address, "--duration",
         "60s", "--models", "dense,add_sub"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        wait_for(lambda: "tracing" in proc.stderr.readline(), 30, "tracing to start")
        run()
    finally:
        proc.send_signal(2)  # Ctrl-C ends the capture early; the settings are put back
        out, err = proc.communicate(timeout=30)
    assert "trace settings put back" in out, err
    parts = [p for p in trace_parts(_trace_base(triton)) if p not in before]
    assert parts and ", ".join(p.name for p in parts) in out, out  # it names the new parts
    return parts, _per_second(parts)


def test_a_captured_trace_replays_per_model_per_second(triton, tmp_path) -> None:
    shape = "t,template,rate\n0,dense_b1,60\n2,dense_b1,240\n4,dense_b1,0\n0,add,100\n4,add,0\n"
    write(tmp_path / "shape.csv", shape)
    parts, original = _traced(triton, lambda: _run(
        tmp_path, "orig", "phases:\n  - {name: shape, load: {replay: shape.csv}}\n", triton))
    assert sum(original["dense"].values()) > 500 and sum(original["add_sub"].values()) > 300
    (tmp_path / "captured").mkdir()
    for part in parts:
        (tmp_path / "captured" / part.name).write_bytes(part.read_bytes())
    files = ", ".join(f"captured/{p.name}" for p in parts)
    replayed: dict[float, dict[str, Counter[int]]] = {}
    for speed in (1, 2):
        scen = ("phases:\n  - name: again\n    load: {replay: [" + files + "], speed: "
                f"{speed}, models: {{dense: dense_b1, add_sub: add}}}}\n")
        replayed[speed] = _traced(triton, lambda s=scen, n=f"again{speed}": _run(
            tmp_path, n, s, triton))[1]
    for model, counts in original.items():
        total = sum(counts.values())
        for speed, seen in replayed.items():
            assert sum(seen[model].values()) == total, (model, speed)  # every request, once
        # speed 1: the same count in every second (within a few at the seconds' edges)
        for sec, n in counts.items():
            assert abs(replayed[1][model][sec] - n) <= max(5, 0.05 * n), (model, sec)
        # speed 2: each second holds what two seconds of the original held
        for sec in range(max(counts) // 2 + 1):
            pair = counts[2 * sec] + counts[2 * sec + 1]
            assert abs(replayed[2][model][sec] - pair) <= max(8, 0.06 * pair), (model, sec)


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="no prometheus (make test installs Debian's package as root)")
def test_a_prometheus_export_replays_the_rate_it_recorded(triton, tmp_path) -> None:
    """A real Prometheus scrapes the embedded Triton during a known run (100/s, then 300/s);
    the range query most teams keep (requests/s per model) is exported as JSON and replayed:
    the replay sends what the export says, in its shape."""
    from loadkit.control.embedded import free_port

    prom, port = start_prometheus(tmp_path, triton, free_port())
    try:
        # rate() needs two scrapes: the known run starts once Prometheus has Triton's counter
        # twice (otherwise its first seconds are missing from the export, and with them the
        # quiet part before the burst)
        def scraped() -> bool:
            got = prom_api(port, "/api/v1/query", query='count_over_time('
                           'nv_inference_request_success{model="dense"}[10s])')
            return bool(got["data"]["result"]) and \
                float(got["data"]["result"][0]["value"][1]) >= 2

        wait_for(scraped, 30, "Prometheus to scrape Triton twice", poll=0.25)
        t0 = time.time()
        _run(tmp_path, "known", """
mix: {dense_b1: 1}
phases:
  - name: known
    load: {rate: {profile: [[0s, 100], [4s, 100], [4.01s, 300], [8s, 300]]}}
""", triton)
        query = "sum by (model) (rate(nv_inference_request_success{model=\"dense\"}[3s]))"

        # the 3 s rate window holds 300/s and 100/s seconds both near the burst's edges: two
        # samples above 200/s (a third of the way from 100 to 300) say the burst has arrived
        def export() -> dict[str, Any] | None:
            got = prom_api(port, "/api/v1/query_range", query=query, start=f"{t0:.3f}",
                           end=f"{time.time():.3f}", step="1")
            values = got["data"]["result"][0]["values"] if got["data"]["result"] else []
            return got if sum(float(v) > 200 for _, v in values) >= 2 else None

        doc = wait_for(export, 20, "the burst to reach Prometheus", poll=0.5)
    finally:
        prom.terminate()
        prom.wait(20)
    write(tmp_path / "export.json", json.dumps(doc))
    rates = [float(v) for _, v in doc["data"]["result"][0]["values"]]
    expected = sum(rates[:-1])  # each 1 s sample's rate holds until the next
    data = _run(tmp_path, "again", """
phases:
  - name: again
    load: {replay: export.json, models: {dense: dense_b1}}
""", triton)
    step = data["phases"][0]["steps"][0]
    ol = step["open_loop"]
    assert ol["replay"]["format"] == "prometheus" and ol["dropped"] == 0
    assert abs(ol["sent"] - expected) <= 0.1 * expected + 20, (ol["sent"], expected)
    sent = [r["sent"] for r in step["timeline"]]
    assert max(sent) > 2 * min(s for s in sent if s > 0), sent  # the burst is in it
    assert_accounted(step)
