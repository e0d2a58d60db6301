"""Capacity planning: the search's pure parts, then real searches on the embedded Triton."""

from __future__ import annotations

import math
from typing import Any

import pytest
from conftest import dense_b1, load, loadkit, results, scenario, write

from loadkit.errors import CapacityInputError
from loadkit.search.capacity import (
    Probe,
    Search,
    parse_peak,
    parse_rate,
    phase_summary,
    replicas,
)
from loadkit.slo import judge_step, parse_slo


@pytest.mark.fast
def test_parse_slo_reads_terms_and_adds_default_limits() -> None:
    slo = {t.metric: t.limit for t in parse_slo("p99<50ms, p50<=800us")}
    assert slo == {"p99": 50_000, "p50": 800, "error_rate": 0.01, "max_dropped": 0.01}
    assert {t.metric: t.limit for t in parse_slo("p99.9<1s,error_rate<0.5%")}["error_rate"] == 0.005


@pytest.mark.fast
def test_parse_slo_reads_streaming_terms() -> None:
    """A capacity search can be written in TTFT / ITL / goodput, as LLM SLOs are."""
    slo = {t.metric: t.limit for t in parse_slo(
        "first_response_p99<200ms, inter_response_p95<20ms, goodput_min>=5/s")}
    assert slo["first_response_p99"] == 200_000 and slo["inter_response_p95"] == 20_000
    assert slo["goodput_min"] == 5


@pytest.mark.fast
@pytest.mark.parametrize("text", ["p99>50ms", "p99<50", "error_rate<1%", "p42<1ms", "",
                                  "goodput_min<5", "first_response_p99>1s",
                                  "inter_response_p42<1ms"])
def test_parse_slo_refuses_what_it_cannot_read(text) -> None:
    with pytest.raises(CapacityInputError, match="--slo"):
        parse_slo(text)


@pytest.mark.fast
def test_parse_rate_and_replicas() -> None:
    assert parse_rate("3000/s", "--peak") == 3000 and parse_rate("12.5", "--peak") == 12.5
    with pytest.raises(CapacityInputError, match="--peak"):
        parse_rate("fast", "--peak")
    # 3000/s at 30% headroom on replicas of 1000/s: each may run at 700/s -> 5 replicas
    assert replicas(3000, 1000, 0.3) == 5 and replicas(700, 1000, 0.3) == 1


@pytest.mark.fast
def test_a_peak_is_a_rate_or_a_multiple_of_replayed_traffic() -> None:
    assert parse_peak("3000/s") == (3000, None) and parse_peak("3x") == (None, 3.0)
    assert parse_peak(" 2.5 x ") == (None, 2.5)
    for bad in ("0x", "x", "3y", "-1x"):
        with pytest.raises(CapacityInputError, match="--peak: expected a rate such as 3000/s"):
            parse_peak(bad)


@pytest.mark.fast
def test_a_replay_phase_answers_in_speed_and_sizes_its_peak() -> None:
    """The speed search's answer: the file's mean rate at the highest speed that held, and
    replicas for `--peak 3x` (or for a rate, turned into a speed of the file)."""
    search = Search(start=1.0, min_rate=0.01, max_rate=1000)
    _drive(search, 2.2)  # the traffic holds up to 2.2x as fast
    speed = search.lo
    assert search.confirmed and 2.0 <= speed <= 2.2
    out = phase_summary("replay", search, "found", "", None, 0.3, 1.0, replay_rate=200.0,
                        peak_speed=3.0)
    assert out["search"] == "speed" and out["max_speed"] == speed
    assert out["max_rate"] == round(speed * 200, 2) and out["rate_at_speed_1"] == 200
    assert out["replicas"] == math.ceil(3 / (speed * 0.7) - 1e-9) == 2
    # a peak given as a rate is that rate's multiple of the file: 1200/s = 6x of 200/s
    out = phase_summary("replay", search, "found", "", 1200.0, 0.3, 1.0, replay_rate=200.0)
    assert out["peak_speed"] == 6 and out["replicas"] == math.ceil(6 / (speed * 0.7) - 1e-9)
    # a rate phase cannot be sized by a multiple of traffic it did not replay: it says so
    rate = Search(start=100)
    _drive(rate, 500)
    out = phase_summary("rate", rate, "found", "", None, 0.3, 1.0, peak_speed=3.0)
    assert "replicas" not in out and "--peak 3x is a multiple of replayed traffic" in out["reason"]


def _drive(search: Search, capacity: float, outcome: Any = None) -> list[tuple[float, str]]:
    """Answer the search with a server whose SLO breaks above `capacity`."""
    asked = []
    while (nxt := search.next_rate()) is not None:
        rate, kind = nxt
        asked.append((rate, kind))
        search.record(Probe(rate=rate, kind=kind, passed=rate <= capacity, broken=[],
                            step=len(asked), latency_us={}, achieved_rate=rate,
                            generator_limited=False,
                            outcome=outcome(rate) if outcome else "no interval"))
        assert len(asked) < 40
    return asked


def _sure(capacity: float, spread: float) -> Any:
    """Outcomes of a server whose SLO breaks above `capacity`, judged with intervals that are
    sure only `spread` away from it."""
    def outcome(rate: float) -> str:
        return ("held" if rate <= capacity * (1 - spread) else
                "broken" if rate >= capacity * (1 + spread) else "inconclusive")
    return outcome


@pytest.mark.fast
def test_the_answer_carries_the_interval_where_the_slo_held_and_broke_with_confidence() -> None:
    """Near the edge probes are inconclusive; after confirming, the search probes 15% below and
    above until the SLO holds (breaks) with confidence, so the interval brackets the answer
    with measured ends, and the answer of another run with other luck falls inside it."""
    s = Search(start=100, precision=0.05)
    sure = _sure(730, 0.2)
    asked = _drive(s, capacity=730, outcome=sure)
    edges = [r for r, k in asked if k == "edge"]
    assert edges and s.confirmed, asked
    low, high = s.interval()
    # below the interval every probe held with confidence; its top broke with confidence
    assert low is not None and high is not None and high >= 730 * 1.2
    assert low <= s.lo < high and low <= 730 <= high
    assert any(p.outcome == "held" and p.rate < low for p in s.probes)
    out = phase_summary("p", s, "found", "", None, 0.3, 1.0)
    assert out["interval"] == [low, high] and "with confidence" in out["interval_note"]
    # no probe with an interval: no edge probes, and the summary says why
    bare = Search(start=100, precision=0.05)
    assert not [k for _, k in _drive(bare, capacity=730) if k == "edge"]
    assert "no probe had an interval" in phase_summary("p", bare, "found", "", None, 0.3,
                                                       1.0)["interval_note"]


@pytest.mark.fast
def test_search_brackets_bisects_and_confirms() -> None:
    s = Search(start=100, precision=0.05)
    asked = _drive(s, capacity=730)
    assert [r for r, _ in asked[:5]] == [100, 200, 400, 800, 600]  # doubling, then bisecting
    assert asked[-1] == (s.lo, "confirm") and s.confirmed
    assert 730 / 1.05 <= s.lo <= 730 and s.hi is not None and (s.hi - s.lo) / s.lo <= 0.05


@pytest.mark.fast
def test_search_halves_down_when_the_start_is_too_high_and_stops_at_the_floor() -> None:
    s = Search(start=1000, precision=0.1)
    _drive(s, capacity=90)
    assert s.confirmed and 90 / 1.1 <= s.lo <= 90
    never = Search(start=10, min_rate=1)
    _drive(never, capacity=0)
    assert never.lo is None and never.stopped == "floor"


@pytest.mark.fast
def test_a_failed_confirmation_moves_the_answer_down() -> None:
    s = Search(start=100, precision=0.1)
    flaky = {"done": False}
    while (nxt := s.next_rate()) is not None:
        rate, kind = nxt
        ok = rate <= 500
        if kind == "confirm" and not flaky["done"]:
            ok, flaky["done"] = False, True  # the first repeat breaks
        s.record(Probe(rate=rate, kind=kind, passed=ok, broken=[], step=0, latency_us={},
                       achieved_rate=rate, generator_limited=False))
    assert s.confirmed and s.lo is not None and s.lo < 500


@pytest.mark.fast
def test_after_a_failed_confirmation_every_probe_is_long() -> None:
    s = Search(start=100, precision=0.1)
    kinds = []
    while (nxt := s.next_rate()) is not None:
        rate, kind = nxt
        kinds.append((kind, s.long(kind)))
        # short probes pass up to 500, long ones only up to 420
        s.record(Probe(rate=rate, kind=kind, passed=rate <= (420 if s.long(kind) else 500),
                       broken=[], step=0, latency_us={}, achieved_rate=rate,
                       generator_limited=False))
    first_confirm = next(i for i, (k, _) in enumerate(kinds) if k == "confirm")
    assert not any(long for _, long in kinds[:first_confirm])
    assert all(long for _, long in kinds[first_confirm:])
    assert s.confirmed and s.lo is not None and 420 / 1.1 <= s.lo <= 420


@pytest.mark.fast
def test_judge_step_names_what_broke() -> None:
    slo = parse_slo("p99<10ms")
    step = {"status": "ok", "requests": 100, "errors": {"UNAVAILABLE": 5}, "client": {},
            "throughput": 10.0, "latency_us": {"p99": 12_000.0},
            "open_loop": {"dropped_ratio": 0.0, "scheduled": 105}}
    ok, broken = judge_step(slo, step)
    assert not ok and broken == ["p99 12.000 ms", "error_rate 4.76%"]


def capacity_scenario(rate: float, dur: str) -> str:
    """One open-loop phase on dense behind a 4 ms "device" sleep per execute: capacity
    (~200/s) set by the model, not by the CPU the generator and the server fight over on a
    small box. With 1 ms, the python backend's own ~0.5 ms per request was a third of the
    service time, and this VM's drift in it moved the edge by 30%: confirmations at the edge
    failed three times running in CI."""
    return scenario("cap", [{
        "name": "baseline",
        "config": {"dense": {"parameters": {"device_us": {"string_value": "4000"}}}},
        "load": load(f"{rate}/s", dur, arrival="constant", max_concurrency=64)}],
        {"dense_b1": dense_b1(seed=7)})
SLO = "p99<50ms"  # above what 64 in flight can queue: the cap (drops) decides, sharply


def _search(triton, tmp_path, name: str) -> dict:
    scen = write(tmp_path / f"{name}.yaml", capacity_scenario(100, "3s"))
    out = tmp_path / name
    # starts at 100/s and stops at a 15% bracket: two probes fewer per search than 50/s and
    # 10%, and the answer is still checked by a fixed run 10% below it
    proc = loadkit("capacity", str(scen), "--slo", SLO, "--peak", "5000/s", "--precision",
                   "0.15", "--budget", "120", "--target", triton.grpc_address, "--out", str(out),
                   "--quiet", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = results(out)
    assert data["status"] == "complete"
    assert (out / "capacity_search.png").stat().st_size > 10_000
    assert "Capacity at SLO p99<50ms" in (out / "summary.md").read_text()
    assert "Capacity at SLO" in (out / "report.html").read_text()
    assert "Capacity at SLO" in (out / "comparison.md").read_text()
    return data


def _answer(data: dict) -> float:
    (phase,) = data["capacity"]["phases"]
    assert phase["status"] == "found" and phase["confirmed"], phase
    assert {p["kind"] for p in phase["points"]} >= {"bracket", "confirm"}
    # every probe is an ordinary measured step with exact accounting
    steps = data["phases"][0]["steps"]
    assert len(steps) == len(phase["points"])
    for probe, step in zip(phase["points"], steps, strict=True):
        assert step["load"]["rate"] == probe["rate"]
        assert step["server"]["dense"]["success"] == step["requests"]
    assert phase["replicas"] == math.ceil(5000 / (phase["max_rate"] * 0.7) - 1e-9)
    assert data["capacity"]["cheapest"] == "baseline"
    # the confirmation says whether it held the SLO with confidence or inconclusively
    (p99,) = [c for c in phase["slo_confidence"] if c["metric"] == "p99"]
    assert p99["verdict"] in ("held", "inconclusive"), p99
    assert p99["value_us"] <= p99["limit_us"] and p99["ci_us"][0] <= p99["value_us"]
    return float(phase["max_rate"])


def _agreeing(answers: list[float]) -> list[tuple[float, float]]:
    pairs = [(x, y) for i, x in enumerate(answers) for y in answers[i + 1:]]
    return [p for p in pairs if max(p) / min(p) <= 1.2]


def test_capacity_search_is_stable_and_its_answer_holds_as_a_fixed_rate(triton, tmp_path):
    # This test VM's own speed drifts by up to ~30% over minutes (CPU steal, the other test
    # worker): searches go on, at most four, until two agree within 20%. A search that saw the
    # edge move under it says so ("approximate", "stopped before confirming: unstable", as it
    # did once in CI beside a busy worker) and does not count; any other outcome fails.
    answers: list[float] = []
    drifted: list[str] = []
    for name in ("a", "b", "c", "d"):
        data = _search(triton, tmp_path, name)
        (phase,) = data["capacity"]["phases"]
        if phase["status"] == "approximate" and "unstable" in phase.get("reason", ""):
            drifted.append(phase["reason"])
            continue
        answers.append(_answer(data))
        if _agreeing(answers):
            break
    agreeing = _agreeing(answers)
    assert agreeing, (answers, drifted)  # two searches agree within 20%
    lo = min(agreeing[-1])
    # The reported max rate, run again as an ordinary fixed-rate phase 10% below it, holds the
    # SLO: the answer is the edge, where p99 is steepest, and this VM's service time drifts ~10%
    # between minutes (compute 1.28 vs 1.44 ms measured), so a re-run at exactly the edge fails
    # about half the time; 10% below it, it must hold.
    scen = write(tmp_path / "fixed.yaml", capacity_scenario(lo * 0.9, "4s"))
    outcomes = []
    for attempt in range(2):
        # As with the searches above: this VM's speed drifts over minutes (a fixed run at 180/s
        # after two searches that agreed on 200/s saw p99 59 ms once in CI), so a second fixed
        # run, minutes later, may decide; one of the two must hold.
        out = tmp_path / f"fixed{attempt}"
        proc = loadkit("run", str(scen), "--target", triton.grpc_address, "--out", str(out),
                       "--quiet")
        step = results(out)["phases"][0]["steps"][0]
        assert step["accounting"]["status"] == "ok", step["accounting"]
        ok, broken = judge_step(parse_slo(SLO), step)
        outcomes.append((proc.returncode, broken))
        if ok:
            assert proc.returncode == 0, proc.stderr[-2000:]
            break
    assert ok, (lo, outcomes)


@pytest.mark.parametrize(("flags", "message"), [
    (["--slo", "p99>5"], "--slo: 'p99>5': goodput_min takes '>' (a floor)"),
    (["--slo", "p99<5ms", "--headroom", "1.5"], "--headroom: expected a fraction in [0, 1)"),
    (["--slo", "p99<5ms", "--peak", "lots"], "--peak: expected a rate such as 3000/s, or a "
                                              "multiple of the replayed traffic such as 3x"),
    (["--slo", "p99<5ms", "--replay", "scenarios/data/bursty-trace.json.0"],
     "--replay scenarios/data/bursty-trace.json.0 with a scenario file: give the phase"),
    (["--slo", "p99<5ms", "--start-rate", "0x"], "--start-rate: expected a rate such as 100/s "
                                                 "or a replay's speed such as 4x; found '0x'"),
    (["--slo", "p99<5ms", "--min-probe", "0s"], "--min-probe: expected a duration above 0"),
    (["--slo", "p99<5ms", "--repeats", "0"], "--repeats: expected 1 to 50, or auto; found '0'"),
])
def test_bad_capacity_flags_exit_2_before_any_load(flags, message) -> None:
    proc = loadkit("capacity", "scenarios/capacity.yaml", *flags, "--target", "127.0.0.1:1")
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def _trace(path, starts: list[tuple[str, float]]) -> None:
    """A trace file as Triton writes one (level=TIMESTAMPS): per request an entry with its
    model and one with its REQUEST_START."""
    entries = []
    for i, (model, t) in enumerate(starts, 1):
        entries += [{"id": i, "model_name": model, "model_version": 1},
                    {"id": i, "timestamps": [{"name": "REQUEST_START",
                                              "ns": 10**12 + int(t * 1e9)}]}]
    import json
    path.write_text(json.dumps(entries))


def test_capacity_replay_searches_the_speed_of_a_trace(triton, tmp_path) -> None:
    """`loadkit capacity --replay TRACE --peak 3x` with no scenario: a template per traced
    model (inputs from the metadata), the speed bracketed and bisected, each probe an
    ordinary replay step of the whole file, and the replicas the 3x peak needs."""
    starts = [("dense", i / 150) for i in range(300)] + [("add_sub", i / 50) for i in range(100)]
    _trace(tmp_path / "trace.json", sorted(starts, key=lambda m: m[1]))
    out = tmp_path / "cap"
    proc = loadkit("capacity", "--replay", str(tmp_path / "trace.json"), "--slo", "p99<20ms",
                   "--peak", "3x", "--precision", "0.25", "--budget", "45", "--target",
                   triton.grpc_address, "--out", str(out), "--quiet", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = results(out)
    assert set(data["scenario"]["requests"]) == {"dense", "add_sub"}  # from the trace's models
    (phase,) = data["capacity"]["phases"]
    rate = phase["rate_at_speed_1"]  # 400 requests from the first start to the last
    assert phase["search"] == "speed" and 199 < rate < 202, phase
    assert phase["status"] in ("found", "approximate") and phase["max_speed"], phase
    assert abs(phase["max_rate"] / (phase["max_speed"] * rate) - 1) < 0.001
    assert phase["replicas"] == math.ceil(3 / (phase["max_speed"] * 0.7) - 1e-9)
    steps = data["phases"][0]["steps"]
    assert len(steps) == len(phase["points"]) >= 2
    for probe, step in zip(phase["points"], steps, strict=True):
        replay = step["open_loop"]["replay"]
        assert replay["speed"] == probe["rate"] and replay["format"] == "triton_trace"
        # the whole file, repeated whole until the probe lasts 5 s (at speed 4 the 2 s file
        # lasts half a second: one stall would decide the answer)
        times = math.ceil(5 / (400 / rate / probe["rate"]) - 1e-9)  # the file: 400 at `rate`
        assert step["open_loop"]["scheduled"] == 400 * times, (probe, step["open_loop"])
        assert step["duration_s"] >= 4.9 and replay["loop"] == (times > 1)
        offered = replay["per_second"]["offered"]
        assert sum(offered["dense"]) == 300 * times and sum(offered["add_sub"]) == 100 * times
        assert step["accounting"]["status"] == "ok", step["accounting"]
    summary = (out / "summary.md").read_text()
    assert "peak of 3x the replayed traffic" in summary and "| add_sub |" in summary
    assert (out / "replay.png").stat().st_size > 10_000
