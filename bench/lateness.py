"""`python bench/lateness.py`: how late loadkit's open loop sends, rate by rate, on the
embedded Triton (issue 41: "the lateness of sends at a rate loadkit sustains is below 1 ms at
p99; say the limit where it breaks down"). Two servers: `dense` as it runs on this machine's
CPU (the server and the generator share the cores) and `dense` as an accelerator would run it
(each execute holds a "device" for 4 ms, CPU free, 16 instances), where the generator is the
only thing that can fall behind. Prints a table; the JSON goes to bench/results/lateness-*.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = """
name: lateness
requests:
  dense_b1:
    model: dense
    inputs: {{INPUT0: {{dtype: FP32, shape: [256], data: random, seed: 1}}}}
phases:
  - name: cpu
    load: {{rate: [{cpu}], step_duration: {s}s, warmup: 1s, max_concurrency: 256}}
  - name: device
    load: {{rate: [{device}], step_duration: {s}s, warmup: 1s, max_concurrency: 256}}
    config:
      dense:
        parameters: {{device_us: "4000"}}
        instance_group: [{{count: 16, kind: KIND_CPU}}]
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--cpu", default="250,500,1000,2000")
    ap.add_argument("--device", default="500,1000,2000,3000")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scen = Path(tmp) / "lateness.yaml"
        scen.write_text(SCENARIO.format(cpu=args.cpu, device=args.device, s=args.seconds))
        out = Path(tmp) / "out"
        proc = subprocess.run([sys.executable, "-m", "loadkit", "run", str(scen), "--out",
                               str(out), "--quiet"], capture_output=True, text=True,
                              timeout=900, cwd=ROOT)
        if proc.returncode not in (0, 1):  # 1: a threshold or the generator fell behind
            raise SystemExit(f"loadkit failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        data = json.loads((out / "results.json").read_text())
    rows = []
    for phase in data["phases"]:
        for step in phase["steps"]:
            ol = step["open_loop"]
            late = ol["lateness_us"]
            rows.append({"server": phase["name"], "rate": ol["rate"],
                         "achieved": ol["achieved_rate"], "dropped": ol["dropped"],
                         "late_over_5ms": ol["late"], "lateness_us": late,
                         "p99_ms": step["latency_us"]["p99"] / 1000,
                         "cpu_util": step["generator"]["cpu_util"]})
    print("| server | rate/s | achieved/s | dropped | lateness p50 / p99 / p99.9 (ms) | "
          "p99 latency (ms) | generator CPU |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for r in rows:
        late = r["lateness_us"]
        print(f"| {r['server']} | {r['rate']:g} | {r['achieved']:.0f} | {r['dropped']} | "
              f"{late['p50'] / 1000:.3f} / {late['p99'] / 1000:.3f} / "
              f"{late['p999'] / 1000:.3f} | {r['p99_ms']:.2f} | {r['cpu_util']:.2f} |")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest = ROOT / "bench" / "results" / f"lateness-{stamp}.json"
    dest.write_text(json.dumps({"when": stamp, "seconds": args.seconds, "rows": rows},
                               indent=1) + "\n")
    print(f"results: {dest}")


if __name__ == "__main__":
    main()
