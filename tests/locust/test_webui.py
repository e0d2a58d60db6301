"""The web UI as a person uses it: `loadkit ui`, headless Chromium clicks START, opens the Triton
tab, and the numbers it shows are the ones in results.json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, results, wait_for, write

from loadkit.report.units import ms

CHROMIUM = "/usr/bin/chromium"
SCENARIO = """
name: ui
requests:
  dense_b1:
    model: dense
    batch_size: 1
    inputs:
      INPUT0: {dtype: FP32, shape: [256], data: random, seed: 7}
phases:
  - name: baseline
    load: {concurrency: [1, 2], step_duration: 2s, warmup: 0.5s}
  - name: batching
    config:
      dense: {dynamic_batching: {max_queue_delay_microseconds: 200}}
    load: {concurrency: [2], step_duration: 2s, warmup: 0.5s}
"""


def url_target(out: Path) -> str:
    """The target `loadkit ui` was given (the fixture writes it beside the report folder)."""
    return (out.parent / "target").read_text()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


@pytest.fixture
def ui(triton, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed and could not be (make test installs it as root)")
    proc, url, out = _ui_process(triton, tmp_path, SCENARIO)
    yield url, out, tmp_path
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("loadkit ui did not exit within 30 s of SIGTERM")


def test_triton_tab_shows_the_numbers_of_results_json(ui) -> None:
    from playwright.sync_api import sync_playwright

    url, out, tmp = ui
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-background-networking"]
        )
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            page.goto(url + "/")
            # the form says what the run will do: its target and its most users (the phases
            # drive the load; Locust would show 0 users and ask for a Host)
            form = wait_for(lambda: (v := page.evaluate(
                "() => Object.fromEntries(Array.from(document.querySelectorAll('input'))"
                ".map(i => [i.name, i.value]))")).get("userCount") == "2" and v, 15,
                "the form to show the scenario's peak users", poll=0.2)
            assert form["host"] == "grpc://" + url_target(out)
            # Host shows the target and cannot change it: read-only, and a start that asks
            # for another host is refused with the reason (nothing sent elsewhere)
            wait_for(lambda: page.evaluate(
                "() => document.querySelector('input[name=host]').readOnly"), 15,
                "the Host field to be read-only")
            refused = page.evaluate(
                "async () => { const f = new FormData(); f.append('user_count', '1');"
                "f.append('spawn_rate', '1'); f.append('host', 'grpc://127.0.0.1');"
                "const r = await fetch('./swarm', {method: 'POST', body: f});"
                "return [r.status, await r.json()]; }")
            assert refused[0] == 400 and "the Host field cannot change it" in \
                refused[1]["message"], refused
            page.get_by_role("button", name="START").click()
            page.get_by_role("tab", name="Triton").click()
            page.locator("table tbody tr").first.wait_for(timeout=30_000)
            page.screenshot(path=str(tmp / "triton-tab-running.png"))
            wait_for(lambda: (out / "results.json").exists()
                     and results(out)["status"] == "complete", 90, "the run to complete")
            data = results(out)
            final = {(p["name"], str(s["index"] + 1)): str(s["requests"])
                     for p in data["phases"] for s in p["steps"]}

            def table() -> list[list[str]] | None:
                """The tab's rows once it shows every step's final count (it polls ~2 s)."""
                # one read of the whole table in the page: React re-renders it every ~2 s, and
                # cell-by-cell locators could wait on a row that a re-render just replaced
                rows = page.evaluate(
                    "() => Array.from(document.querySelectorAll('table tbody tr')).map("
                    "r => Array.from(r.querySelectorAll('td')).map(c => c.innerText.trim()))")
                shown = {(r[0], r[1]): r[4] for r in rows[1:] if len(r) > 10 and r[1]}
                return rows if all(shown.get(k) == v for k, v in final.items()) else None

            cells = wait_for(table, 30, "the Triton tab to show every step's final numbers",
                             poll=0.2)

            def chart() -> dict[str, Any] | None:
                """The tab's chart (charts.js), read in one go (it is redrawn every ~2 s), once
                it has one point per step for each line."""
                drawn = page.evaluate(
                    "() => { const svg = document.getElementById('loadkit-chart');"
                    " if (!svg) return null;"
                    " const q = s => Array.from(svg.querySelectorAll(s));"
                    " return {points: svg.getAttribute('data-points'),"
                    " thr: q('circle.loadkit-thr').length, phases: q('.loadkit-phase').length,"
                    " titles: q('circle.loadkit-p99 title').map(t => t.textContent)}; }")
                return drawn if drawn and drawn["points"] == "3" and drawn["thr"] == 3 else None

            drawn = wait_for(chart, 30, "the Triton tab's chart to draw every step", poll=0.2)
            phases_drawn, titles = drawn["phases"], drawn["titles"]
            page.screenshot(path=str(tmp / "triton-tab.png"), full_page=True)
            # the open page reaches STOPPED by itself (it stayed at CLEANUP until a reload)
            wait_for(lambda: "STOPPED" in page.evaluate(
                "() => document.querySelector('header').innerText").upper(), 15,
                "the open page to say STOPPED", poll=0.2)
            layout = page.evaluate(
                "() => ({width: document.documentElement.scrollWidth,"
                " heads: Array.from(document.querySelectorAll('table thead th'))"
                ".map(h => h.innerText.trim()),"
                " heights: Array.from(document.querySelectorAll('table tbody tr'))"
                ".map(r => r.offsetHeight),"
                " note: (document.getElementById('loadkit-note') || {}).innerText || ''})")
        finally:
            browser.close()
    assert (tmp / "triton-tab.png").stat().st_size > 10_000
    assert "phases drive the load" in layout["note"] and "warm-ups" in layout["note"]
    assert layout["width"] <= 1366, layout  # no sideways scrolling on a laptop screen
    assert not any("Tokens" in h or "First resp" in h for h in layout["heads"])  # no LLM here
    assert layout["heights"][0] <= 2 * min(layout["heights"]), layout["heights"]  # the (run) row
    shown = {(r[0], r[1]): r for r in cells[1:] if len(r) > 10 and r[1]}
    steps = [(p["name"], s) for p in data["phases"] for s in p["steps"]]
    assert len(steps) == 3
    for phase, s in steps:
        row = shown[(phase, str(s["index"] + 1))]
        lat = s["latency_us"]
        # requests | infer/s | mean | p50 | p90 | p95 | p99 | p99.9, as results.json has them
        assert row[4:12] == [str(s["requests"]), f"{s['throughput']:.1f}", ms(lat["mean"]),
                             ms(lat["p50"]), ms(lat["p90"]), ms(lat["p95"]), ms(lat["p99"]),
                             ms(lat["p999"])], row
        assert row[13] == f"{s['server']['dense']['avg_batch']:.2f}"
    assert phases_drawn == 2  # baseline and batching, each marked where it starts
    # the chart's p99 is the table's (HDR, ms with decimals)
    # (the table's cell itself: a p99 of 14.6395 ms was 14.64 in the table, 14.640 in the chart)
    assert titles == [f"{p} step {s['index'] + 1}: p99 {ms(s['latency_us']['p99'])} ms"
                      for p, s in steps], titles
    batching = shown[("batching", "1")]
    assert "dynamic_batching" in batching[-1] and "%" in batching[-2]
    # the HTML report is served from the UI once the run is over
    status, body = _get(url + "/loadkit/report")
    assert status == 200 and b"<html" in body.lower()
    live = json.loads(_get(url + "/loadkit/status")[1])
    assert live["status"] == "complete" and Path(live["out_dir"]) == out


SHORT = """
name: ui-short
requests:
  dense_b1: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
phases:
  - name: only
    load: {concurrency: [1, 2], step_duration: 1.5s, warmup: 0.2s}
"""


def _ui_process(triton: Any, tmp_path: Path, scenario: str) -> tuple[subprocess.Popen[str], str,
                                                                       Path]:
    """`loadkit ui` on the scenario, once its page answers: (process, URL, report folder)."""
    from loadkit.control.embedded import free_port

    port = free_port()
    out = tmp_path / "report"
    write(tmp_path / "target", triton.grpc_address)
    scen = write(tmp_path / "ui.yaml", scenario)
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadkit", "ui", str(scen), "--target", triton.grpc_address,
         "--web-port", str(port), "--out", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return _get(url + "/")[0] == 200
        except OSError:
            return False

    wait_for(up, 60, "the web UI")
    return proc, url, out


def _swarm(url: str) -> None:
    req = urllib.request.Request(url + "/swarm", data=b"user_count=1&spawn_rate=1",
                                 method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert json.loads(r.read())["success"]


@pytest.mark.parametrize("when", ["idle", "running", "finished"])
def test_ctrl_c_ends_loadkit_ui_at_any_point(triton, tmp_path, when) -> None:
    """SIGINT before a run, during one and after one ends `loadkit ui` (Locust, the run and
    its configs) within seconds; what it prints at the end is loadkit's HDR summary, not
    Locust's whole-millisecond tables."""
    proc, url, out = _ui_process(triton, tmp_path, SHORT)
    try:
        if when != "idle":
            _swarm(url)
            if when == "running":
                wait_for(lambda: (out / "results.json").exists() and results(out)["phases"],
                         60, "the first phase to start")
            else:
                wait_for(lambda: (out / "results.json").exists()
                         and results(out)["status"] == "complete", 90, "the run to finish")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            pytest.fail("loadkit ui did not exit within 30 s of SIGINT")
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "Response time percentiles" not in stdout + stderr
    # a Ctrl-C is called one (loadkit takes Locust's SIGTERM path, which Locust would name)
    assert "Got SIGTERM" not in stderr and "Ctrl-C" in stderr
    assert "spawn rate is very high" not in stderr
    if when == "idle":
        assert proc.returncode == 0
        return
    data = results(out)
    assert "Latencies in ms from HDR histograms" in stdout
    if when == "running":
        assert proc.returncode == 130 and data["status"] == "interrupted", data["status"]
    else:
        assert proc.returncode == 0 and data["status"] == "complete"
