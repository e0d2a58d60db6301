"""`repeats: auto`: rounds are looked at after each one, and the stated false-alarm rate holds
across the looks. Simulated rounds of known distributions go through the run's own judgement
(stats.comparisons at the design's nominal level, stopped as run/rounds.py Looks stops)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadkit.stats import comparisons, imprecise, undecided
from loadkit.stats.sequential import design, nominal_alpha

REPS = 1500


def _results(ref: list[float], new: list[float], noise: float) -> dict:
    def step(values: list[float]) -> dict:
        return {"load": {"concurrency": 1}, "throughput": float(np.mean(values)),
                "latency_us": {}, "rounds": [{"throughput": v} for v in values]}
    return {"phases": [{"name": "a", "steps": [step(ref)]}, {"name": "b", "steps": [step(new)]}],
            "noise_threshold": noise}


def _sequential(rng: np.random.Generator, draw, effect: float, confidence: float,
                noise: float, max_rounds: int = 10) -> tuple[str, int]:
    """One run of `repeats: auto`: rounds of A and B (B's throughput `effect` times A's, the
    same per-round drift on both), a look after each from the first; (verdict, rounds)."""
    d = design(0.95, max_rounds) if confidence is None else None
    level = d.nominal if d else confidence
    looks = d.looks if d else tuple(range(3, max_rounds + 1))
    a, b = [], []
    word = "inconclusive"
    for n in range(1, max_rounds + 1):
        drift = 1000.0 * math.exp(rng.normal(0, 0.2))  # the machine's minute-to-minute speed
        a.append(drift * draw(rng))
        b.append(drift * effect * draw(rng))
        if n not in looks:
            continue
        changes = comparisons(_results(a, b, noise), level, noise, max_rounds)
        (c,) = [c for c in changes if c["metric"] == "throughput"]
        word = c["verdict"]
        if not undecided(changes):
            return word, n
    return word, max_rounds


DISTRIBUTIONS = {
    "normal": lambda rng: 1.0 + rng.normal(0, 0.05),
    "lognormal, skewed": lambda rng: math.exp(rng.normal(0, 0.08)),
    "t with 3 df, heavy tails": lambda rng: 1.0 + 0.03 * rng.standard_t(3),
}


@pytest.mark.fast
@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_aa_false_alarms_hold_at_the_stated_level_across_the_looks(name: str) -> None:
    """With no change and no noise threshold (so nothing but the test decides), looking after
    every round from 3 to 10 calls `better`/`worse` in at most 5% (+3 standard errors) of runs
    at the design's level; at a fixed 95% per look the same looks call it far more often."""
    draw = DISTRIBUTIONS[name]
    rng = np.random.default_rng(7)
    alarms = sum(_sequential(rng, draw, 1.0, None, 0.0)[0] in ("better", "worse")
                 for _ in range(REPS))
    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / REPS)
    assert alarms / REPS <= bound, (name, alarms / REPS)
    if name == "normal":  # the looks are what the design pays for
        rng = np.random.default_rng(7)
        naive = sum(_sequential(rng, draw, 1.0, 0.95, 0.0)[0] in ("better", "worse")
                    for _ in range(REPS))
        assert naive / REPS > 0.09, naive / REPS


@pytest.mark.fast
def test_auto_decides_a_clear_change_early_and_an_equivalence_too() -> None:
    """A 10% change at a 3% per-round spread is `better` within a few looks; an A/A pair at a
    1% spread is `same` (its interval inside ±5%) just as soon: auto stops on either."""
    rng = np.random.default_rng(3)
    spread = lambda r: 1.0 + r.normal(0, 0.03)  # noqa: E731
    better = [_sequential(rng, spread, 1.10, None, 0.05) for _ in range(200)]
    assert sum(w == "better" for w, _ in better) >= 190, better
    assert float(np.median([n for _, n in better])) <= 6
    tight = lambda r: 1.0 + r.normal(0, 0.01)  # noqa: E731
    same = [_sequential(rng, tight, 1.0, None, 0.05) for _ in range(200)]
    assert sum(w == "same" for w, _ in same) >= 190
    assert float(np.median([n for _, n in same])) <= 4


@pytest.mark.fast
def test_the_nominal_level_is_deterministic_and_above_the_stated_one() -> None:
    d = design(0.95, 10)
    assert d.looks == tuple(range(3, 11)) and 0.95 < d.nominal < 0.995
    assert nominal_alpha(0.05, (3,)) == 0.05  # one look: no adjustment
    assert design(0.95, 10).nominal == d.nominal
    assert "Pocock" in d.describe()


def test_a_run_with_nothing_to_compare_is_imprecise_until_its_intervals_are_narrow() -> None:
    def results(ci: list[float] | None) -> dict:
        return {"phases": [{"name": "main", "steps": [{"load": {"concurrency": 4}, "intervals": {
            "throughput": {"value": 400.0, "ci": ci}}}]}]}
    assert imprecise(results([390.0, 410.0]), 0.025) == []  # ±2.5%
    wide = imprecise(results([380.0, 420.0]), 0.025)  # ±5%
    assert [(w["metric"], w["reach_pct"]) for w in wide] == [("throughput", 5.0)]
    assert imprecise(results(None), 0.025)[0]["reach_pct"] is None  # no interval yet
