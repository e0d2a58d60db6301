"""Streaming row of `make bench`: client CPU per streamed response, loadkit beside
perf_analyzer --streaming, on the same decoupled model (`repeat`: IN's 16 values streamed back
as 16 responses with no delay, then an empty final response) at the same request rate.

Why a rate and not a concurrency: perf_analyzer 2.34 counts a decoupled request as done at its
first response, so at "concurrency 4" it keeps sending while earlier requests still stream:
measured here, Triton's queue grew to 24 s within one window (the flood the issue describes).
At a fixed rate below the model's capacity both clients send the same requests.

perf_analyzer times a decoupled request to its first response only (server#4530), loadkit to
its final one; the CPU per response is comparable, the latencies are not (both are printed).
Also: what reading and recording one response costs loadkit, against what recording one
request costs (a microbenchmark of the same code the engine runs).
"""

from __future__ import annotations

import argparse
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
VALUES = 16
SCENARIO = """
name: bench-stream
requests:
  r:
    model: repeat
    inputs:
      IN: {{dtype: INT32, shape: [{n}], data: ones}}
      DELAY_MS: {{dtype: INT32, shape: [1], data: zeros}}
phases:
  - name: bench
    load: {{rate: {c}, step_duration: {seconds}s, warmup: 2s}}
"""


def loadkit_row(address: str, c: float, seconds: float, work: Path) -> dict[str, Any]:
    scen = work / "stream.yaml"
    scen.write_text(SCENARIO.format(n=VALUES, c=c, seconds=seconds))
    out = work / f"lk-{time.monotonic_ns()}"
    proc = subprocess.run([sys.executable, "-m", "loadkit", "run", str(scen), "--target",
                           address, "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=seconds + 120)
    if proc.returncode != 0:
        raise SystemExit(f"loadkit failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    step = json.loads((out / "results.json").read_text())["phases"][0]["steps"][0]
    c_ = step["client"]["r"]
    served = step["server"]["repeat"]["success"]
    if served != c_["requests"] or c_["responses"] != VALUES * served:
        raise SystemExit(f"accounting broke: {c_['requests']} requests, {c_['responses']} "
                         f"responses, server {served}")
    return {"requests_s": step["requests_per_s"], "responses": c_["responses"],
            "cpu_us_per_response": round(step["generator"]["cpu_s"] / c_["responses"] * 1e6, 2),
            "first_response_p50_us": c_["first_response_us"]["p50"],
            "latency_p50_us": c_["latency_us"]["p50"]}


def perf_analyzer_row(address: str, c: float, seconds: float, work: Path,
                      control: Any) -> dict[str, Any] | None:
    data = work / "repeat.json"
    data.write_text(json.dumps({"data": [{"IN": {"content": [1] * VALUES, "shape": [VALUES]},
                                          "DELAY_MS": [0]}]}))
    before = control.counters(("repeat",))["repeat"].success
    env = {**os.environ, "LD_LIBRARY_PATH": str(TOOLS / "lib")}
    log = work / f"pa-{time.monotonic_ns()}.txt"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [str(TOOLS / "perf_analyzer"), "-m", "repeat", "-i", "grpc", "-u", address,
             "--streaming", "--request-rate-range", f"{c}:{c}", "--request-distribution",
             "constant", "--input-data", str(data), "--measurement-interval",
             str(int(seconds * 1000)), "--max-trials", "10", "--stability-percentage", "50"],
            stdout=sink, stderr=subprocess.STDOUT, text=True, env=env)
    # perf_analyzer 2.34 prints its result for a decoupled model, then never exits (it waits
    # on the stream): stop it once the result is out; its CPU is read from its rusage then
    deadline = time.monotonic() + seconds * 12 + 30
    while "Client Average Batch Latency" not in log.read_text() and proc.poll() is None:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    _, status, usage = os.wait4(proc.pid, 0)
    output = log.read_text()
    if "Client Average Batch Latency" not in output:
        print(f"perf_analyzer gave no result:\n{output[-1500:]}", file=sys.stderr)
        return None
    served = control.counters(("repeat",))["repeat"].success - before
    p50 = next((line.split()[-2] for line in output.splitlines() if "p50 latency" in line), "")
    return {"served": served, "responses": served * VALUES,
            "cpu_us_per_response": round((usage.ru_utime + usage.ru_stime)
                                         / (served * VALUES) * 1e6, 2),
            "p50_us_as_printed": float(p50) if p50 else None}


def record_costs(n: int = 100_000) -> dict[str, float]:
    """µs per request recorded (today's path) and per streamed response read and recorded."""
    from tritonclient.grpc import service_pb2

    from loadkit.engine.slots import Responses
    from loadkit.plan import Step
    from loadkit.record import StepWindow

    resp = service_pb2.ModelStreamInferResponse()
    r = resp.infer_response
    r.model_name = "repeat"
    r.parameters["triton_final_response"].bool_param = False
    out = r.outputs.add()
    out.name, out.datatype = "OUT", "INT32"
    out.shape.append(1)
    r.raw_output_contents.append(b"\x01\x00\x00\x00")
    message = resp.SerializeToString()
    window = StepWindow(step=Step(phase_index=0, phase="b", index=0, concurrency=1, warmup_s=0.0,
                             duration_s=1.0))
    values = [(i * 7919) % 50_000 + 100 for i in range(n)]
    t0 = time.perf_counter()
    for v in values:
        window.record("t", v)
    per_request = (time.perf_counter() - t0) / n * 1e6
    stream = Responses()
    t0 = time.perf_counter()
    for i in range(0, n, VALUES):  # VALUES responses a request, then its record
        stream.reset()
        for j in range(VALUES):
            stream.take(message, i * 1000 + j * 997)
        window.streamed("s", 500, stream.gaps, stream.count, 20_000, None)
    per_response = (time.perf_counter() - t0) / n * 1e6
    return {"record_request_us": round(per_request, 3),
            "read_and_record_response_us": round(per_response, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=50, help="requests/s (x16 responses)")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    from loadkit.control.client import ServerControl
    from loadkit.control.embedded import EmbeddedServer

    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    report: dict[str, Any] = {"started_at": started,
                              "cpus": os.cpu_count(), "rate": args.rate,
                              "responses_per_request": VALUES, "pairs": [],
                              "micro": record_costs()}
    server = EmbeddedServer(models=("repeat",)).start()
    control = ServerControl(server.grpc_address)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.pairs):
                lk = loadkit_row(server.grpc_address, args.rate, args.seconds * 3,
                                 Path(tmp))
                pa = perf_analyzer_row(server.grpc_address, args.rate, args.seconds,
                                       Path(tmp), control)
                report["pairs"].append({"loadkit": lk, "perf_analyzer": pa})
                print(f"pair {i + 1}: loadkit {lk['cpu_us_per_response']} us/response, "
                      f"perf_analyzer {pa and pa['cpu_us_per_response']}", file=sys.stderr)
    finally:
        control.close()
        server.stop()
    done = [p for p in report["pairs"] if p["perf_analyzer"]]
    if done:
        report["cpu_ratio_median"] = round(statistics.median(
            p["loadkit"]["cpu_us_per_response"] / p["perf_analyzer"]["cpu_us_per_response"]
            for p in done), 2)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"streaming-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
