"""Scenario parsing and validation: a table-driven corpus of bad scenarios, each with the exact
message expected (file:line, key path, what was found and expected), plus good ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT, loadkit, write

from loadkit.errors import ScenarioError
from loadkit.plan import build_plan
from loadkit.scenario import checked_against, load_scenario, parse_ramp

BAD = ROOT / "tests" / "bad_scenarios"
OFFLINE = sorted((BAD / "offline").glob("*.yaml"))
SERVER = sorted((BAD / "server").glob("*.yaml"))


def expectation(path: Path) -> tuple[int, str, str]:
    first = path.read_text().splitlines()[0]
    m = re.match(r"# expect: (\d+) (\S*): (.*)$", first)
    assert m, f"{path.name} lacks an '# expect: LINE PATH: MESSAGE' header"
    return int(m.group(1)), m.group(2), m.group(3)


def assert_reported(problems: list, path: Path) -> None:
    line, key, message = expectation(path)
    for p in problems:
        if p.line == line and p.path == key and message in p.message:
            assert p.file == str(path)
            return
    listing = "\n".join(str(p) for p in problems)
    pytest.fail(f"expected {line} {key}: {message!r} in:\n{listing}")


@pytest.mark.fast
def test_corpus_is_large_enough() -> None:
    assert len(OFFLINE) + len(SERVER) >= 30


@pytest.mark.fast
@pytest.mark.parametrize("path", OFFLINE, ids=lambda p: p.stem)
def test_bad_scenario_offline(path: Path) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert_reported(info.value.problems, path)


@pytest.mark.parametrize("path", SERVER, ids=lambda p: p.stem)
def test_bad_scenario_against_server(path: Path, control) -> None:
    scenario = load_scenario(path)  # valid offline
    infos = {m: control.model_info(m) for m in scenario.models}
    with pytest.raises(ScenarioError) as info:
        checked_against(scenario, infos)  # completed from the models, then checked
    assert_reported(info.value.problems, path)


@pytest.mark.parametrize(
    "name",
    ["03_unknown_template_key", "07_ramp_stop_below_start", "25_yaml_bomb", "01_malformed_yaml"],
)
def test_cli_validate_bad_exits_2_without_traceback(name: str) -> None:
    path = BAD / "offline" / f"{name}.yaml"
    proc = loadkit("validate", str(path), timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    line, key, message = expectation(path)
    assert f"{path}:{line}:" in proc.stderr
    assert message in proc.stderr


def test_run_refuses_server_mismatch_before_sending(triton, control) -> None:
    path = BAD / "server" / "03_dtype_mismatch.yaml"
    before = control.counters(("dense",))["dense"]
    proc = loadkit(
        "run", str(path), "--target", triton.grpc_address, "--out", "/tmp/never", timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "model 'dense' expects FP32; found FP16" in proc.stderr
    assert "nothing was sent" in proc.stderr
    after = control.counters(("dense",))["dense"]
    assert after.success == before.success and after.fail == before.fail


@pytest.mark.fast
def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path / "many.yaml",
        """
requests:
  a: {model: dense, batch_size: 0, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
phases:
  - {name: x, load: {concurrency: 0, step_duration: -1}}
""",
    )
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    paths = {p.path for p in info.value.problems}
    assert {
        "requests.a.batch_size",
        "phases[0].load.concurrency",
        "phases[0].load.step_duration",
    } <= paths


@pytest.mark.fast
@pytest.mark.parametrize(
    ("spec", "levels"),
    [
        ("2:16:2", (2, 4, 6, 8, 10, 12, 14, 16)),
        ("1:4", (1, 2, 3, 4)),
        ("2:7:2", (2, 4, 6)),
        (8, (8,)),
        ([1, 3, 9], (1, 3, 9)),
    ],
)
def test_parse_ramp(spec, levels) -> None:
    assert parse_ramp(spec) == (levels, None)


@pytest.mark.fast
def test_ramp_written_unquoted_is_not_sexagesimal(tmp_path: Path) -> None:
    # YAML 1.1 would read 2:16:2 as 8162; the scenario means a ramp.
    path = write(
        tmp_path / "s.yaml",
        """
requests:
  a: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
phases:
  - name: ramp
    load: {concurrency: 2:16:2, step_duration: 1m30s, warmup: 500ms}
""",
    )
    s = load_scenario(path)
    assert s.phases[0].load.levels == (2, 4, 6, 8, 10, 12, 14, 16)
    assert s.phases[0].load.step_duration_s == 90.0
    assert s.phases[0].load.warmup_s == 0.5
    plan = build_plan(s)
    assert [st.concurrency for st in plan.steps] == list(range(2, 17, 2))
    assert "concurrency 2, 4, 6, 8, 10, 12, 14, 16" in plan.describe()


@pytest.mark.fast
def test_shipped_scenarios_validate() -> None:
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        load_scenario(path)


@pytest.mark.fast
def test_secret_header_is_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LK_TOKEN", "s3cr3t-value")
    path = write(
        tmp_path / "s.yaml",
        """
target:
  headers: {authorization: "Bearer ${LK_TOKEN}"}
requests:
  a: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
phases: [{name: x, load: {concurrency: 1, step_duration: 1s}}]
""",
    )
    s = load_scenario(path)
    assert ("authorization", "Bearer s3cr3t-value") in s.target.headers
    assert "s3cr3t-value" not in repr(s.redacted())
    assert "s3cr3t-value" not in repr(s.target)
