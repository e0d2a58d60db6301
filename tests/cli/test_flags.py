"""Every flag of `loadkit run` and `loadkit capacity` is applied or refused by name (exit 2,
nothing sent), never dropped: perf_analyzer's flags beside a scenario file override the
matching keys of every phase or template, and the written scenario.yaml says so."""

from __future__ import annotations

import pytest
from conftest import loadkit, results, write

from loadkit.cli.main import build_parser, main

SCENARIO = """
name: flags
requests:
  d: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
phases:
  - name: closed
    load: {concurrency: 2, step_duration: 2s}
"""
RATE = SCENARIO.replace("{concurrency: 2, step_duration: 2s}",
                        "{rate: 100, step_duration: 2s, max_concurrency: 8}")

# how each flag is applied where it is not refused here (a test of its own elsewhere)
APPLIED = {
    "scenario": "every test", "target": "every server test", "out": "every server test",
    "quiet": "every server test", "metrics": "tests/control/test_metrics.py",
    "seed": "tests/loads/test_open_loop.py", "repeats": "tests/verdicts/test_verdicts.py",
    "max_repeats": "tests/verdicts/test_verdicts.py", "max_time": "tests/cli/test_flags.py",
    "baseline": "tests/report/test_ci.py", "fail_on": "tests/report/test_ci.py",
    "prometheus_port": "tests/control/test_observe.py",
    "workers": "tests/locust/test_distributed.py",
    "master": "tests/locust/test_distributed.py", "model": "tests/report/test_first_hour.py",
    "replay": "tests/run/test_replay.py", "concurrency": "below", "rate": "below",
    "measurement_ms": "below", "step_duration": "below", "warmup": "below",
    "batch_size": "below", "slo": "tests/search/test_capacity.py",
    "peak": "tests/search/test_capacity.py", "headroom": "tests/search/test_capacity.py",
    "budget": "tests/search/test_capacity.py", "precision": "tests/search/test_capacity.py",
    "max_rate": "tests/search/test_capacity.py", "start_rate": "tests/search/test_capacity.py",
    "min_probe": "tests/search/test_capacity.py", "help": "argparse",
    "protocol": "tests/transport/test_http.py",
    "shared_memory": "tests/transport/test_shared_memory.py",
    "output_shm": "tests/transport/test_shared_memory.py",
}
# beside a scenario file (or alone) these are refused with a message naming the flag
REFUSED = [
    (["-p", "0"], "-p: expected a whole number of at least 1; found 0"),
    (["-b", "0"], "-b: expected a whole number of at least 1; found 0"),
    (["--step-duration", "0s"], "--step-duration: expected a duration such as 2s or 500ms above 0"),
    (["--warmup=-1s"], "--warmup: expected a duration such as 2s or 500ms; found '-1s'"),
    (["-p", "500", "--step-duration", "1s"], "-p and --step-duration both give the step's length"),
    (["--request-rate-range", "50:50:1"], "--request-rate-range 50:50:1: the scenario has no "
                                          "rate phase for it to apply to"),
    (["-x", "1"], "-x/--model-version describes -m's model; with a scenario file set the "
                  "template's `version:`"),
    (["--shape", "INPUT0:4"], "--shape describes -m's model"),
    (["--input-data", "zero"], "--input-data describes -m's model"),
    (["--sample-rate", "2"], "--sample-rate describes -m's model"),
    (["--sequence-length", "5"], "--sequence-length describes -m's model"),
    (["--expect-workers", "3"], "--expect-workers applies with --master; found it without"),
    (["--master-port", "5600"], "--master-port applies with --master"),
    (["--master-bind-host", "0.0.0.0"], "--master-bind-host applies with --master"),
    (["--worker-wait", "5"], "--worker-wait applies with --workers or --master"),
    (["--prometheus-host", "0.0.0.0"], "--prometheus-host applies with --prometheus-port"),
    (["--repeats", "0"], "--repeats: expected 1 to 50, or auto; found '0'"),
    (["--max-repeats", "5"], "--max-repeats bounds --repeats auto"),
    (["--max-time", "1m"], "--max-time bounds --repeats auto"),
    (["--repeats", "auto", "--max-time", "0s"], "--max-time: expected a duration above 0"),
    (["--fail-on", "worse"], "--fail-on needs --baseline DIR"),
    (["--baseline", "/nonexistent"], "--baseline /nonexistent: no results.json there"),
]
DESTS_REFUSED = {"model_version", "shape", "input_data", "sample_rate", "sequence_length",
                 "sequence_length_variation", "sequence_id_range", "expect_workers",
                 "master_port", "master_bind_host", "worker_wait", "prometheus_host"}


def _dests(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return {a.dest for a in sub.choices[command]._actions}


@pytest.mark.fast
@pytest.mark.parametrize("command", ["run", "capacity"])
def test_every_flag_is_either_applied_or_refused(command: str) -> None:
    """A flag added to run or capacity must say here how it is applied or refused."""
    missing = _dests(command) - set(APPLIED) - DESTS_REFUSED
    assert not missing, f"say how these {command} flags are applied or refused: {missing}"


@pytest.mark.fast
@pytest.mark.parametrize(("flags", "message"), REFUSED, ids=[" ".join(f) for f, _ in REFUSED])
def test_a_flag_that_cannot_apply_is_refused_by_name(flags, message, tmp_path, capsys) -> None:
    """In this process (the refusal comes before any server or load): exit 2, the flag named."""
    path = write(tmp_path / "s.yaml", SCENARIO)
    for command in ("run", "capacity"):
        extra = ["--slo", "p99<50ms"] if command == "capacity" else []
        if command == "capacity" and any(f.startswith(("--baseline", "--fail-on", "--max-time"))
                                         for f in flags):
            continue  # not capacity's flags (its time is --budget; --baseline: below)
        code = main([command, str(path), *extra, *flags, "--target", "127.0.0.1:1",
                     "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, (command, flags, err)
    code = main(["capacity", str(path), "--slo", "p99<5ms", "--concurrency-range", "4",
                 "--target", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2 and "capacity` searches an arrival rate" in err, err
    # what a command does not accept is not in its parser at all: argparse refuses it
    for command, flag in (("capacity", "--baseline"), ("capacity", "--max-time"),
                          ("tune", "--workers"), ("tune", "--max-repeats")):
        with pytest.raises(SystemExit) as exc:
            main([command, str(path), *(["--slo", "p99<5ms"] if command == "capacity" else []),
                  flag, "1", "--target", "127.0.0.1:1"])
        assert exc.value.code == 2 and f"unrecognized arguments: {flag}" in \
            capsys.readouterr().err


def test_perf_analyzer_flags_override_a_scenario_file(triton, tmp_path) -> None:
    """-p, --warmup, --concurrency-range and -b beside a scenario file change every phase and
    template they apply to: the steps ran as the flags said (the server saw batches of 2),
    the written scenario.yaml names each override, and stderr said them before the run."""
    out = tmp_path / "closed"
    proc = loadkit("run", str(write(tmp_path / "s.yaml", SCENARIO)), "-p", "700", "--warmup",
                   "0.2s", "--concurrency-range", "1:2:1", "-b", "2", "--target",
                   triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = results(out)["phases"][0]["steps"]
    assert [s["load"] for s in steps] == [{"concurrency": 1}, {"concurrency": 2}]
    assert all(0.69 < s["duration_s"] < 0.9 for s in steps), [s["duration_s"] for s in steps]
    for s in steps:
        dense = s["server"]["dense"]
        assert dense["inference_count"] == 2 * dense["success"] == 2 * s["requests"]
    written = (out / "scenario.yaml").read_text()
    for line in ("--concurrency-range 1:2:1: load.concurrency of phase(s) closed",
                 "--step-duration 700ms: load.step_duration of phase(s) closed",
                 "--warmup 0.2s: load.warmup", "-b 2: batch_size of template(s) d"):
        assert line in written and f"override: {line}" in proc.stderr, line
    out = tmp_path / "rate"
    proc = loadkit("run", str(write(tmp_path / "r.yaml", RATE)), "--request-rate-range",
                   "50", "--step-duration", "1s", "--target", triton.grpc_address, "--out",
                   str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (step,) = results(out)["phases"][0]["steps"]
    assert step["load"]["rate"] == 50 and 40 <= step["open_loop"]["scheduled"] <= 60


def test_repeats_auto_stops_at_max_time(triton, tmp_path) -> None:
    """`--max-time` bounds auto's rounds: no round that would end after it starts, and the
    design is fitted to the rounds it leaves room for (fewer looks, a level closer to the
    stated one) after the first round, before any look."""
    step = "{concurrency: 2, step_duration: 1s, warmup: 0.2s}"
    two = SCENARIO.replace("{concurrency: 2, step_duration: 2s}", step) + (
        f"  - name: again\n    load: {step}\n")
    out = tmp_path / "auto"
    proc = loadkit("run", str(write(tmp_path / "a.yaml", two)), "--repeats", "auto",
                   "--max-repeats", "50", "--max-time", "12s", "--target", triton.grpc_address,
                   "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = results(out)
    seq = data["sequential"]
    assert seq["max_time_s"] == 12 and seq["rounds"] == data["repeats"] < 50, seq
    assert seq["max_rounds"] < 50 and "fits" in seq["fitted"], seq
    assert seq["stopped"].startswith(("max_time", "decided", "max_repeats")), seq
    last = seq["looks"][-1]["elapsed_s"] if seq["looks"] else 0
    assert last <= 12 + 1, seq
