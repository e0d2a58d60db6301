"""Do capacity answers reproduce? `loadkit capacity --replay` on a bursty 30 s trace loadkit's
tests never saw (a Triton trace: 20/s with a 2 s spike of 100/s in the middle, `dense`), SLO
p99 < 25 ms, peak 3x, run N times identically on one embedded Triton (docs/capacity.md). Each
run's answer (the highest speed that held) and its interval are kept; the bench says whether
every pair of intervals overlaps and whether each interval holds the others' answers.

    .venv/bin/python bench/capacity_repro.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadkit.control.embedded import EmbeddedServer  # noqa: E402


def trace(path: Path, seconds: float = 30.0) -> int:
    """A trace as Triton writes one (level=TIMESTAMPS): 20/s, and 100/s from 14 s to 16 s."""
    starts, t = [], 0.0
    while t < seconds:
        starts.append(t)
        t += 0.01 if 14.0 <= t < 16.0 else 0.05
    entries = []
    for i, s in enumerate(starts, 1):
        entries += [{"id": i, "model_name": "dense", "model_version": 1},
                    {"id": i, "timestamps": [{"name": "REQUEST_START",
                                              "ns": 10**12 + int(s * 1e9)}]}]
    path.write_text(json.dumps(entries))
    return len(starts)


def once(address: str, file: Path, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r"
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "loadkit", "capacity", "--replay", str(file), "--slo",
               args.slo, "--peak", "3x", "--repeats", args.repeats, "--start-rate",
               args.start, "--budget", str(args.budget), "--target", address, "--out",
               str(out), "--quiet"]
        if args.repeats == "auto":
            cmd += ["--max-repeats", str(args.max_repeats)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.budget + 600,
                              cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        phase = json.loads((out / "results.json").read_text())["capacity"]["phases"][0]
    return {"max_speed": phase["max_speed"], "interval_speed": phase.get("interval_speed"),
            "bracket": phase["bracket"], "status": phase["status"],
            "note": phase.get("interval_note"), "elapsed_s": round(time.monotonic() - t0),
            "probes": [{k: p[k] for k in ("rate", "kind", "passed", "outcome", "rounds",
                                          "limited_by")} for p in phase["points"]]}


def verdict(runs: list[dict]) -> dict:
    """Whether every pair of intervals overlaps, and each holds the others' answers (an open
    end reaches as far as it goes)."""
    def span(r: dict) -> tuple[float, float]:
        lo, hi = r["interval_speed"] or [None, None]
        return (lo if lo is not None else 0.0, hi if hi is not None else float("inf"))
    spans = [span(r) for r in runs]
    overlap = all(a[0] <= b[1] and b[0] <= a[1] for a in spans for b in spans)
    holds = all(s[0] <= r["max_speed"] <= s[1] for s in spans for r in runs
                if r["max_speed"] is not None)
    return {"intervals_overlap": overlap, "each_holds_the_others_answers": holds,
            "answers": [r["max_speed"] for r in runs], "intervals": [list(s) for s in spans]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--slo", default="p99<25ms")
    ap.add_argument("--repeats", default="auto")
    ap.add_argument("--max-repeats", type=int, default=5)
    ap.add_argument("--start", default="4x", help="the first speed (--start-rate)")
    ap.add_argument("--budget", type=int, default=900)
    args = ap.parse_args()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = ROOT / "bench" / "results" / f"capacity-repro-{stamp}.json"
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedServer(models=("dense",)) as server:
        file = Path(tmp) / "bursty.json"
        n = trace(file)
        for _ in range(args.runs):
            runs.append(once(server.grpc_address, file, args))
            path.write_text(json.dumps({"args": vars(args), "requests_in_trace": n,
                                        "runs": runs, **verdict(runs)}, indent=1) + "\n")
    print(json.dumps(verdict(runs), indent=1))


if __name__ == "__main__":
    main()
