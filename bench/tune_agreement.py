"""Do two independent tune searches agree? (issue 39: "two independent searches agree, each
winner inside the other's ties, in most repetitions, at no more than 2x today's search time").

A grid whose best family is known: the dense model with a simulated device (each execute holds
it 4 ms whatever the batch), concurrency 8, `max_batch_size` x `instance_group.count` x queue
delay (12 configs): throughput is about instances x batch / 4 ms, so (4, 2) with either delay is
the best family. `loadkit tune --strategy brute` runs N times on one embedded Triton; every pair
of searches is checked (each winner's config equals the other's winner or one of its ties), and
each search's time is split into its trials and its racing (re-measures). Results:
bench/results/tune-agreement-<UTC>.json.

    .venv/bin/python bench/tune_agreement.py --searches 8
"""

from __future__ import annotations

import argparse
import itertools
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

SCENARIO = """
name: tune-agreement
requests:
  d: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256], data: random, seed: 7}}}
tune:
  config:
    dense:
      parameters: {device_us: "4000"}
      dynamic_batching: {max_queue_delay_microseconds: 0}
  models:
    dense:
      max_batch_size: [1, 2, 4]
      instance_group.count: [1, 2]
      dynamic_batching.max_queue_delay_microseconds: [0, 2000]
  load: {concurrency: 8, step_duration: 1.5s, warmup: 0.3s}
  objective: {maximize: throughput}
  constraints: {p99: 200ms, error_rate: 0.1%}
"""


def key(values: dict[str, object]) -> str:
    return json.dumps(values, sort_keys=True)


def search(address: str, tmp: Path, i: int) -> dict[str, object]:
    path = tmp / "tune.yaml"
    path.write_text(SCENARIO)
    out = tmp / f"s{i}"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "loadkit", "tune", str(path), "--target",
                           address, "--strategy", "brute", "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    t = json.loads((out / "results.json").read_text())["tune"]
    by = {x["trial"]: x for x in t["trials"]}
    return {"seconds": round(took, 1), "best": key(by[t["best"]]["values"]),
            "ties": [key(by[n]["values"]) for n in t.get("ties", [])],
            "recommended": key(by[t["recommended"]["trial"]]["values"])
            if t.get("recommended") else None,
            "trials": len([x for x in t["trials"] if not x.get("baseline")]),
            "raced": t.get("raced", []), "elapsed_s": t.get("elapsed_s")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--searches", type=int, default=8)
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedServer(models=("dense",)) as server:
        for i in range(args.searches):
            runs.append(search(server.grpc_address, Path(tmp), i))
            r = runs[-1]
            print(f"search {i + 1}: {r['seconds']} s, best {r['best']}, "
                  f"{len(r['ties'])} ties, raced {r['raced']}", flush=True)
    pairs = list(itertools.combinations(range(len(runs)), 2))

    def inside(a: dict[str, object], b: dict[str, object]) -> bool:
        return a["best"] == b["best"] or a["best"] in b["ties"]  # type: ignore[operator]

    agree = [p for p in pairs if inside(runs[p[0]], runs[p[1]]) and
             inside(runs[p[1]], runs[p[0]])]
    family = sum('"dense.instance_group.count": 2' in str(r["best"]) and
                 '"dense.max_batch_size": 4' in str(r["best"]) for r in runs)
    print(f"pairs that agree: {len(agree)} of {len(pairs)}; winners in the known best family "
          f"(batch 4, 2 instances): {family} of {len(runs)}; search time "
          f"{min(r['seconds'] for r in runs)}-{max(r['seconds'] for r in runs)} s")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest = ROOT / "bench" / "results" / f"tune-agreement-{stamp}.json"
    dest.write_text(json.dumps({"when": stamp, "runs": runs, "pairs": len(pairs),
                                "agree": len(agree), "best_family": family}, indent=1) + "\n")
    print(f"results: {dest}")


if __name__ == "__main__":
    main()
