"""Is a change slower? `make bench` (bench/run.py) at two commits, interleaved.

Each round runs bench/run.py once at each commit (B A, then A B: a drift through the session
falls on both alike), from a git worktree of each, on the same machine. A row's number is
loadkit's ratio to perf_analyzer measured beside it in the same pair (throughput, client CPU per
inference, p50, p99): perf_analyzer did not change, so the ratio cancels most of the machine's
drift between minutes, which moved raw throughput 0.66x-1.24x between pairs of one bench. The
table gives each commit's median ratio over its rounds and after / before.

    .venv/bin/python bench/commits.py --before 272d7a8 --after HEAD --rounds 3

Results: bench/results/commits-<UTC>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
METRICS = ("infer_s", "cpu_us_per_inference", "p50_us", "p99_us")


def worktree(rev: str, where: Path) -> Path:
    """A checkout of `rev` that shares this one's venv and perf_analyzer."""
    subprocess.run(["git", "worktree", "add", "--detach", str(where), rev], cwd=ROOT,
                   check=True, capture_output=True)
    (where / ".venv").symlink_to(ROOT / ".venv")
    (where / "bench" / ".tools").symlink_to(ROOT / "bench" / ".tools")
    return where


def bench(tree: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True)
    subprocess.run([sys.executable, "bench/run.py", "--levels", args.levels, "--rates",
                    args.rates, "--pairs", str(args.pairs), "--seconds", str(args.seconds),
                    "--dataset", "0", "--together", "", "--out", str(out)],
                   cwd=tree, check=True, timeout=1800,
                   env={**os.environ, "PYTHONPATH": str(tree)})  # this tree's loadkit
    (found,) = out.glob("*.json")
    return json.loads(found.read_text())


def ratios(run: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Per level and metric, loadkit / perf_analyzer for each pair."""
    out: dict[str, dict[str, list[float]]] = {}
    for level, row in run["levels"].items():
        for pair in row["pairs"]:
            a, b = pair["loadkit"], pair["perf_analyzer"]
            for m in METRICS:
                if a.get(m) and b.get(m):
                    out.setdefault(level, {}).setdefault(m, []).append(a[m] / b[m])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--rates", default="1000")
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    found: dict[str, dict[str, dict[str, list[float]]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {side: worktree(rev, Path(tmp) / side)
                 for side, rev in (("before", args.before), ("after", args.after))}
        try:
            for r in range(args.rounds):
                for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
                    run = bench(trees[side], args, Path(tmp) / f"out-{side}-{r}")
                    for level, per in ratios(run).items():
                        for m, xs in per.items():
                            found[side].setdefault(level, {}).setdefault(m, []).extend(xs)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                               capture_output=True)
    rows = []
    print("| level | metric | before (loadkit / perf_analyzer) | after | after / before |")
    print("|---|---|---:|---:|---:|")
    for level in found["before"]:
        for m in METRICS:
            b, a = found["before"][level].get(m), found["after"].get(level, {}).get(m)
            if not b or not a:
                continue
            mb, ma = statistics.median(b), statistics.median(a)
            rows.append({"level": level, "metric": m, "before": b, "after": a,
                         "change": round(ma / mb, 3)})
            print(f"| {level} | {m} | {mb:.3f} | {ma:.3f} | {ma / mb:.3f} |")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    (ROOT / "bench" / "results" / f"commits-{stamp}.json").write_text(json.dumps(
        {"before": args.before, "after": args.after, "rounds": args.rounds,
         "levels": args.levels, "rates": args.rates, "pairs": args.pairs,
         "seconds": args.seconds, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
