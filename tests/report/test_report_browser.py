"""report.html as a reader opens it, in headless Chromium: a `repeats: 3` run of two phases
draws each round where it ran (a b, b a, a b), never the rounds of a step end to end; and a
report re-rendered without its histograms says why its spectrum is not drawn."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import loadkit, results, write

CHROMIUM = "/usr/bin/chromium"
SCENARIO = """
name: rounds
repeats: 3
requests:
  d: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
phases:
  - name: a
    load: {concurrency: 2, step_duration: 1.5s, warmup: 0.2s}
    config: {dense: {parameters: {device_us: "2000"}}}
  - name: b
    load: {concurrency: 2, step_duration: 1.5s, warmup: 0.2s}
    config: {dense: {parameters: {device_us: "1000"}}}
"""


def _read(page_url: str) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox", "--disable-background-networking"])
        try:
            page = browser.new_page()
            page.goto(page_url)
            return page.evaluate(
                "() => ({timeline: JSON.parse(document.getElementById('loadkit-timeline')"
                ".textContent), images: Array.from(document.images).map(i => [i.alt, "
                "i.naturalWidth]), notes: Array.from(document.querySelectorAll('p.muted'))"
                ".map(p => p.innerText)})")
        finally:
            browser.close()


def test_rounds_are_drawn_at_their_times(triton, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed and could not be (make test installs it)")
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "s.yaml", SCENARIO)), "--target",
                   triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = _read((out / "report.html").as_uri())
    rows = seen["timeline"]
    assert [r["at"] for r in rows] == sorted(r["at"] for r in rows)
    # each (phase, round) is one stretch of time; the stretches follow the run's order
    spans: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        spans.setdefault((r["phase"], r["round"]), []).append(r["at"])
    assert set(spans) == {(p, k) for p in "ab" for k in (1, 2, 3)}, spans
    order = sorted(spans, key=lambda k: min(spans[k]))
    assert order == [("a", 1), ("b", 1), ("b", 2), ("a", 2), ("a", 3), ("b", 3)], order
    for first, second in zip(order, order[1:], strict=False):
        assert max(spans[first]) < min(spans[second]), (first, second, spans)
    # each round's seconds match its own start in results.json (not the pool's end to end)
    data = results(out)
    for p in data["phases"]:
        (step,) = p["steps"]
        starts = [r["started_at"] for r in step["rounds"]]
        assert len(set(starts)) == 3
    assert dict(seen["images"]).get("timeline.png", 0) > 100
    # the report folder without its histograms: the spectrum is not drawn, and it says why
    (out / "histograms.json").unlink()
    again = loadkit("report", str(out))
    assert again.returncode == 0, again.stderr
    seen = _read((out / "report.html").as_uri())
    assert "latency_spectrum.png" not in dict(seen["images"])
    assert any("latency_spectrum.png is not drawn: no HDR histograms" in n
               for n in seen["notes"]), seen["notes"]
