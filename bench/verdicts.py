"""Do the verdicts hold? Repeated experiments on the embedded Triton (docs/verdicts.md), each
two phases of one run, the second against the first:

- A/A sleep: the identical config on a sleep-bound model (dense with a simulated device: each
  execute sleeps `device_us`), concurrency 2;
- A/A dense: the identical config on the CPU-bound dense matmul (no simulated device),
  concurrency 8: client and server share the cores, the noisiest case this machine has;
- 10% sleep: each request 10% longer (device_us 2000 -> 2250: a request costs ~2.47 ms at
  2000, the python backend's own ~0.47 ms included, so +250 µs is +10%): `worse` expected;
- 1.5x sleep: the execute 1.5x longer (2000 -> 3000): `worse` expected.

Modes: `default` (one round: within-run intervals), `auto` (`repeats: auto`, at most
--max-repeats rounds and --max-time per pair), `N` (`repeats: N`). Every verdict is kept with
its delta, interval, rounds and whether a `same` lay inside ±threshold. Results:
bench/results/verdicts-<UTC>.json and a Markdown table on stdout.

    .venv/bin/python bench/verdicts.py --reps 20 --mode auto --mode default
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
{repeats}
requests:
  d: {{model: dense, inputs: {{INPUT0: {{dtype: FP32, shape: [256]}}}}}}
phases:
  - name: a
    load: {{concurrency: {c}, step_duration: {seconds}s, warmup: 0.5s}}
    config: {{dense: {{parameters: {{device_us: "{a}"}}}}}}
  - name: b
    load: {{concurrency: {c}, step_duration: {seconds}s, warmup: 0.5s}}
    config: {{dense: {{parameters: {{device_us: "{b}"}}}}}}
"""
# (concurrency, device_us of a, of b, the word a right answer has for throughput)
EXPERIMENTS = {"A/A sleep": (2, 2000, 2000, "same"), "A/A dense": (8, 0, 0, "same"),
               "10% sleep": (2, 2000, 2250, "worse"), "1.5x sleep": (2, 2000, 3000, "worse")}
METRICS = ("throughput", "p50", "p99")


def repeats_keys(mode: str, max_repeats: int, max_time: str) -> str:
    if mode == "default":
        return ""
    if mode == "auto":
        return f"repeats: auto\nmax_repeats: {max_repeats}\nmax_time: {max_time}"
    return f"repeats: {int(mode)}"


def once(address: str, exp: tuple[int, int, int, str], mode: str, args: argparse.Namespace
         ) -> dict:
    c, a, b, _ = exp
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.yaml"
        path.write_text(SCENARIO.format(
            repeats=repeats_keys(mode, args.max_repeats, args.max_time), c=c,
            seconds=args.seconds, a=a, b=b))
        out = Path(tmp) / "r"
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "loadkit", "run", str(path), "--target",
                               address, "--out", str(out), "--quiet"], capture_output=True,
                              text=True, timeout=900, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        data = json.loads((out / "results.json").read_text())
    got: dict = {"rounds": data.get("repeats", 1), "elapsed_s": round(time.monotonic() - t0, 1),
                 "stopped": (data.get("sequential") or {}).get("stopped", "")}
    for cmp in data["comparisons"]:
        if cmp.get("template"):
            continue
        ci, band = cmp["ci_pct"], cmp.get("noise_pct", 5.0)
        got[cmp["metric"]] = {"verdict": cmp["verdict"], "delta": cmp["delta_pct"], "ci": ci,
                              "width": None if ci is None else round(ci[1] - ci[0], 1),
                              "inside": None if ci is None else -band <= ci[0] and ci[1] <= band,
                              "rounds_needed": cmp.get("rounds_needed")}
    return got


def table(found: dict[str, dict[str, list[dict]]]) -> list[str]:
    lines = ["| mode | experiment | metric | better | same | worse | inconclusive | unknown | "
             "median delta | median width | same inside ±5% | median rounds | median s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, by in found.items():
        for name, runs in by.items():
            for metric in METRICS:
                rows = [r[metric] for r in runs if metric in r]
                n = Counter(x["verdict"] for x in rows)

                def med(xs: list) -> str:
                    xs = sorted(x for x in xs if x is not None)
                    return f"{xs[len(xs) // 2]:g}" if xs else "-"
                same = [x for x in rows if x["verdict"] == "same"]
                lines.append(
                    f"| {mode} | {name} | {metric} | {n['better']} | {n['same']} | "
                    f"{n['worse']} | {n['inconclusive']} | {n['unknown']} | "
                    f"{med([x['delta'] for x in rows])}% | {med([x['width'] for x in rows])} | "
                    f"{sum(bool(x['inside']) for x in same)}/{len(same)} | "
                    f"{med([r['rounds'] for r in runs])} | {med([r['elapsed_s'] for r in runs])} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--mode", action="append", help="default, auto or a number of repeats "
                                                    "(repeatable; default: default and auto)")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--max-repeats", type=int, default=10)
    ap.add_argument("--max-time", default="3m")
    ap.add_argument("--only", action="append", choices=list(EXPERIMENTS),
                    help="run only this experiment (repeatable; default: all)")
    args = ap.parse_args()
    modes = args.mode or ["default", "auto"]
    chosen = {n: e for n, e in EXPERIMENTS.items() if not args.only or n in args.only}
    found: dict[str, dict[str, list[dict]]] = {m: {n: [] for n in chosen} for m in modes}
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = ROOT / "bench" / "results" / f"verdicts-{stamp}.json"
    t0 = time.monotonic()
    with EmbeddedServer(models=("dense",)) as server:
        for _ in range(args.reps):  # experiments and modes interleaved, as loadkit's rounds are
            for mode in modes:
                for name, exp in chosen.items():
                    found[mode][name].append(once(server.grpc_address, exp, mode, args))
            path.write_text(json.dumps(  # after every repetition: a long bench keeps its part
                {"reps": args.reps, "modes": modes, "seconds": args.seconds,
                 "max_repeats": args.max_repeats, "max_time": args.max_time,
                 "experiments": {n: list(e) for n, e in chosen.items()},
                 "elapsed_s": round(time.monotonic() - t0), "found": found}, indent=1) + "\n")
    print("\n".join([f"# Verdicts, {stamp}: {args.reps} repetitions, {args.seconds:g} s steps "
                     "(bench/verdicts.py)", "", *table(found)]))


if __name__ == "__main__":
    main()
