"""Soak (make soak; excluded by default): 10 minutes at a steady open-loop rate. The generator's
memory stays flat (RSS per step in results.json) and every request stays accounted for.
LOADKIT_SOAK_S shortens it for a try-out."""

from __future__ import annotations

import os

import pytest
from conftest import loadkit, results, write

SOAK_S = float(os.environ.get("LOADKIT_SOAK_S", "600"))
STEPS = 20


@pytest.mark.soak
@pytest.mark.timeout(SOAK_S * 2 + 300)
def test_soak_memory_flat_and_accounting_exact(triton, tmp_path) -> None:
    step_s = SOAK_S / STEPS
    scen = write(tmp_path / "soak.yaml", f"""
name: soak
requests:
  dense_b1:
    model: dense
    inputs:
      INPUT0: {{dtype: FP32, shape: [256], data: random}}
phases:
  - name: steady
    load: {{rate: [{", ".join(["300"] * STEPS)}], arrival: poisson, max_concurrency: 64,
            step_duration: {step_s:g}s, warmup: 0s}}
""")
    out = tmp_path / "r"
    proc = loadkit("run", str(scen), "--target", triton.grpc_address, "--out", str(out),
                   "--quiet", timeout=SOAK_S * 2 + 120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = results(out)["phases"][0]["steps"]
    assert len(steps) == STEPS
    rss = [s["generator"]["rss_mb"] for s in steps]
    print("RSS MB per step:", rss)
    for s in steps:
        assert s["status"] == "ok" and not s["errors"]
        assert s["server"]["dense"]["success"] == s["requests"] > 0
        assert s["open_loop"]["dropped"] == 0
    # flat: after the first quarter (warm caches, histograms allocated), growth under 10 MB
    settled = rss[STEPS // 4:]
    assert max(settled) - settled[0] < 10, rss
