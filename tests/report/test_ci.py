"""docs/ci.md's CI gate, run as its examples write it: the baseline on main, then a pull request
whose config makes the model 2x slower (exit 1, a failing JUnit case), then one that leaves
it as it was (exit 0); and the gate's rules and refusals on stored reports."""

from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, loadkit, results, write

CI_DOC = (ROOT / "docs" / "ci.md").read_text()


def _pipelines() -> dict[str, dict]:
    blocks = re.findall(r"```yaml ci\n(.*?)```", CI_DOC, re.S)
    out = {}
    for text in blocks:
        name = text.splitlines()[0].lstrip("# ").strip()
        out[name] = yaml.safe_load(text)
    return out


def _commands() -> tuple[str, str]:
    """The baseline and the gate command, the same in both pipelines."""
    gh = _pipelines()[".github/workflows/load-test.yml"]
    runs = [s["run"] for s in gh["jobs"]["load-test"]["steps"] if "loadkit" in s.get("run", "")]
    gl = _pipelines()[".gitlab-ci.yml"]
    lab = [c for job in gl.values() for c in job["script"] if c.startswith("loadkit")]
    assert runs == lab and len(runs) == 2, (runs, lab)
    return runs[0], runs[1]


def _run(command: str, cwd: Path, target: str) -> tuple[int, str]:
    args = shlex.split(command)
    assert args[:2] == ["loadkit", "run"]
    proc = loadkit(*args[1:], "--target", target, "--quiet", cwd=cwd, timeout=300)
    return proc.returncode, proc.stderr


def test_the_ci_examples_gate_a_slower_config_and_pass_an_unchanged_one(triton,
                                                                        tmp_path: Path) -> None:
    baseline_cmd, gate_cmd = _commands()
    checkout = tmp_path / "checkout"
    (checkout / "scenarios").mkdir(parents=True)
    scenario = (ROOT / "scenarios" / "ci-regression.yaml").read_text()
    assert 'device_us: "2000"' in scenario
    write(checkout / "scenarios" / "ci-regression.yaml", scenario)
    code, err = _run(baseline_cmd, checkout, triton.grpc_address)  # main
    assert code == 0, err[-3000:]
    base = results(checkout / "reports" / "baseline")
    # nothing to compare on main: rounds until its estimates are precise enough for the gate to
    # lean on (three rounds, 2 degrees of freedom, left a 1.5x slowdown inconclusive on CI)
    stopped = base["sequential"]["stopped"]
    assert stopped.startswith(("precise", "max_")) and base["repeats"] >= 3, stopped
    assert all("imprecise" in look for look in base["sequential"]["looks"])

    # a pull request that makes every execute 2x longer: throughput is worse beyond doubt (a
    # 1.5x one read only -11% beside a busy test worker, and stayed inconclusive at 99%)
    write(checkout / "scenarios" / "ci-regression.yaml",
          scenario.replace('device_us: "2000"', 'device_us: "4000"'))
    code, err = _run(gate_cmd, checkout, triton.grpc_address)
    assert code == 1, err[-3000:]
    assert "gate (worse): FAILED" in err and "throughput: worse" in err, err[-3000:]
    pr = checkout / "reports" / "pr"
    gate = json.loads((pr / "gate.json").read_text())
    worse = [c for c in gate["comparisons"] if c["verdict"] == "worse"]
    assert any(c["metric"] == "throughput" and c["delta_pct"] < -15 for c in worse), gate
    assert any("configs differ" in w for w in gate["warnings"]), gate["warnings"]
    suite = ET.parse(pr / "gate.junit.xml").getroot().find("testsuite")
    assert int(suite.get("failures")) == len(worse) >= 1
    assert int(suite.get("tests")) == len(gate["comparisons"])
    # auto looked at the comparisons with the baseline: a clear answer needs few rounds
    assert results(pr)["sequential"]["looks"][0]["comparisons"] >= 1

    # the pull request reverted: nothing is worse, and the job passes
    write(checkout / "scenarios" / "ci-regression.yaml", scenario)
    code, err = _run(gate_cmd, checkout, triton.grpc_address)
    assert code == 0, err[-3000:]
    gate = json.loads((pr / "gate.json").read_text())
    assert gate["passed"] and not any(c["verdict"] == "worse" for c in gate["comparisons"])

    # the same gate on the two stored reports, no load sent: per metric, and the refusals
    again = loadkit("compare", str(checkout / "reports" / "baseline"), str(pr), "--fail-on",
                    "worse:throughput,p99", "--junit", str(tmp_path / "g.xml"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert ET.parse(tmp_path / "g.xml").getroot().find("testsuite").get("failures") == "0"
    bad = loadkit("compare", str(checkout / "reports" / "baseline"), str(pr), "--fail-on",
                  "worse:p77")
    assert bad.returncode == 2 and "unknown metric p77" in bad.stderr, bad.stderr


@pytest.mark.fast
def test_the_gate_judges_words_per_rule_and_refuses_nothing_in_common() -> None:
    from loadkit.errors import ReportError
    from loadkit.report.gate import judge, parse_rules

    def run(rounds: list[float], name: str = "release", load: int = 4) -> dict:
        return {"noise_threshold": 0.05, "confidence": 0.95, "target": "t", "phases": [
            {"name": name, "config": {}, "steps": [{
                "load": {"concurrency": load}, "throughput": sum(rounds) / len(rounds),
                "latency_us": {"p99": 1000.0}, "client": {},
                "rounds": [{"throughput": v, "latency_us": {"p99": 1000.0}} for v in rounds],
                "intervals": {"throughput": {"value": sum(rounds) / len(rounds), "se": 2.0,
                                             "df": len(rounds) - 1},
                              "p99": {"value": 1000.0, "se": 5.0, "df": 2}}}]}]}

    base, slower = run([500, 505, 495]), run([330, 335, 325])
    g = judge(base, slower, parse_rules(["worse"]))
    assert not g.passed and [c["metric"] for c in g.failed] == ["throughput"]
    assert judge(base, slower, parse_rules(["worse:p99"])).passed  # p99 is the same
    assert judge(base, run([501, 499, 500]), parse_rules(["worse"])).passed
    for spec in ("better", "worse:", "worse:p77"):
        with pytest.raises(ReportError):
            parse_rules([spec])
    with pytest.raises(ReportError, match="share no phase and load"):
        judge(base, run([500, 500, 500], name="other"), parse_rules(["worse"]))
    with pytest.raises(ReportError, match="their loads differ"):
        judge(base, run([500, 500, 500], load=8), parse_rules(["worse"]))
