"""Verdicts that survive the noise: the statistics on their own (fast), then interleaved rounds
on the real embedded Triton: an A/A pair must be `same`, an A/B pair with a 4x change must be
`better`, every request still accounted for in the pooled steps."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from conftest import loadkit, results, write
from scipy import stats as sps

from loadkit.plan import Step
from loadkit.record import Second, StepWindow
from loadkit.stats import compare, comparisons, t_interval, text, verdict, within_run


def _step(throughput: float, p99: float, rounds: list[tuple[float, float]] | None = None,
          se: float | None = None) -> dict:
    s = {"load": {"concurrency": 4}, "throughput": throughput,
         "latency_us": {"p50": p99 / 4, "p90": p99 / 2, "p99": p99}}
    if rounds:
        s["rounds"] = [{"throughput": t, "latency_us": {"p50": p / 4, "p90": p / 2, "p99": p}}
                       for t, p in rounds]
    if se is not None:
        s["intervals"] = {m: {"value": v, "se": se * v, "df": 9}
                          for m, v in (("throughput", throughput), ("p99", p99))}
    return s


@pytest.mark.fast
def test_t_interval_is_students() -> None:
    xs = [10.0, 12.0, 11.0, 13.0]
    ti = t_interval(xs, 0.95)
    assert ti is not None and ti["df"] == 3
    lo, hi = sps.t.interval(0.95, 3, loc=11.5, scale=sps.sem(xs))
    assert math.isclose(ti["mean"] - ti["half"], lo) and math.isclose(ti["mean"] + ti["half"], hi)
    assert t_interval([1.0], 0.95) is None


@pytest.mark.fast
def test_verdict_direction_by_metric() -> None:
    assert verdict("throughput", [5.0, 9.0]) == "better"
    assert verdict("throughput", [-9.0, -5.0]) == "worse"
    assert verdict("p99", [-9.0, -5.0]) == "better"  # lower latency is better
    assert verdict("p99", [-3.0, 2.0]) == "inconclusive"  # no threshold: same is never earned
    assert verdict("p99", [-3.0, 2.0], -0.5, 0.05) == "same"  # inside ±5%
    assert verdict("p99", [-30.0, 20.0], -5.0, 0.05) == "inconclusive"  # not inside ±5%
    assert verdict("throughput", [1.0, 9.0], 5.0, 0.05) == "better"  # excludes 0, reaches 5%
    assert verdict("throughput", [1.0, 7.0], 4.0, 0.05) == "inconclusive"  # under 5%, not in
    assert verdict("throughput", [1.0, 4.0], 2.5, 0.05) == "same"  # significant, inside ±5%
    assert verdict("p99", None) == "unknown"


@pytest.mark.fast
def test_paired_rounds_see_through_a_drift_that_unpaired_numbers_would_not() -> None:
    """The machine slows 30% over the run; B is 10% faster than A in every round. Paired per
    round, B is `better` with a tight interval; A against an identical A is `same`."""
    drift = [1.0, 0.85, 0.7]
    a = _step(1000 * sum(drift) / 3, 10_000, [(1000 * d, 10_000 / d) for d in drift])
    b = _step(1100 * sum(drift) / 3, 9_000, [(1100 * d, 9_000 / d) for d in drift])
    c = compare(a, b, "throughput", 0.95)
    assert c is not None and c["verdict"] == "better" and c["delta_pct"] == 10.0
    assert c["ci_pct"][0] > 9 and c["ci_pct"][1] < 11, c
    assert compare(a, b, "p99", 0.95)["verdict"] == "better"
    again = _step(a["throughput"], 10_000, [(1000 * d * (1.01 if i % 2 else 0.99), 10_000 / d)
                                            for i, d in enumerate(drift)])
    assert compare(a, again, "throughput", 0.95)["verdict"] == "same"
    assert text(compare(a, b, "throughput", 0.95)).startswith("+10.0% [+")
    assert text(compare(a, again, "throughput", 0.95)) == "same (-0.3% [-3, +3], inside ±5%)"


@pytest.mark.fast
def test_a_significant_change_under_the_noise_threshold_is_same() -> None:
    """criterion.rs's noise threshold: B 3% faster in every round is significant (its
    interval excludes 0) and its whole interval lies inside ±5%, so `same` (equivalence), and
    the text says so; with the threshold at 0 it is `better`; 10% is above it and stays
    `better`."""
    drift = [1.0, 0.85, 0.7]
    a = _step(1000 * sum(drift) / 3, 10_000, [(1000 * d, 10_000 / d) for d in drift])
    b = _step(1030 * sum(drift) / 3, 10_000, [(1030 * d, 10_000 / d) for d in drift])
    c = compare(a, b, "throughput", 0.95)
    assert c["ci_pct"][0] > 0 and c["verdict"] == "same" and c["noise_pct"] == 5, c
    assert text(c) == "same (+3.0% [+3, +3], inside ±5%)"
    assert compare(a, b, "throughput", 0.95, noise=0.0)["verdict"] == "better"
    ten = _step(1100 * sum(drift) / 3, 10_000, [(1100 * d, 10_000 / d) for d in drift])
    assert compare(a, ten, "throughput", 0.95)["verdict"] == "better"


@pytest.mark.fast
def test_without_rounds_the_steps_own_intervals_are_combined() -> None:
    a, b = _step(1000, 10_000, se=0.02), _step(1500, 10_000, se=0.02)
    c = compare(a, b, "throughput", 0.95)
    assert c["verdict"] == "better" and "delta method" in c["method"]
    # +1% with 2% relative errors on each side: [-5%, +7%] is not inside ±5%: undecided
    c = compare(a, _step(1010, 10_000, se=0.02), "throughput", 0.95)
    assert c["verdict"] == "inconclusive" and c["rounds_needed"] > 1, c
    assert compare(_step(1000, 10_000, se=0.005), _step(1010, 10_000, se=0.005), "throughput",
                   0.95)["verdict"] == "same"
    assert compare(a, _step(1500, 10_000), "throughput", 0.95)["verdict"] == "unknown"


@pytest.mark.fast
def test_within_run_batch_means() -> None:
    """Per-second buckets grouped into contiguous batches: an interval that holds the step's
    own value and widens with the seconds' spread."""
    rng = random.Random(1)
    window = StepWindow(step=Step(phase_index=0, phase="p", index=0, concurrency=1, warmup_s=0.0,
                             duration_s=10.0))
    for i in range(10):
        sec = window.seconds.setdefault(i, Second())
        n = 1000 + rng.randint(-50, 50)
        sec.ok["t"] = n
        for _ in range(20):
            sec.hist.record_value(rng.randint(900, 1100))
    got = within_run(window.seconds, 10.0, {"t": 1}, {"throughput": 1000.0, "p99": 1090.0},
                     0.95)
    lo, hi = got["throughput"]["ci"]
    assert lo < 1000 < hi and hi - lo < 100, got["throughput"]
    assert "10 batches of 1 s" in got["throughput"]["method"]
    short = within_run(window.seconds, 1.5, {"t": 1}, {"throughput": 1000.0}, 0.95)
    assert short["throughput"]["ci"] is None and "too few" in short["throughput"]["method"]


@pytest.mark.fast
def test_comparisons_list_every_phase_load_and_metric_against_the_reference() -> None:
    res = {"phases": [{"name": "base", "steps": [_step(1000, 10_000, se=0.01)]},
                      {"name": "batched", "steps": [_step(2000, 8_000, se=0.01)]}]}
    out = comparisons(res, 0.9)
    assert {(c["phase"], c["reference"], c["metric"]) for c in out} >= {
        ("batched", "base", "throughput"), ("batched", "base", "p99")}
    thr = next(c for c in out if c["metric"] == "throughput")
    assert thr["verdict"] == "better" and thr["confidence"] == 0.9
    assert set(thr) >= {"phase", "reference", "load", "metric", "delta_pct", "ci_pct",
                        "confidence", "verdict"}


AB = """
name: verdicts
repeats: 3
confidence: {confidence}
requests:
  d: {{model: dense, inputs: {{INPUT0: {{dtype: FP32, shape: [256]}}}}}}
phases:
  - name: a
    load: {{concurrency: 4, step_duration: 1.5s, warmup: 0.3s}}
    config: {{dense: {{parameters: {{device_us: "2000"}}}}}}
  - name: {second}
    load: {{concurrency: 4, step_duration: 1.5s, warmup: 0.3s}}
    config: {{dense: {{parameters: {{device_us: "{device_us}"}}}}}}
"""


def _verdicts(triton, tmp_path: Path, second: str, device_us: int, confidence: str) -> dict:
    out = tmp_path / second
    proc = loadkit("run", str(write(tmp_path / f"{second}.yaml", AB.format(
        second=second, device_us=device_us, confidence=confidence))), "--target",
        triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = results(out)
    for p in data["phases"]:
        (step,) = p["steps"]
        assert step["accounting"]["status"] == "ok", step["accounting"]
        assert len(step["rounds"]) == 3 and all(r["accounting"] == "ok" for r in step["rounds"])
        # the pooled step is the rounds': requests add up, throughput is their pooled rate
        assert step["requests"] == sum(r["requests"] for r in step["rounds"])
        assert step["intervals"]["throughput"]["method"] == "across 3 interleaved rounds"
    return data


def test_an_aa_pair_is_same_and_an_ab_pair_is_better(triton, tmp_path: Path) -> None:
    """device_us 2000 against itself: never `better` or `worse` (at 99.9%, so that a false
    alarm is ~1 in 1000 runs), and `same` only with its whole interval inside ±5% (three
    rounds at 99.9% are rarely that narrow: `inconclusive`, with the rounds that would decide
    it); against 500 (one execute a quarter as long: ~4x the throughput at 4 in flight, dense
    does not batch here): `better` for throughput and p50 at 95%."""
    aa = _verdicts(triton, tmp_path, "a-again", 2000, "99.9%")
    for c in aa["comparisons"]:
        assert c["verdict"] in ("same", "inconclusive"), c
        if c["verdict"] == "same":
            assert c["ci_pct"][0] >= -5 and c["ci_pct"][1] <= 5, c
        else:
            assert "rounds_needed" in c and c["rounds_now"] == 3, c
    assert "Noise: the same phase" in (tmp_path / "a-again" / "summary.md").read_text()
    ab = _verdicts(triton, tmp_path, "faster", 500, "95%")
    by = {c["metric"]: c for c in ab["comparisons"]}
    assert by["throughput"]["verdict"] == "better" and by["throughput"]["ci_pct"][0] > 50, by
    assert by["p50"]["verdict"] == "better", by["p50"]
    assert by["p99"]["verdict"] != "worse", by["p99"]  # 1.5 s rounds: the tail may not tell
    md = (tmp_path / "faster" / "comparison.md").read_text()
    assert "| 4 | faster |" in md and "% [+" in md
    # loadkit compare of two runs, the 95% one first (the reference run's confidence holds):
    # paired within a run (its rounds were interleaved), never across runs
    out = tmp_path / "cmp"
    proc = loadkit("compare", str(tmp_path / "faster"), str(tmp_path / "a-again"), "--out",
                   str(out))
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((out / "comparison.json").read_text())
    assert saved["reference"] == "faster/a" and saved["warnings"] == []
    assert saved["confidence"] == 0.95
    same_run = [c for c in saved["comparisons"] if c["phase"] == "faster/faster"]
    assert same_run and all("paired" in c["method"] for c in same_run), same_run
    assert next(c for c in same_run if c["metric"] == "throughput")["verdict"] == "better"
    other = [c for c in saved["comparisons"] if c["phase"].startswith("a-again/")]
    assert other and all("delta method" in c["method"] for c in other), other


@pytest.mark.fast
def test_compare_warns_when_targets_configs_or_loads_differ() -> None:
    from loadkit.report.compare import differences

    def run(target: str, embedded: bool, config: dict, loads: list[int]) -> dict:
        return {"target": target, "embedded": embedded, "phases": [
            {"name": "base", "config": config,
             "steps": [{"load": {"concurrency": c}} for c in loads]}]}

    a = run("127.0.0.1:8001", True, {"dense": {"max_batch_size": 8}}, [4, 8])
    b = run("127.0.0.1:9001", False, {"dense": {"max_batch_size": 16}}, [4])
    found = differences([("A", a, {}), ("B", b, {})])
    assert len(found) == 3, found  # B shares phase base at concurrency 4
    assert "B ran against 127.0.0.1:9001, A against the embedded Triton" in found[0]
    assert "configs differ" in found[1] and "loads measured differ" in found[2]
    assert found[1].endswith("configs differ between A and B: dense.max_batch_size: 8 -> 16")
    assert differences([("A", a, {}), ("B", a, {})]) == []
    c = run("127.0.0.1:8001", True, {"dense": {"max_batch_size": 8}}, [16])
    said = differences([("A", a, {}), ("C", c, {})])
    assert any("C and A share no phase measured at the same load" in w for w in said), said


@pytest.mark.fast
def test_stability_is_perf_analyzers_rule() -> None:
    from loadkit.run.stability import stable
    from loadkit.scenario import Stability

    spec = Stability(within=0.05, windows=3, max_s=60)
    w = [{"throughput": t, "p99_us": 1000.0} for t in (500, 1000, 1020, 990)]
    assert stable(w, spec)  # the last three within 5% of their mean
    assert not stable(w[:3], spec)
    assert not stable([*w, {"throughput": 1000, "p99_us": 1300.0}], spec)  # p99 moved


STABLE = """
name: stable
requests:
  d: {{model: dense, inputs: {{INPUT0: {{dtype: FP32, shape: [256]}}}}}}
phases:
  - name: x
    load: {{concurrency: 1, step_duration: 1s, warmup: 0.2s,
            until_stable: {{within: {within}, windows: 3, max: {max}}}}}
    config: {{dense: {{parameters: {{device_us: "3000"}}}}}}
"""


def test_until_stable_extends_a_step_until_its_windows_agree(triton, tmp_path: Path) -> None:
    """A device-bound model at concurrency 1 agrees with itself within 50% after three 1 s
    windows; within 0.01% it never does, and the step says so at its maximum: `not stable` in
    summary.md, steps.csv and report.html, and the run fails (as perf_analyzer fails such a
    step) unless allow_unstable. Either way the whole window is reported, every request
    accounted for."""
    runs = {}
    for name, within, most in (("loose", "50%", "12s"), ("tight", "0.01%", "4s")):
        out = tmp_path / name
        proc = loadkit("run", str(write(tmp_path / f"{name}.yaml", STABLE.format(
            within=within, max=most))), "--target", triton.grpc_address, "--out", str(out),
            "--quiet")
        assert proc.returncode == (0 if name == "loose" else 1), proc.stderr[-2000:]
        (runs[name],) = results(out)["phases"][0]["steps"]
    tight_out = tmp_path / "tight"
    data = results(tight_out)
    assert data["status"] == "failed" and "not stable within 4 s" in data["reason"], data
    assert "allow_unstable: true" in data["reason"]
    assert "| 1 (not stable) |" in (tight_out / "summary.md").read_text()
    assert ",not stable\n" in (tight_out / "steps.csv").read_text()
    assert "<td class=l>not stable</td>" in (tight_out / "report.html").read_text()
    loose, tight = runs["loose"]["stability"], runs["tight"]["stability"]
    assert loose["stable"] and 3 <= len(loose["window_values"]) < 12, loose
    assert loose["measured_s"] < 11 and "agreed within 50%" in loose["reason"]
    assert not tight["stable"] and "not stable within 4 s" in tight["reason"], tight
    assert 2.9 < tight["measured_s"] < 5, tight  # a window starts only if it fits in max
    for step in runs.values():
        assert step["accounting"]["status"] == "ok", step["accounting"]
        assert step["duration_s"] >= 3


@pytest.mark.fast
def test_an_unstable_step_fails_the_run_unless_allowed() -> None:
    from loadkit.run.accounting import run_failures

    step = {"phase": "x", "index": 0, "requests": 10, "client": {}, "accounting": {},
            "stability": {"stable": False, "reason": "not stable within 6 s"}}
    found = run_failures({"phases": [{"name": "x", "status": "ok", "steps": [step]}]})
    assert any("not stable within 6 s" in r for r in found), found
    step["stability"]["allow_unstable"] = True
    assert run_failures({"phases": [{"name": "x", "status": "ok", "steps": [step]}]}) == []


@pytest.mark.fast
def test_an_enormous_interval_is_inconclusive_not_an_overflow() -> None:
    """A step whose seconds stalled (a queue guard's 500 ms waits) has a standard error far
    above its value: the change's interval is capped, says `inconclusive` (never `same`), and
    that no number of rounds would decide it at this spread."""
    a, b = _step(1000, 10_000, se=0.02), _step(900, 10_000, se=400.0)
    c = compare(a, b, "throughput", 0.95)
    assert c["verdict"] == "inconclusive" and c["ci_pct"][1] > 1e6, c
    assert c["rounds_needed"] is None
    assert text(c).startswith("inconclusive (-10.0% [-100, >+99999]; not reachable within 50")


@pytest.mark.fast
def test_back_to_back_rounds_are_not_paired_and_raced_measurements_are_averaged() -> None:
    """Rounds taken back to back (a tune trial's, a capacity probe's) were not measured beside
    the other step's: the paired method would take the drift between them for the change."""
    from loadkit.stats import mean_step

    a = _step(100, 1000, [(100, 1000), (110, 900), (90, 1100)])
    b = _step(150, 700, [(150, 700), (160, 650), (140, 750)])
    for s in (a, b):
        s["intervals"] = {"throughput": {"value": s["throughput"], "se": 5.0, "df": 2}}
    assert "paired" in compare(a, b, "throughput", 0.95)["method"]
    for r in (*a["rounds"], *b["rounds"]):
        r["order"] = "back-to-back"
    assert "delta method" in compare(a, b, "throughput", 0.95)["method"]
    # a trial raced three times stands for the mean of its measurements, with their interval
    m = mean_step([_step(100, 1000), _step(120, 900), _step(110, 1100)], 0.95)
    assert m["throughput"] == pytest.approx(110) and m["latency_us"]["p99"] == pytest.approx(1000)
    ti = t_interval([100, 120, 110], 0.95)
    assert m["intervals"]["throughput"]["ci"] == pytest.approx(
        [110 - ti["half"], 110 + ti["half"]])
    assert m["intervals"]["throughput"]["method"] == "across 3 separate rounds"
    assert mean_step([a], 0.95) is a


TUNE_REPEATS = """
name: tune-repeats
requests:
  d: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
tune:
  config: {dense: {parameters: {device_us: "2000"}}}
  models: {dense: {dynamic_batching: [off, on]}}
  load: {concurrency: 8, step_duration: 1s, warmup: 0.3s}
  objective: {maximize: throughput}
  constraints: {p99: 500ms}
"""


def test_tune_and_capacity_measure_each_point_in_repeats_rounds(triton, tmp_path: Path) -> None:
    """`--repeats 2` on tune: every trial's step is two rounds back to back, pooled, with its
    intervals from them, and the winner's gain has its interval (batching at 8 in flight on a
    2 ms execute: several times the throughput). On capacity: every probe is two rounds, and
    the confirmation's SLO judgement comes from them."""
    out = tmp_path / "tune"
    proc = loadkit("tune", str(write(tmp_path / "t.yaml", TUNE_REPEATS)), "--target",
                   triton.grpc_address, "--strategy", "brute", "--repeats", "2", "--out",
                   str(out), "--quiet", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = results(out)
    assert data["repeats"] == 2
    for p in data["phases"]:
        (step,) = p["steps"]
        assert [r["order"] for r in step["rounds"]] == ["back-to-back"] * 2, p["name"]
        assert step["accounting"]["status"] == "ok" and step["requests"] == sum(
            r["requests"] for r in step["rounds"])
        assert step["intervals"]["throughput"]["method"] == "across 2 back-to-back rounds"
    gain = data["tune"]["gain"]["throughput_change"]
    assert gain["verdict"] == "better" and gain["ci_pct"][0] > 5, gain  # 2 rounds: wide
    assert "delta method" in gain["method"]  # not paired: the rounds were not side by side
    cap = tmp_path / "cap"
    scen = write(tmp_path / "c.yaml", """
name: cap-repeats
requests: {d: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}}
phases:
  - name: base
    config: {dense: {parameters: {device_us: "4000"}}}
    load: {rate: 100, arrival: constant, max_concurrency: 64, step_duration: 1s, warmup: 0.3s}
""")
    proc = loadkit("capacity", str(scen), "--slo", "p99<50ms", "--precision", "0.5",
                   "--budget", "40", "--repeats", "2", "--target", triton.grpc_address,
                   "--out", str(cap), "--quiet", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = results(cap)
    (phase,) = data["capacity"]["phases"]
    steps = data["phases"][0]["steps"]
    assert len(steps) == len(phase["points"]) >= 2
    for step in steps:
        assert len(step["rounds"]) == 2 and step["accounting"]["status"] == "ok"
    assert phase["status"] in ("found", "approximate"), phase
    if phase["status"] == "found":
        (p99,) = [c for c in phase["slo_confidence"] if c["metric"] == "p99"]
        assert "2 back-to-back rounds" in p99["method"], p99


AUTO = """
name: auto
repeats: auto
max_repeats: 5
requests:
  d: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
  s:
    model: add_sub
    inputs: {INPUT0: {dtype: FP32, shape: [4]}, INPUT1: {dtype: FP32, shape: [4]}}
mix: {d: 1, s: 1}
phases:
  - name: a
    load: {concurrency: 2, step_duration: 1.5s, warmup: 0.3s}
    config: {dense: {parameters: {device_us: "2000"}}}
  - name: b
    load: {concurrency: 2, step_duration: 1.5s, warmup: 0.3s}
    config: {dense: {parameters: {device_us: "500"}}}
"""


def test_repeats_auto_stops_when_decided_and_compares_a_mixed_step_per_template(
        triton, tmp_path: Path) -> None:
    """Two models mixed in one step, dense made 4x faster in the second phase: auto takes
    interleaved rounds from 3 until every comparison is decided (or 5), every pooled step and
    round accounted for; each template is compared on its own (dense `better`), the step's
    merged percentiles are not compared (two models, two modes), and every word is earned."""
    out = tmp_path / "auto"
    proc = loadkit("run", str(write(tmp_path / "auto.yaml", AUTO)), "--target",
                   triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = results(out)
    seq = data["sequential"]
    assert 3 <= data["repeats"] == seq["rounds"] <= 5 and seq["stopped"], seq
    assert seq["looks"][0]["round"] == 3 and 0.95 < seq["nominal_confidence"] < 0.99
    assert [look["round"] for look in seq["looks"]] == list(range(3, data["repeats"] + 1))
    for p in data["phases"]:
        (step,) = p["steps"]
        assert step["accounting"]["status"] == "ok", step["accounting"]
        assert len(step["rounds"]) == data["repeats"]
        assert all(r["accounting"] == "ok" and set(r["templates"]) == {"d", "s"}
                   for r in step["rounds"])
    merged = {c["metric"] for c in data["comparisons"] if "template" not in c}
    assert merged == {"throughput"}, merged  # no p50/p90/p99 of two models merged
    per = {(c["template"], c["metric"]): c for c in data["comparisons"] if "template" in c}
    assert per[("d", "throughput")]["verdict"] == "better", per[("d", "throughput")]
    assert per[("d", "p50")]["verdict"] == "better", per[("d", "p50")]
    assert "paired over" in per[("s", "p99")]["method"]
    for c in data["comparisons"]:
        assert c["verdict"] in ("better", "worse", "same", "inconclusive"), c
        if c["verdict"] == "same":
            assert c["ci_pct"][0] >= -5 and c["ci_pct"][1] <= 5, c
    md = (out / "comparison.md").read_text()
    assert "merged percentiles are not compared" in md and "| 2 | b | d (dense) |" in md
    assert "Rounds: `repeats: auto` took" in (out / "summary.md").read_text()
