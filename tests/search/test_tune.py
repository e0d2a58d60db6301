"""`loadkit tune` against the real embedded Triton (the dense model and its simulated device):
the strategies, the winner's config.pbtxt, the budget, Ctrl-C and --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, loadkit, results, wait_for, write
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from loadkit.control.client import ServerControl

TUNE = """
name: tune-test
requests:
  dense_b1:
    model: dense
    batch_size: 1
    inputs:
      INPUT0: {{dtype: FP32, shape: [256], data: random, seed: 7}}
tune:
  config:
    dense:
      parameters: {{device_us: "{device_us}"}}
      dynamic_batching: {{max_queue_delay_microseconds: 0}}
  models:
    dense:
{dims}
  load: {{concurrency: {conc}, step_duration: {dur}, warmup: 0.3s}}
  objective: {{maximize: throughput}}
  constraints: {{p99: 200ms, error_rate: 0.1%}}
"""


SERVE = """
name: serve
requests:
  dense_b1: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
phases:
  - name: on-best
    load: {concurrency: 4, step_duration: 1s, warmup: 0.2s}
"""


DIMS = """      instance_group.count: [1, 2]
      dynamic_batching.max_queue_delay_microseconds: {delays}"""
# Each execute holds the simulated device 4 ms whatever the batch: at concurrency 8, doubling the
# batch or the instances doubles throughput, gaps far above this VM's drift between minutes, so
# the climb's path is known: (1, 1) -> batch 2 -> batch 4 -> 2 instances, the grid's best.
CLIMB = """      max_batch_size: [1, 2, 4]
      instance_group.count: [1, 2]"""


def scenario(tmp_path: Path, delays: str = "[0, 200, 2000]", conc: str = "8",
             dur: str = "1.5s", dims: str = "", device_us: int = 400) -> Path:
    return write(tmp_path / "tune.yaml", TUNE.format(
        dims=dims or DIMS.format(delays=delays), conc=conc, dur=dur, device_us=device_us))


def tune(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return loadkit("tune", *args, "--quiet", timeout=timeout)


def measured(out: Path) -> list[dict[str, Any]]:
    return [t for t in results(out)["tune"]["trials"] if not t["baseline"]]


def test_quick_finds_within_10_percent_of_brute_in_fewer_trials_and_the_winner_loads(
        tmp_path: Path, triton: Any, control: ServerControl) -> None:
    path = scenario(tmp_path, dur="1s", dims=CLIMB, device_us=4000)
    original = control.config("dense")
    runs = {}
    for strategy in ("brute", "quick"):
        out = tmp_path / strategy
        r = tune(str(path), "--target", triton.grpc_address, "--strategy", strategy,
                 "--out", str(out))
        assert r.returncode == 0, r.stderr[-3000:]
        data = results(out)
        assert data["status"] == "complete"
        t = data["tune"]
        best = next(x for x in t["trials"] if x["trial"] == t["best"])
        runs[strategy] = (len(measured(out)), best["point"]["objective"], out)
        # every trial is an ordinary measured phase with exact accounting
        for phase in data["phases"]:
            for step in phase["steps"]:
                assert step["accounting"]["status"] == "ok", step["accounting"]
        assert control.config("dense") == original  # restored
    n_brute, best_brute, out = runs["brute"]
    n_quick, best_quick, _ = runs["quick"]
    print(f"brute: {n_brute} trials, best {best_brute:.1f} infer/s; "
          f"quick: {n_quick} trials, best {best_quick:.1f} infer/s")
    assert n_brute == 6
    assert n_quick < n_brute
    winners = [next(x for x in results(o)["tune"]["trials"]
                    if x["trial"] == results(o)["tune"]["best"])["values"]
               for o in (runs["brute"][2], runs["quick"][2])]
    # quick's choice, as brute measured it in the same minutes, is within 10% of brute's best
    # (two runs minutes apart differ by up to ~15% on this VM for the same config)
    by_values = {json.dumps(x["values"], sort_keys=True): x["point"]["objective"]
                 for x in results(runs["brute"][2])["tune"]["trials"] if x.get("point")}
    assert by_values[json.dumps(winners[1], sort_keys=True)] >= 0.9 * best_brute
    assert winners[0] == winners[1] == {"dense.max_batch_size": 4,
                                        "dense.instance_group.count": 2}
    summary = (out / "summary.md").read_text()
    assert "## Tune" in summary and "**best**" in summary
    # before naming its winner the search raced the configs it could not tell apart
    t = results(out)["tune"]
    assert t["best"] in t["raced"] and len(t["raced"]) >= 2, t["raced"]
    assert "ties" in t and t["recommended"]["trial"] in [t["best"], *t["ties"]]
    assert "Raced before naming it" in summary and "Recommended: trial" in summary
    raced = [x for x in t["trials"] if x["trial"] in t["raced"]]
    assert all(x["point"]["measurements"] >= 2 for x in raced), raced
    # the winner's gain stands on all its measurements (their mean and t interval), not on
    # the first, which was the field's luckiest draw
    gain = t["gain"]["throughput_change"]
    assert "delta method" in gain["method"], gain
    # 1 s steps have no within-run interval: an unraced baseline leaves the change without one
    # (`unknown`, never a bare verdict); a raced one gives it its t interval
    ci = gain["ci_pct"]
    assert gain["verdict"] == ("unknown" if not ci else "better" if ci[0] > 0 else
                               "inconclusive"), gain
    phases = {p["name"]: p["steps"][0]["throughput"] for p in results(out)["phases"]}

    def mean(trial: dict[str, Any]) -> float:  # over its measurements (the baseline may race)
        names = (trial["phase"], *trial.get("remeasured", []))
        return sum(phases[n] for n in names) / len(names)

    won = next(x for x in t["trials"] if x["trial"] == t["best"])
    base = next(x for x in t["trials"] if x["baseline"])
    assert gain["delta_pct"] == pytest.approx((mean(won) / mean(base) - 1) * 100, abs=0.1)
    assert (out / "tune_pareto.png").stat().st_size > 1000
    # the winner's config.pbtxt: Triton's text format, loaded as is into the running server
    text = (out / "best" / "dense" / "config.pbtxt").read_text()
    message = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert message.name == "dense" and message.instance_group
    try:
        control.load("dense", json_format.MessageToDict(message,
                                                        preserving_proto_field_name=True), 120)
        wait_for(lambda: control.model_ready("dense"), 60, "dense ready on the best config")
        served = control.config("dense")
        best_values = next(x for x in results(out)["tune"]["trials"]
                           if x["trial"] == results(out)["tune"]["best"])["values"]
        assert served["instance_group"][0]["count"] == best_values[
            "dense.instance_group.count"] == 2
        assert served["max_batch_size"] == 4
        serve = write(tmp_path / "serve.yaml", SERVE)
        r = loadkit("run", str(serve), "--target", triton.grpc_address, "--out",
                    str(tmp_path / "serve"), "--quiet")
        assert r.returncode == 0, r.stderr[-2000:]
        step = results(tmp_path / "serve")["phases"][0]["steps"][0]
        assert step["requests"] > 0 and step["accounting"]["status"] == "ok"
    finally:
        control.load("dense", original, 120)
        wait_for(lambda: control.model_ready("dense"), 60, "dense restored")


def test_ctrl_c_keeps_the_trials_restores_the_config_and_resume_measures_only_the_rest(
        tmp_path: Path, triton: Any, control: ServerControl) -> None:
    path = scenario(tmp_path, conc="8", dur="1s")
    original = control.config("dense")
    out = tmp_path / "search"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadkit", "tune", str(path), "--target", triton.grpc_address,
         "--strategy", "brute", "--out", str(out), "--quiet"],
        cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def in_second_trial() -> bool:
            if not (out / "results.json").exists():
                return False
            data = results(out)
            return len(data["tune"]["trials"]) >= 2 and len(data["phases"]) >= 3
        wait_for(in_second_trial, 120, "the third trial under way", poll=0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "stopping after this trial" in err
    data = results(out)
    assert data["status"] == "interrupted"
    t = data["tune"]
    assert t["stopped"] == "interrupted"
    kept = t["trials"]
    assert len(kept) == 3 and all(x["status"] == "ok" for x in kept)  # the current one finished
    assert control.config("dense") == original
    assert any(e["event"] == "config_restored" for e in data["events"])
    done = {json.dumps(x["values"], sort_keys=True) for x in kept if not x["baseline"]}
    first_elapsed = t["elapsed_s"]

    # resume, with a budget of 4 grid trials in all: 2 more, none measured twice
    r = tune(str(path), "--target", triton.grpc_address, "--strategy", "brute",
             "--resume", str(out), "--budget", "4 trials")
    assert r.returncode == 0, r.stderr[-3000:]
    data = results(out)
    t = data["tune"]
    grid = [x for x in t["trials"] if not x["baseline"]]
    keys = [json.dumps(x["values"], sort_keys=True) for x in grid]
    assert len(grid) == 4 and len(set(keys)) == 4 and done <= set(keys)
    assert t["elapsed_s"] > first_elapsed  # the whole search, not only the resumed part
    assert t["stopped"] == "budget: 4 trials"
    assert sum(x["baseline"] for x in t["trials"]) == 1  # the baseline was not measured again
    assert [p["name"] for p in data["phases"]] == [x["phase"] for x in t["trials"]]
    assert control.config("dense") == original


def test_a_time_budget_stops_the_search(tmp_path: Path, triton: Any) -> None:
    out = tmp_path / "budget"
    r = tune(str(scenario(tmp_path, dur="1s")), "--target", triton.grpc_address,
             "--budget", "2s", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    t = results(out)["tune"]
    assert t["stopped"] == "budget: 2 s" and measured(out) == []
    assert t["best"] == t["baseline"] == 0  # the baseline is still measured and ranked


def test_a_config_triton_refuses_is_recorded_and_the_search_goes_on(
        tmp_path: Path, triton: Any) -> None:
    path = scenario(tmp_path, conc="4", dur="1s", dims='      backend: ["python", "onnxruntime"]')
    out = tmp_path / "refused"
    r = tune(str(path), "--target", triton.grpc_address, "--strategy", "brute",
             "--out", str(out))
    t = results(out)["tune"]
    by_backend = {x["values"].get("dense.backend"): x for x in t["trials"]}
    assert by_backend["python"]["point"] is not None
    refused = by_backend["onnxruntime"]  # dense has no model.onnx: Triton cannot load it
    assert refused["status"] == "failed" and refused["point"] is None and refused["reason"]
    assert r.returncode == 0, r.stderr[-3000:]
    assert "failed:" in (out / "summary.md").read_text()


def test_progress_names_the_trial_and_its_config(tmp_path: Path, triton: Any) -> None:
    """The progress line knows trials: the baseline, then 'trial 1/6 count=1, ...' with its
    step (it raised ValueError: 'baseline' is not in list, and showed nothing more)."""
    out = tmp_path / "progress"
    r = loadkit("tune", str(scenario(tmp_path, dur="2s")), "--target", triton.grpc_address,
                "--strategy", "brute", "--budget", "1 trials", "--out", str(out), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "Error" not in r.stderr, r.stderr[-3000:]
    assert "[baseline step 1/1 " in r.stderr, r.stderr[-3000:]
    assert "[trial 1/6 count=1, max_queue_delay_microseconds=0 step 1/1 " in r.stderr, \
        r.stderr[-3000:]


def test_a_search_the_server_cannot_serve_is_reported_as_aborted(tmp_path: Path) -> None:
    """A server in `none` model-control mode cannot swap configs: the search stops at the first
    trial, reported as aborted with Triton's reason on one table row (not as 'interrupted'
    with 'no config kept the constraints')."""
    from loadkit.control.embedded import EmbeddedServer

    repository = tmp_path / "models"
    repository.mkdir()
    (repository / "dense").symlink_to(ROOT / "model_repository" / "dense")
    with EmbeddedServer(model_repository=repository,
                        extra_args=("--model-control-mode=none",)) as server:
        out = tmp_path / "aborted"
        r = tune(str(scenario(tmp_path, dur="1s")), "--target", server.grpc_address,
                 "--strategy", "brute", "--out", str(out))
    assert r.returncode == 1, r.stderr[-3000:]
    data = results(out)
    assert data["status"] == "aborted", data["reason"]
    assert data["tune"]["stopped"].startswith("aborted: "), data["tune"]["stopped"]
    summary = (out / "summary.md").read_text()
    assert "interrupted" not in summary and "No config kept the constraints" not in summary
    assert "No config was measured besides the baseline" in summary
    table = summary[summary.index("| rank |"):].split("\n\n")[0].splitlines()
    assert all(line.startswith("|") and line.endswith("|") for line in table), table


def test_dynamic_batching_itself_is_a_dimension(tmp_path: Path, triton: Any,
                                                control: ServerControl) -> None:
    """`dynamic_batching: [off, on]`: off removes the section (Triton executes one request at a
    time: avg batch 1), on turns it on with Triton's defaults (batches form at 8 in flight)."""
    original = control.config("dense")
    path = write(tmp_path / "db.yaml", TUNE.format(
        dims="      dynamic_batching: [off, on]", conc="8", dur="1s", device_us=2000).replace(
        "      dynamic_batching: {max_queue_delay_microseconds: 0}\n", ""))
    out = tmp_path / "db"
    r = tune(str(path), "--target", triton.grpc_address, "--strategy", "brute", "--budget",
             "2 trials", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    trials = {json.dumps(x["values"]["dense.dynamic_batching"]): x for x in measured(out)}
    off, on = trials["null"]["point"], trials["{}"]["point"]
    assert off["server"]["dense"]["avg_batch"] == 1.0, off["server"]
    assert on["server"]["dense"]["avg_batch"] > 1.5, on["server"]
    assert "dynamic_batching=off" in (out / "summary.md").read_text()
    assert control.config("dense") == original
