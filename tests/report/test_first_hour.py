"""A perf_analyzer user's first hour (issue 40): `loadkit run -m` with perf_analyzer's flags
against a model loadkit never saw, a data set with nothing but `model:` and `dataset:`,
`loadkit init`, and the CLI's words for the usual mistakes (a target that is down, the HTTP
port, a misspelled model)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import yaml
from conftest import assert_accounted, loadkit, results, write


def test_run_m_fills_every_input_from_the_metadata(triton, tmp_path) -> None:
    """mixed_inputs (tests/models) takes STRING, INT64 with a variable dimension, FP16 and an
    optional BOOL, and refuses a request of other dtypes: every request must succeed."""
    out = tmp_path / "m"
    proc = loadkit("run", "-m", "mixed_inputs", "-u", triton.grpc_address, "-b", "2",
                   "--shape", "IDS:5", "--concurrency-range", "1:2:1", "--step-duration", "1s",
                   "--warmup", "0.3s", "--out", str(out), "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = results(out)
    steps = data["phases"][0]["steps"]
    assert [s["load"] for s in steps] == [{"concurrency": 1}, {"concurrency": 2}]
    for step in steps:
        assert not step["errors"] and step["requests"] > 0
        assert step["inferences"] == 2 * step["requests"]
        assert_accounted(step)
    written = yaml.safe_load((out / "scenario.yaml").read_text())
    assert written["requests"]["mixed_inputs"] == {
        "model": "mixed_inputs", "batch_size": 2, "inputs": {"IDS": {"shape": [5]}}}


def test_run_m_says_which_shape_a_variable_dimension_needs(triton, tmp_path) -> None:
    proc = loadkit("run", "-m", "mixed_inputs", "-u", triton.grpc_address, "--out",
                   str(tmp_path / "v"), timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "input 'IDS' of model 'mixed_inputs' has a variable shape [-1]" in proc.stderr
    assert "--shape IDS:16" in proc.stderr and "nothing was sent" in proc.stderr


def test_a_data_set_needs_only_model_and_dataset(triton, tmp_path) -> None:
    """perf_analyzer's --input-data JSON, named by a template with nothing else: its values are
    sent (add_sub's SUM is checked against the file's validation_data)."""
    data = {"data": [{"INPUT0": [i, 1, 2, 3], "INPUT1": [1, 1, 1, i]} for i in range(4)],
            "validation_data": [{"OUTPUT0": [i + 1, 2, 3, 3 + i]} for i in range(4)]}
    write(tmp_path / "d.json", json.dumps(data))
    scen = write(tmp_path / "s.yaml", """
requests:
  a: {model: add_sub, dataset: d.json, validate: true}
phases: [{name: x, load: {concurrency: 2, step_duration: 1s, warmup: 0.3s}}]
""")
    out = tmp_path / "r"
    proc = loadkit("run", str(scen), "--target", triton.grpc_address, "--out", str(out),
                   "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stderr
    step = results(out)["phases"][0]["steps"][0]
    assert step["requests"] > 0 and not step["errors"]
    assert_accounted(step, {"a": "add_sub"})


def test_run_m_with_input_data_and_rate(triton, tmp_path) -> None:
    data = {"data": [{"INPUT0": [float(i)] * 256} for i in range(3)]}
    write(tmp_path / "d.json", json.dumps(data))
    out = tmp_path / "r"
    proc = loadkit("run", "-m", "dense", "-u", triton.grpc_address, "--input-data",
                   str(tmp_path / "d.json"), "--request-rate-range", "50", "-p", "1000",
                   "--out", str(out), "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stderr
    step = results(out)["phases"][0]["steps"][0]
    assert step["load"]["rate"] == 50 and not step["errors"]
    assert 35 <= step["requests"] <= 65  # 1 s at 50/s
    assert_accounted(step)


def test_init_writes_the_scenario_run_m_would_run(triton, tmp_path) -> None:
    path = tmp_path / "mi.yaml"
    proc = loadkit("init", "-m", "mixed_inputs", "-u", triton.grpc_address, "--shape",
                   "IDS:3", "-o", str(path), "--concurrency", "1:4:1", timeout=60)
    assert proc.returncode == 0, proc.stderr
    written = yaml.safe_load(path.read_text())
    assert written["requests"]["mixed_inputs"]["inputs"] == {
        "TEXT": {"dtype": "BYTES", "shape": [1]}, "IDS": {"shape": [3], "dtype": "INT64"},
        "SCALE": {"dtype": "FP16", "shape": [2]}}  # the optional MASK is left out
    assert written["phases"][0]["load"]["concurrency"] == "1:4:1"
    check = loadkit("validate", str(path), timeout=60)
    assert check.returncode == 0, check.stderr
    again = loadkit("init", "-m", "mixed_inputs", "-u", triton.grpc_address, "-o", str(path),
                    timeout=60)
    assert again.returncode == 2 and "exists" in again.stderr


def test_run_m_on_a_sequence_model_runs_it_as_perf_analyzer_does(triton, tmp_path) -> None:
    """`-m accumulate` (sequence batching: CORRID, START/END) runs with perf_analyzer's
    sequence defaults (length 20 +-20%) or its flags, every request accounted for; `init -m`
    writes the `sequence:` block it ran with."""
    out = tmp_path / "seq"
    proc = loadkit("run", "-m", "accumulate", "-u", triton.grpc_address, "--concurrency", "2",
                   "-p", "1500", "--warmup", "0.2s", "--sequence-length", "5",
                   "--sequence-id-range", "100:199", "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (step,) = results(out)["phases"][0]["steps"]
    assert step["accounting"]["status"] == "ok", step["accounting"]
    assert step["client"]["accumulate"]["sequences"] > 0
    written = yaml.safe_load((out / "scenario.yaml").read_text())
    assert written["requests"]["accumulate"]["sequence"] == {
        "length": 5, "length_variation": 20, "ids": [100, 199]}
    path = tmp_path / "acc.yaml"
    proc = loadkit("init", "-m", "accumulate", "-u", triton.grpc_address, "-o", str(path),
                   timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(path.read_text())["requests"]["accumulate"]["sequence"] == {
        "length": 20, "length_variation": 20}
    out = tmp_path / "defaults"
    proc = loadkit("run", str(path), "-u", triton.grpc_address, "-p", "1500", "--warmup",
                   "0.2s", "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (step,) = results(out)["phases"][0]["steps"]
    assert step["accounting"]["status"] == "ok" and step["requests"] > 0
    bad = loadkit("run", "-m", "accumulate", "-u", triton.grpc_address,
                  "--sequence-id-range", "5:1")
    assert bad.returncode == 2 and "--sequence-id-range: expected START:END" in bad.stderr


@pytest.mark.fast
def test_version_and_help_say_what_a_user_needs() -> None:
    from loadkit import __version__
    from loadkit.cli.main import build_parser

    parser = build_parser()
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--version"])
    assert info.value.code == 0
    sub = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    for name in ("run", "capacity", "tune", "init", "validate", "compare"):
        text = sub[name].format_help()
        assert "examples:" in text and "exit codes:" in text, name
        assert sub[name].description, name
    assert "-m MODEL" in sub["run"].format_help()
    assert __version__
    # each command says its own exit codes, not run's
    assert "--fail-on caught a comparison" in sub["compare"].format_help()
    assert "no config kept the constraints" in sub["tune"].format_help()
    assert "a threshold" not in sub["validate"].format_help()
    assert "the report folder was rendered again" in sub["report"].format_help()
    # tune shows only what tune accepts; --budget reads a duration on tune and capacity alike
    assert "--workers" not in sub["tune"].format_help()
    assert "--baseline" not in sub["capacity"].format_help()
    assert "'10m'" in sub["capacity"].format_help() and "'15m'" in sub["tune"].format_help()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_target_that_is_down_fails_at_once_and_says_why(tmp_path) -> None:
    t0 = time.monotonic()
    proc = loadkit("run", "-m", "dense", "-u", f"127.0.0.1:{_free_port()}", "--out",
                   str(tmp_path / "r"), timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "nothing listens there (connection refused)" in proc.stderr
    assert "waiting up to" in proc.stderr  # said what it waited for, then gave up
    assert took < 10, took  # 2 s of refusals (plus the interpreter's start)


def test_the_http_port_is_named_as_such(triton, tmp_path) -> None:
    proc = loadkit("run", "-m", "dense", "-u", triton.http_address, "--out",
                   str(tmp_path / "r"), timeout=60)
    assert proc.returncode == 2
    assert "it answers HTTP, not gRPC" in proc.stderr and "usually 8001" in proc.stderr
    assert "TLS" not in proc.stderr


def test_a_misspelled_model_gets_a_did_you_mean(triton, tmp_path) -> None:
    proc = loadkit("run", "-m", "dens", "-u", triton.grpc_address, "--out",
                   str(tmp_path / "r"), timeout=60)
    assert proc.returncode == 2
    assert "the repository has no model 'dens'; did you mean 'dense'?" in proc.stderr


def test_run_needs_a_scenario_or_a_model(tmp_path) -> None:
    proc = loadkit("run", timeout=60)
    assert proc.returncode == 2 and "needs a scenario file, or -m MODEL" in proc.stderr
    proc = loadkit("run", "x.yaml", "-m", "dense", timeout=60)
    assert proc.returncode == 2 and "not both" in proc.stderr
    proc = loadkit("run", "-m", "dense", "--shape", "IN:0", timeout=60)
    assert proc.returncode == 2 and "--shape: expected NAME:D1,D2" in proc.stderr
    assert not Path("reports").joinpath("never").exists()
