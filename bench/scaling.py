"""`make bench-scaling`: loadkit with 1 and N worker processes (Locust master + workers) on the
embedded Triton, closed loop at a fixed concurrency per worker and open loop at a fixed total
rate. Reports throughput, the generator's CPU per request (all workers together) and, for the
open loop, how close the aggregate rate came to the target. Results: bench/results/scaling-*.json.

On a machine where the server and the workers share the same few cores, the CPU-bound dense
model saturates first, so its throughput cannot grow N-fold there. The third phase is a server
that is not saturated: the dense model as an accelerator would run it (`device_us`: each execute
holds a "device" for 4 ms, CPU free) in 16 instances, so up to 16 requests are served at once
and each user can send ~250/s; there throughput must grow close to N-fold with N workers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = """
name: scaling
requests:
  dense_b1:
    model: dense
    inputs: {{INPUT0: {{dtype: FP32, shape: [256], data: random, seed: 1}}}}
phases:
  - name: closed
    load: {{concurrency: {c}, step_duration: {s}s, warmup: 1s}}
  - name: open
    load: {{rate: {rate}, step_duration: {s}s, warmup: 1s}}
  - name: unsaturated
    load: {{concurrency: {c}, step_duration: {s}s, warmup: 1s}}
    config:
      dense:
        parameters: {{device_us: "4000"}}
        instance_group: [{{count: 16, kind: KIND_CPU}}]
"""


def run(address: str, workers: int, per_worker: int, rate: float, seconds: float,
        work: Path) -> dict[str, Any]:
    scen = work / f"w{workers}.yaml"
    scen.write_text(SCENARIO.format(c=per_worker * workers, rate=rate, s=seconds))
    out = work / f"w{workers}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "loadkit", "run", str(scen), "--target", address, "--out",
           str(out), "--quiet"]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 4 + 180)
    if proc.returncode != 0:
        raise SystemExit(f"loadkit failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    data = json.loads((out / "results.json").read_text())
    closed, open_, free = (p["steps"][0] for p in data["phases"])
    for step in (closed, open_, free):
        if step["server"]["dense"]["success"] != step["requests"]:
            raise SystemExit("accounting broke")
    ol = open_["open_loop"]
    return {
        "workers": workers,
        "closed_concurrency": per_worker * workers,
        "closed_infer_s": closed["throughput"],
        "closed_cpu_us_per_request": closed["generator"]["cpu_us_per_request"],
        "closed_p99_us": closed["latency_us"]["p99"],
        "open_rate": rate,
        "open_sent_per_s": round(ol["sent"] / open_["duration_s"], 1),
        "open_rate_error_pct": round((ol["sent"] / seconds - rate) / rate * 100, 2),
        "open_cpu_us_per_request": open_["generator"]["cpu_us_per_request"],
        "unsaturated_infer_s": free["throughput"],
        "unsaturated_cpu_us_per_request": free["generator"]["cpu_us_per_request"],
        "unsaturated_p50_us": free["latency_us"]["p50"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--per-worker", type=int, default=4, help="closed-loop users per worker")
    ap.add_argument("--rate", type=float, default=1000.0, help="open-loop total rate")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    from loadkit.control.embedded import EmbeddedServer

    server = EmbeddedServer(models=("dense",)).start()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in (int(x) for x in args.workers.split(",")):
                rows.append(run(server.grpc_address, n, args.per_worker, args.rate,
                                args.seconds, Path(tmp)))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        server.stop()
    base = rows[0]
    print("| workers | concurrency | CPU-bound infer/s | vs 1 | CPU µs/request | p99 ms | "
          "unsaturated infer/s | vs 1 | open loop sent/s (target) | rate error |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['workers']} | {r['closed_concurrency']} | {r['closed_infer_s']:.0f} | "
              f"{r['closed_infer_s'] / base['closed_infer_s']:.2f}x | "
              f"{r['closed_cpu_us_per_request']} | {r['closed_p99_us'] / 1000:.2f} | "
              f"{r['unsaturated_infer_s']:.0f} | "
              f"{r['unsaturated_infer_s'] / base['unsaturated_infer_s']:.2f}x | "
              f"{r['open_sent_per_s']} ({r['open_rate']:g}) | {r['open_rate_error_pct']}% |")
    report = {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "cpus": os.cpu_count(), "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"scaling-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwritten: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
