"""`make bench`: loadkit and perf_analyzer side by side on the same embedded Triton.

For each concurrency level, A B pairs (loadkit, then perf_analyzer) against the dense model, both
on the same gRPC method (loadkit's default stream transport against `perf_analyzer --streaming`,
`--transport unary` against its default): the server then does the same work for both, and
latencies mean the same thing. For each run: throughput, client CPU µs per inference, p50, p99.
Client CPU is the generator's user+sys time over its measurement divided by what the server
says it served:
- loadkit: its own per-step `generator.cpu_s` (measured window only) over the step's server
  success delta;
- perf_analyzer: the whole process's rusage (startup and its stabilization windows included,
  which favours loadkit slightly) over the server success delta across the process lifetime.
Both report the same span of requests: perf_analyzer measures `--seconds` windows until its last
3 agree (its stability window) and reports those 3 merged, so loadkit measures one window of
3 x `--seconds`. (A single 5 s window holds ~50 samples above p99 at 1000/s: p99s compared over
different spans moved 0.8x-1.3x between benches.)
Also the cost of one HDR record. Results go to bench/results/<UTC time>.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "bench" / ".tools"
PERF_ANALYZER = TOOLS / "perf_analyzer"
# perf_analyzer's stability window: it reports the last this-many measurement windows, merged.
STABILITY_WINDOWS = 3
# The server's own time per request (Triton's statistics), as loadkit's results name its parts
# and as perf_analyzer's CSV does.
SERVER_PARTS = ("queue_us", "compute_input_us", "compute_infer_us", "compute_output_us")
PA_SERVER_COLUMNS = ("Server Queue", "Server Compute Input", "Server Compute Infer",
                     "Server Compute Output")

SCENARIO = """
name: bench
target: {{transport: {transport}, shared: {shared}}}
requests:
  dense_b1:
    model: dense{dataset}
    inputs: {{INPUT0: {{dtype: FP32, shape: [256], {data}}}}}
phases:
  - name: bench
    load: {{{load}, step_duration: {seconds}s, warmup: 2s}}
"""


def is_rate(level: str) -> bool:
    """Levels are concurrencies ("8") or, for the open loop, constant arrival rates ("2000/s")."""
    return level.endswith("/s")


def loadkit_load(level: str) -> str:
    if is_rate(level):
        return f"rate: {level[:-2]}, arrival: constant"
    return f"concurrency: {level}"


def perf_analyzer_load(level: str) -> list[str]:
    if is_rate(level):
        r = level[:-2]
        return ["--request-rate-range", f"{r}:{r}", "--request-distribution", "constant"]
    return ["--concurrency-range", f"{level}:{level}"]


def run_loadkit(
    address: str, level: str, seconds: float, work: Path, transport: str,
    alone: bool = True, dataset: Path | None = None,
) -> dict[str, Any]:
    """One loadkit run. `alone`: the only client, so its count must equal the server's delta
    (with perf_analyzer beside it, the server counts both). `dataset`: a perf_analyzer
    --input-data file the requests come from, in turn."""
    scen = work / "loadkit.yaml"
    text = SCENARIO.format(load=loadkit_load(level), seconds=seconds, transport=transport,
                           shared=str(not alone).lower(),
                           dataset=f"\n    dataset: {{file: {dataset}, max_size: 1GB}}"
                           if dataset else "",
                           data="data: dataset" if dataset else "data: random, seed: 1")
    scen.write_text(text)
    out = work / f"lk-{time.monotonic_ns()}"
    proc = subprocess.run(
        [sys.executable, "-m", "loadkit", "run", str(scen), "--target", address,
         "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=seconds + 120,
    )
    if proc.returncode != 0:
        events = ""
        if (out / "results.json").is_file():
            events = json.dumps(json.loads((out / "results.json").read_text()).get("events"))
        raise SystemExit(f"loadkit run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-2000:]}\nevents: {events[-2000:]}")
    step = json.loads((out / "results.json").read_text())["phases"][0]["steps"][0]
    server = step["server"]["dense"]
    served = server["success"]
    if alone and served != step["requests"]:
        raise SystemExit(f"accounting broke: client {step['requests']} != server {served}")
    result = {
        "infer_s": step["throughput"],
        "cpu_us_per_inference": round(step["generator"]["cpu_s"] / served * 1e6, 1),
        "p50_us": step["latency_us"]["p50"],
        "p90_us": step["latency_us"]["p90"],
        "p99_us": step["latency_us"]["p99"],
        "served": served,
        "server_us": round(sum(server[k] for k in SERVER_PARTS), 1),
    }
    if is_rate(level):
        # perf_analyzer times a request from its actual send; loadkit's headline latency counts
        # from the scheduled send (coordinated omission). Compare like with like, keep both.
        service = step["open_loop"]["service_latency_us"]
        result.update(
            p50_us=service["p50"], p90_us=service["p90"], p99_us=service["p99"],
            p50_from_schedule_us=step["latency_us"]["p50"],
            p99_from_schedule_us=step["latency_us"]["p99"],
        )
    return result


def run_perf_analyzer(
    address: str, level: str, seconds: float, work: Path, control: Any, streaming: bool,
    input_data: Path | None = None,
) -> dict | None:
    """One perf_analyzer run; a run that cannot stabilize is retried once with a looser bound,
    then left out (None): that pair is dropped and counted, the bench goes on."""
    for stability in (25, 50):
        result = _perf_analyzer_once(address, level, seconds, work, control, stability, streaming,
                                     input_data)
        if result is not None:
            return result
    return None


def _perf_analyzer_once(
    address: str, level: str, seconds: float, work: Path, control: Any, stability: int,
    streaming: bool, input_data: Path | None = None,
) -> dict | None:
    csv_path = work / f"pa-{time.monotonic_ns()}.csv"
    before = control.counters(("dense",))["dense"].success
    proc = start_perf_analyzer(address, level, seconds, stability, streaming, csv_path,
                               input_data)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    output = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        if "stable measurement" in output:
            print(f"perf_analyzer unstable at {level} (stability {stability}%)", file=sys.stderr)
            return None
        raise SystemExit(f"perf_analyzer failed ({proc.returncode}):\n{output[-2000:]}")
    served = control.counters(("dense",))["dense"].success - before
    return {
        **perf_analyzer_csv(csv_path),
        "cpu_us_per_inference": round((usage.ru_utime + usage.ru_stime) / served * 1e6, 1),
        "served": served,
        "stability_percentage": stability,
    }


def start_perf_analyzer(
    address: str, level: str, seconds: float, stability: int, streaming: bool, csv_path: Path,
    input_data: Path | None = None,
) -> subprocess.Popen[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(TOOLS / "lib")}
    return subprocess.Popen(
        [str(PERF_ANALYZER), "-m", "dense", "-i", "grpc", "-u", address,
         *perf_analyzer_load(level), "--measurement-interval", str(int(seconds * 1000)),
         "--max-trials", "10", "--stability-percentage", str(stability), "--shape", "INPUT0:256",
         "-f", str(csv_path), *(["--streaming"] if streaming else []),
         *(["--input-data", str(input_data)] if input_data else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )


def perf_analyzer_csv(csv_path: Path) -> dict[str, float]:
    row = next(csv.DictReader(csv_path.open()))
    return {
        "infer_s": float(row["Inferences/Second"]),
        "p50_us": float(row["p50 latency"]),
        "p90_us": float(row["p90 latency"]),
        "p99_us": float(row["p99 latency"]),
        "server_us": float(sum(float(row[c]) for c in PA_SERVER_COLUMNS)),
    }


def run_together(
    address: str, rate: float, seconds: float, work: Path, transport: str
) -> dict[str, Any] | None:
    """Both clients at once, each at half the rate, on the same server in the same seconds: the
    server's stalls and the VM's drift then fall on both alike, so any difference in what they
    report is the clients' own. perf_analyzer starts first; loadkit measures one window long
    enough to cover perf_analyzer's three (a perf_analyzer that needs more windows than that to
    settle, or never does, leaves the pair out)."""
    half = f"{rate / 2:g}/s"
    csv_path = work / f"pa-together-{time.monotonic_ns()}.csv"
    t0 = time.monotonic()
    pa = start_perf_analyzer(address, half, seconds, 50, transport == "stream", csv_path)
    lk_seconds = seconds * (STABILITY_WINDOWS + 1)
    try:
        lk = run_loadkit(address, half, lk_seconds, work, transport, alone=False)
    finally:
        output = pa.communicate(timeout=seconds * 12 + 60)[0]
    pa_wall = time.monotonic() - t0
    if pa.returncode != 0 or not csv_path.is_file():
        print(f"together: perf_analyzer failed or never stable ({pa.returncode}): "
              f"{output[-300:]}", file=sys.stderr)
        return None
    # loadkit measured from ~3 s after the start (its start-up, 2 s warm-up) for lk_seconds
    if pa_wall > lk_seconds + 6:
        print(f"together: perf_analyzer ran {pa_wall:.0f} s, past loadkit's window; pair left "
              "out", file=sys.stderr)
        return None
    return {"loadkit": lk, "perf_analyzer": perf_analyzer_csv(csv_path),
            "perf_analyzer_wall_s": round(pa_wall, 1)}


def hdr_record_cost_us(samples: int = 200_000) -> float:
    from loadkit.plan import Step
    from loadkit.record import StepWindow

    window = StepWindow(step=Step(phase_index=0, phase="b", index=0, concurrency=1, warmup_s=0.0,
                             duration_s=1.0))
    values = [(i * 7919) % 50_000 + 100 for i in range(samples)]
    t0 = time.perf_counter()
    for v in values:
        window.record("t", v)
    return round((time.perf_counter() - t0) / samples * 1e6, 3)


def spread(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,8,32", help="concurrencies")
    ap.add_argument("--rates", default="1000,2000", help="constant arrival rates, /s ('' = none)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0,
                    help="perf_analyzer's measurement window; loadkit measures 3x this")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--transport", default="stream", choices=("stream", "unary"))
    ap.add_argument("--dataset", type=int, default=10_000,
                    help="entries of the perf_analyzer --input-data file both clients read at "
                         "concurrency 8, beside loadkit with one payload (0 = none)")
    ap.add_argument("--together", default="1000",
                    help="total rate for the runs where both clients send at once, each half "
                         "of it ('' = none)")
    args = ap.parse_args()
    if not PERF_ANALYZER.is_file():
        print(f"{PERF_ANALYZER} missing: run bench/setup_perf_analyzer.sh", file=sys.stderr)
        return 2
    from loadkit.control.client import ServerControl
    from loadkit.control.embedded import EmbeddedServer

    levels = [x for x in args.levels.split(",") if x]
    levels += [f"{x}/s" for x in args.rates.split(",") if x]
    report: dict[str, Any] = {
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(), "transport": args.transport,
        "perf_analyzer_mode": "--streaming" if args.transport == "stream" else "unary",
        "pairs": args.pairs,
        "seconds": args.seconds, "loadkit_seconds": args.seconds * STABILITY_WINDOWS,
        "levels": {},
        "hdr_record_us": hdr_record_cost_us(),
    }
    server = EmbeddedServer(models=("dense",)).start()
    control = ServerControl(server.grpc_address)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            for level in levels:
                pairs = []
                unstable = 0
                for i in range(args.pairs):
                    a = run_loadkit(
                        server.grpc_address, level, args.seconds * STABILITY_WINDOWS, work,
                        args.transport,
                    )
                    b = run_perf_analyzer(
                        server.grpc_address, level, args.seconds, work, control,
                        streaming=args.transport == "stream",
                    )
                    if b is None:
                        unstable += 1
                        print(f"{level} pair {i + 1}: perf_analyzer never stable; pair dropped",
                              file=sys.stderr, flush=True)
                        continue
                    pairs.append({"loadkit": a, "perf_analyzer": b})
                    print(f"{level} pair {i + 1}: loadkit {a['infer_s']:.0f}/s "
                          f"{a['cpu_us_per_inference']} us cpu; perf_analyzer "
                          f"{b['infer_s']:.0f}/s {b['cpu_us_per_inference']} us cpu",
                          file=sys.stderr, flush=True)
                if not pairs:
                    report["levels"][level] = {"pairs": [], "dropped_pairs": unstable}
                    continue
                ratios = {
                    k: spread([p["loadkit"][k] / p["perf_analyzer"][k] for p in pairs])
                    for k in ("infer_s", "cpu_us_per_inference", "p50_us", "p99_us",
                              "server_us")
                }
                report["levels"][level] = {
                    "pairs": pairs, "ratios": ratios, "dropped_pairs": unstable
                }
            if args.dataset:
                report["dataset"] = dataset_rows(server.grpc_address, args, work, control)
            if args.together:
                report["together"] = together(server.grpc_address, args, work)
    finally:
        control.close()
        server.stop()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    (out_dir / f"{stamp}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(f"\nwritten: {out_dir / f'{stamp}.json'}", file=sys.stderr)
    return 0


def dataset_rows(address: str, args: argparse.Namespace, work: Path,
                 control: Any) -> dict[str, Any]:
    """The same --input-data file (N distinct requests for dense) read by both clients at
    concurrency 8, and loadkit with one payload beside it: what a pool costs per inference,
    and how long loadkit takes to read and prepare the file."""
    from loadkit.scenario import load_scenario
    from loadkit.transport.grpc_door import GrpcEncoder
    from loadkit.transport.payloads import prepare_pool

    rng = __import__("numpy").random.default_rng(3)
    data = {"data": [{"INPUT0": [round(float(x), 4) for x in rng.random(256)]}
                     for _ in range(args.dataset)]}
    path = work / "input-data.json"
    path.write_text(json.dumps(data))
    scen = work / "startup.yaml"
    scen.write_text(SCENARIO.format(load="concurrency: 1", seconds=1, transport="stream",
                                    shared="false", data="data: dataset",
                                    dataset=f"\n    dataset: {{file: {path}, max_size: 1GB}}"))
    t0 = time.perf_counter()
    pool = prepare_pool(load_scenario(scen).requests["dense_b1"], GrpcEncoder())
    startup_s = round(time.perf_counter() - t0, 2)
    pairs = []
    for i in range(args.pairs):
        one = run_loadkit(address, "8", args.seconds * STABILITY_WINDOWS, work, args.transport)
        lk = run_loadkit(address, "8", args.seconds * STABILITY_WINDOWS, work, args.transport,
                         dataset=path)
        pa = run_perf_analyzer(address, "8", args.seconds, work, control,
                               args.transport == "stream", path)
        if pa is None:
            continue
        pairs.append({"loadkit_one_payload": one, "loadkit": lk, "perf_analyzer": pa})
        print(f"dataset {args.dataset} pair {i + 1}: loadkit {lk['cpu_us_per_inference']} us "
              f"cpu (one payload {one['cpu_us_per_inference']}), perf_analyzer "
              f"{pa['cpu_us_per_inference']} us", file=sys.stderr, flush=True)
    out: dict[str, Any] = {"entries": args.dataset, "startup_s": startup_s, "pool": len(pool),
                           "file_mb": round(path.stat().st_size / 2**20, 1), "pairs": pairs}
    if pairs:
        out["ratios"] = {
            k: spread([p["loadkit"][k] / p["perf_analyzer"][k] for p in pairs])
            for k in ("infer_s", "cpu_us_per_inference", "p50_us", "p99_us", "server_us")}
        out["pool_vs_one_payload_cpu"] = spread(
            [p["loadkit"]["cpu_us_per_inference"] / p["loadkit_one_payload"]["cpu_us_per_inference"]
             for p in pairs])
    return out


def together(address: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    rate = float(args.together)
    pairs = []
    for i in range(args.pairs):
        pair = run_together(address, rate, args.seconds, work, args.transport)
        if pair is None:
            continue
        pairs.append(pair)
        lk, pa = pair["loadkit"], pair["perf_analyzer"]
        print(f"together {rate:g}/s pair {i + 1}: p99 loadkit {lk['p99_us']:.0f} us, "
              f"perf_analyzer {pa['p99_us']:.0f} us", file=sys.stderr, flush=True)
    out: dict[str, Any] = {"rate": rate, "pairs": pairs, "dropped_pairs": args.pairs - len(pairs)}
    if pairs:
        out["ratios"] = {
            k: spread([p["loadkit"][k] / p["perf_analyzer"][k] for p in pairs])
            for k in ("p50_us", "p90_us", "p99_us", "server_us")
        }
    return out


def table(report: dict[str, Any]) -> str:
    lines = [
        f"HDR record: {report['hdr_record_us']} us/sample. Medians over {report['pairs']} A/B "
        f"pairs (perf_analyzer: {STABILITY_WINDOWS} stable windows of {report['seconds']:g} s, "
        f"loadkit: one of {report.get('loadkit_seconds', report['seconds']):g} s) on "
        f"{report['cpus']} CPUs; loadkit transport "
        f"{report['transport']}, perf_analyzer {report['perf_analyzer_mode']}; ratio = loadkit / "
        "perf_analyzer as median (min-max).",
        "",
        "| load | client | infer/s | CPU us/infer | p50 us | p99 us | server us |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    keys = ("infer_s", "cpu_us_per_inference", "p50_us", "p99_us", "server_us")
    for level, data in report["levels"].items():
        c = level if is_rate(level) else f"c={level}"
        if not data["pairs"]:
            lines.append(f"| {c} | (perf_analyzer never stable: no pair) | | | | | |")
            continue
        lines += _rows(c, data, keys)
    ds = report.get("dataset")
    if ds and ds.get("pairs"):
        one = statistics.median(p["loadkit_one_payload"]["cpu_us_per_inference"]
                                for p in ds["pairs"])
        pool = ds["pool_vs_one_payload_cpu"]
        lines += _rows(f"c=8, {ds['entries']} distinct (--input-data)", ds, keys)
        lines += [
            "",
            f"The same --input-data file ({ds['entries']} entries, {ds['file_mb']} MiB) read by "
            f"both clients at concurrency 8; loadkit read and prepared it in "
            f"{ds['startup_s']} s. loadkit with one payload: {one:.0f} us CPU/inference; the pool "
            f"costs {pool['median']:.2f}x that ({pool['min']:.2f}-{pool['max']:.2f}).",
        ]
    both = report.get("together")
    if both:
        lines += [
            "",
            f"Both at once, each at {both['rate'] / 2:g}/s on the same server in the same "
            f"seconds ({len(both['pairs'])} runs, {both['dropped_pairs']} left out): what each "
            "client reports of the same server.",
            "",
            "| load | client | p50 us | p90 us | p99 us | server us |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        if both["pairs"]:
            lines += _rows(f"{both['rate']:g}/s shared", both,
                           ("p50_us", "p90_us", "p99_us", "server_us"))
    return "\n".join(lines)


def _rows(label: str, data: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """Median of each client over the pairs, then the ratio median (min-max)."""
    out = []
    for who in ("perf_analyzer", "loadkit"):
        med = [statistics.median(p[who][k] for p in data["pairs"]) for k in keys]
        out.append(f"| {label} | {who} | " + " | ".join(f"{m:.0f}" for m in med) + " |")
    r = data["ratios"]
    out.append(f"| {label} | ratio | " + " | ".join(
        f"{r[k]['median']:.2f} ({r[k]['min']:.2f}-{r[k]['max']:.2f})" for k in keys) + " |")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
