"""`make bench-doors`: loadkit and perf_analyzer through each of Triton's doors, side by side on
one embedded Triton: gRPC (loadkit's stream vs `perf_analyzer --streaming`) and HTTP/REST
(loadkit's binary tensors vs `perf_analyzer -i http`, binary by default), and each with
system shared memory (`shared_memory: system` vs `--shared-memory system`), on `dense` at
concurrency 8 and `image_large` (602 KB per request) at concurrency 4.

Each pair runs the four clients one after another in a rotated order (the machine's speed
drifts between minutes; docs/performance.md). Client CPU per inference is the client's
user+sys time over what the server says it served: loadkit's per-step `generator.cpu_s`,
perf_analyzer's whole-process rusage (its start-up included, which favours loadkit). Results
go to bench/results/doors-<UTC time>.json.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import PERF_ANALYZER, STABILITY_WINDOWS, TOOLS, perf_analyzer_csv, spread  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CASES = {  # model -> (input, shape, concurrency)
    "dense": ("INPUT0", [256], 8),
    "image_large": ("image", [3, 224, 224], 4),
}
SCENARIO = """
name: doors
target: {{shared: false, shared_memory: {shm}}}
requests:
  r:
    model: {model}
    inputs: {{{input}: {{dtype: FP32, shape: {shape}, data: random, seed: 1}}}}
phases:
  - name: bench
    load: {{concurrency: {level}, step_duration: {seconds}s, warmup: 2s}}
"""


def run_loadkit(address: str, model: str, seconds: float, work: Path,
                shm: str = "none") -> dict[str, Any]:
    name, shape, level = CASES[model]
    scen = work / "doors.yaml"
    scen.write_text(SCENARIO.format(model=model, input=name, shape=shape, level=level,
                                    seconds=seconds, shm=shm))
    out = work / f"lk-{time.monotonic_ns()}"
    proc = subprocess.run([sys.executable, "-m", "loadkit", "run", str(scen), "--target",
                           address, "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=seconds + 120)
    if proc.returncode != 0:
        raise SystemExit(f"loadkit failed ({proc.returncode}): {proc.stderr[-2000:]}")
    step = json.loads((out / "results.json").read_text())["phases"][0]["steps"][0]
    served = step["server"][model]["success"]
    if served != step["requests"]:
        raise SystemExit(f"accounting broke: client {step['requests']} != server {served}")
    return {"infer_s": step["throughput"],
            "cpu_us_per_inference": round(step["generator"]["cpu_s"] / served * 1e6, 1),
            "p50_us": step["latency_us"]["p50"], "p99_us": step["latency_us"]["p99"],
            "own_us": step["generator"].get("own_us_per_request"), "served": served}


def run_perf_analyzer(address: str, protocol: str, model: str, seconds: float, work: Path,
                      control: Any, shm: str = "none") -> dict[str, Any] | None:
    name, shape, level = CASES[model]
    for stability in (25, 50):
        csv_path = work / f"pa-{time.monotonic_ns()}.csv"
        before = control.counters((model,))[model].success
        proc = subprocess.Popen(
            [str(PERF_ANALYZER), "-m", model, "-i", protocol, "-u", address,
             "--concurrency-range", f"{level}:{level}",
             "--measurement-interval", str(int(seconds * 1000)), "--max-trials", "10",
             "--stability-percentage", str(stability),
             "--shape", f"{name}:{','.join(map(str, shape))}", "-f", str(csv_path),
             *(["--streaming"] if protocol == "grpc" else []),
             *(["--shared-memory", shm, "--output-shared-memory-size", "102400"]
               if shm != "none" else [])],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "LD_LIBRARY_PATH": str(TOOLS / "lib")})
        _, status, usage = os.wait4(proc.pid, 0)
        output = proc.stdout.read() if proc.stdout else ""
        if os.waitstatus_to_exitcode(status) != 0:
            if "stable measurement" in output:
                continue
            raise SystemExit(f"perf_analyzer failed: {output[-2000:]}")
        served = control.counters((model,))[model].success - before
        return {**perf_analyzer_csv(csv_path), "served": served,
                "cpu_us_per_inference": round((usage.ru_utime + usage.ru_stime) / served * 1e6, 1)}
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0,
                    help="perf_analyzer's window; loadkit measures 3x this")
    ap.add_argument("--models", default="dense,image_large")
    ap.add_argument("--doors", default="grpc,http,grpc+shm",
                    help="grpc, http, and each with +shm (system shared memory)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    if not PERF_ANALYZER.is_file():
        print(f"{PERF_ANALYZER} missing: run bench/setup_perf_analyzer.sh", file=sys.stderr)
        return 2
    from loadkit.control.client import ServerControl
    from loadkit.control.embedded import EmbeddedServer

    models = [m for m in args.models.split(",") if m]
    server = EmbeddedServer(models=tuple(models)).start()
    control = ServerControl(server.grpc_address)
    doors = [d for d in args.doors.split(",") if d]
    clients = [(c, d) for d in doors for c in ("loadkit", "perf_analyzer")]
    report: dict[str, Any] = {
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(), "pairs": args.pairs, "seconds": args.seconds,
        "cases": {m: {"concurrency": CASES[m][2], "input_bytes": 4 * _size(CASES[m][1])}
                  for m in models}, "runs": {}}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            for model in models:
                runs: dict[str, list[dict[str, Any]]] = {f"{c}/{p}": [] for c, p in clients}
                for i in range(args.pairs):
                    turn = i % len(clients)
                    order = clients[turn:] + clients[:turn]  # rotated: drift spreads evenly
                    for client, door in order:
                        protocol, _, shm = door.partition("+")
                        shm = "system" if shm else "none"
                        address = (server.grpc_address if protocol == "grpc"
                                   else server.http_address)
                        if client == "loadkit":
                            got: dict[str, Any] | None = run_loadkit(
                                address if protocol == "grpc" else f"http://{address}", model,
                                args.seconds * STABILITY_WINDOWS, work, shm)
                        else:
                            got = run_perf_analyzer(address, protocol, model, args.seconds,
                                                    work, control, shm)
                        if got is not None:
                            runs[f"{client}/{door}"].append(got)
                            print(f"{model} {client}/{door}: {got['infer_s']:.0f}/s, "
                                  f"{got['cpu_us_per_inference']} us cpu", file=sys.stderr,
                                  flush=True)
                report["runs"][model] = runs
    finally:
        control.close()
        server.stop()
    report["ratios"] = ratios(report["runs"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"doors-{stamp}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(f"\nwritten: {path}", file=sys.stderr)
    return 0


def _size(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def ratios(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per model and door: loadkit / perf_analyzer, medians with their spread."""
    out: dict[str, Any] = {}
    for model, by in runs.items():
        for door in sorted({k.split("/", 1)[1] for k in by}):
            lk, pa = by.get(f"loadkit/{door}", []), by.get(f"perf_analyzer/{door}", [])
            if lk and pa:
                out[f"{model}/{door}"] = {
                    k: spread([a[k] / b[k] for a, b in zip(lk, pa, strict=False)])
                    for k in ("infer_s", "cpu_us_per_inference", "p50_us", "p99_us")}
    return out


def table(report: dict[str, Any]) -> str:
    lines = ["| model | door | client | infer/s (median) | client CPU µs/inference | p50 µs | "
             "p99 µs |", "|---|---|---|---:|---:|---:|---:|"]
    for model, by in report["runs"].items():
        for key, rows in by.items():
            if not rows:
                continue
            client, door = key.split("/", 1)

            def med(k: str, rows: list[dict[str, Any]] = rows) -> float:
                return sorted(r[k] for r in rows)[len(rows) // 2]

            lines.append(f"| {model} | {door} | {client} | {med('infer_s'):.0f} | "
                         f"{med('cpu_us_per_inference'):.0f} | {med('p50_us'):.0f} | "
                         f"{med('p99_us'):.0f} |")
    lines += ["", "| model/door | loadkit/perf_analyzer infer/s | CPU/inference |",
              "|---|---:|---:|"]
    for key, r in report["ratios"].items():
        lines.append(f"| {key} | {r['infer_s']['median']:.2f} | "
                     f"{r['cpu_us_per_inference']['median']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
