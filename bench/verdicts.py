"""Do the verdicts hold? Repeated experiments on the embedded Triton (docs/verdicts.md):

- A/A: two phases with the identical config, `repeats: 3`: how often `same` (throughput, p99);
- A/B 1.5x: a config whose execute is 1.5x shorter: how often `better`;
- A/B 10%: one 10% shorter: how often `better`.

The dense model at concurrency 1 with a simulated device (`device_us`: a sleep per execute), so
the size of the change is known. Results: bench/results/verdicts-<UTC>.json and a Markdown table
in bench/results/verdicts.md.

    .venv/bin/python bench/verdicts.py --reps 20
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadkit.control.embedded import EmbeddedServer  # noqa: E402

SCENARIO = """
name: verdict-bench
repeats: {repeats}
requests:
  d: {{model: dense, inputs: {{INPUT0: {{dtype: FP32, shape: [256]}}}}}}
phases:
  - name: a
    load: {{concurrency: 1, step_duration: {seconds}s, warmup: 0.5s}}
    config: {{dense: {{parameters: {{device_us: "{a}"}}}}}}
  - name: b
    load: {{concurrency: 1, step_duration: {seconds}s, warmup: 0.5s}}
    config: {{dense: {{parameters: {{device_us: "{b}"}}}}}}
"""
# device_us pairs: the execute's sleep; ~0.2 ms of python backend work comes on top
EXPERIMENTS = {"A/A": (2000, 2000), "A/B 1.5x": (3000, 1850), "A/B 10%": (2000, 1800)}


def once(address: str, a: int, b: int, repeats: int, seconds: float) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.yaml"
        path.write_text(SCENARIO.format(repeats=repeats, seconds=seconds, a=a, b=b))
        out = Path(tmp) / "r"
        proc = subprocess.run([sys.executable, "-m", "loadkit", "run", str(path), "--target",
                               address, "--out", str(out), "--quiet"], capture_output=True,
                              text=True, timeout=600, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        data = json.loads((out / "results.json").read_text())
    return {c["metric"]: c["verdict"] for c in data["comparisons"]} | {
        f"{c['metric']}_delta": c["delta_pct"] for c in data["comparisons"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--only", action="append", choices=list(EXPERIMENTS),
                    help="run only this experiment (repeatable; default: all)")
    args = ap.parse_args()
    chosen = {n: ab for n, ab in EXPERIMENTS.items() if not args.only or n in args.only}
    found: dict[str, list[dict[str, str]]] = {name: [] for name in chosen}
    t0 = time.monotonic()
    with EmbeddedServer(models=("dense",)) as server:
        for _ in range(args.reps):  # the experiments interleaved, as loadkit's rounds are
            for name, (a, b) in chosen.items():
                found[name].append(once(server.grpc_address, a, b, args.repeats, args.seconds))
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = ROOT / "bench" / "results"
    (out / f"verdicts-{stamp}.json").write_text(json.dumps(
        {"reps": args.reps, "repeats": args.repeats, "seconds": args.seconds,
         "elapsed_s": round(time.monotonic() - t0), "experiments": found}, indent=1) + "\n")
    lines = [f"# Verdicts, {stamp}: {args.reps} repetitions, repeats {args.repeats}, "
             f"{args.seconds:g} s steps, concurrency 1 (bench/verdicts.py)", "",
             "| experiment | metric | better | same | worse | unknown | median delta |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, runs in found.items():
        for metric in ("throughput", "p99"):
            n = Counter(r.get(metric, "unknown") for r in runs)
            deltas = sorted(r[f"{metric}_delta"] for r in runs if f"{metric}_delta" in r)
            med = f"{deltas[len(deltas) // 2]:+.1f}%" if deltas else "-"
            lines.append(f"| {name} | {metric} | {n['better']} | {n['same']} | {n['worse']} | "
                         f"{n['unknown']} | {med} |")
    (out / "verdicts.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
