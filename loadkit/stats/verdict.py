"""Whether a difference is real: the change of one step against another, its interval, and
the word a reader (or a CI job) acts on.

A comparison of two steps of one run with the same rounds pairs them round by round (the
rounds were interleaved: a drift hits both alike) and takes t over the per-round log ratios;
otherwise it combines the two steps' own intervals (delta method on the log ratio, Welch-
Satterthwaite degrees of freedom). Four words, each earned (docs/verdicts.md):

- `better` / `worse`: the interval excludes 0 and the change reaches the noise threshold;
- `same`: the whole interval lies inside +-threshold (equivalence, as two one-sided tests);
- `inconclusive`: anything else, with the rounds that would likely decide it at the spread
  measured, or "not reachable" within the rounds allowed;
- `unknown`: no interval could be had (a step too short, a metric one side lacks).
"""

from __future__ import annotations

import math
from typing import Any

from scipy import special

from loadkit.stats.intervals import (
    HIGHER_IS_BETTER,
    METRICS,
    NOISE_THRESHOLD,
    PERCENTILES,
    metric_of,
    t_interval,
)

DECISIVE = ("better", "worse", "same")
MAX_ROUNDS = 50  # the most rounds a run may take (scenario/model.py MAX_REPEATS)
POWER_Z = 0.8416  # the rounds estimate aims at an 80% chance of a decision (z of 0.80)


def compare(ref: dict[str, Any], new: dict[str, Any], metric: str,
            confidence: float, noise: float = NOISE_THRESHOLD,
            max_rounds: int = MAX_ROUNDS) -> dict[str, Any] | None:
    """`new` against `ref` (two steps in results.json form, with `rounds` and `intervals`):
    {delta_pct, ci_pct: [lo, hi], verdict, method, and for `inconclusive` rounds_needed};
    None where either lacks the metric. Changes are ratios, so intervals are taken on their
    logarithm (never below -100%, and a halving weighs as much as a doubling)."""
    a, b = metric_of(ref, metric), metric_of(new, metric)
    if not a or not b:
        return None
    ra, rb = ref.get("rounds") or [], new.get("rounds") or []
    rounds = 1
    if len(ra) >= 2 and len(ra) == len(rb) and ref.get("run") == new.get("run") and all(
            r.get("order", "interleaved") == "interleaved" for r in (*ra, *rb)):
        logs = [_log_ratio(x, y, metric) for x, y in zip(ra, rb, strict=True)]
        ti = t_interval([v for v in logs if v is not None], confidence) \
            if all(v is not None for v in logs) else None
        centre = ti["mean"] if ti else math.log(b / a)
        half = None if ti is None else ti["half"]
        # the spread of one round's log ratio: what more rounds would average down
        sd = None if ti is None else ti["se"] * math.sqrt(len(ra))
        rounds = len(ra)
        method = (f"paired over {len(ra)} interleaved rounds (the geometric mean of the "
                  "per-round ratios)")
    else:
        centre = math.log(b / a)
        ia, ib = (ref.get("intervals") or {}).get(metric), (new.get("intervals") or {}).get(
            metric)
        half = _log_half(a, b, ia, ib, confidence)
        rounds = max(len(ra), len(rb), 1)
        se = _log_se(a, b, ia, ib)
        sd = None if se is None else se * math.sqrt(rounds)
        method = "the two steps' own intervals (delta method on the log ratio)"
    lo_hi = None if half is None else [_pct(centre - half), _pct(centre + half)]
    word = verdict(metric, lo_hi, _pct(centre), noise)
    out: dict[str, Any] = {
        "delta_pct": round(_pct(centre), 1),
        "ci_pct": None if lo_hi is None else [round(lo_hi[0], 1), round(lo_hi[1], 1)],
        "verdict": word, "method": method, "noise_pct": round(noise * 100, 2)}
    if word == "inconclusive" and sd is not None:
        out["rounds_needed"] = rounds_needed(centre, sd, noise, confidence, max_rounds)
        out["rounds_now"], out["rounds_max"] = rounds, max_rounds
    return out


def _pct(log_ratio: float) -> float:
    """exp(x) - 1 in percent; an interval so wide it would overflow is capped (at e^50: such an
    interval is inconclusive anyway)."""
    return (math.exp(min(log_ratio, 50.0)) - 1) * 100


def _log_ratio(ra: dict[str, Any], rb: dict[str, Any], metric: str) -> float | None:
    x, y = metric_of(ra, metric), metric_of(rb, metric)
    return None if not x or not y else math.log(y / x)


def _rel(a: float, b: float, ia: dict[str, Any] | None, ib: dict[str, Any] | None
         ) -> tuple[float, float] | None:
    if not ia or not ib or ia.get("se") is None or ib.get("se") is None:
        return None
    return ia["se"] / a, ib["se"] / b


def _log_se(a: float, b: float, ia: dict[str, Any] | None, ib: dict[str, Any] | None
            ) -> float | None:
    rel = _rel(a, b, ia, ib)
    return None if rel is None else math.sqrt(rel[0] ** 2 + rel[1] ** 2)


def _log_half(a: float, b: float, ia: dict[str, Any] | None, ib: dict[str, Any] | None,
              confidence: float) -> float | None:
    """The half-width of log(b / a)'s interval from each side's standard error: relative
    errors add in quadrature; Welch-Satterthwaite gives the degrees of freedom."""
    rel = _rel(a, b, ia, ib)
    if rel is None:
        return None
    rel_a, rel_b = rel
    assert ia is not None and ib is not None
    var = rel_a**2 + rel_b**2
    if var == 0:
        return 0.0
    df = max(1.0, var**2 / (rel_a**4 / ia["df"] + rel_b**4 / ib["df"]))
    half = float(special.stdtrit(df, 0.5 + confidence / 2)) * math.sqrt(var)
    return half if math.isfinite(half) else None


def verdict(metric: str, ci_pct: list[float] | None, delta_pct: float = 0.0,
            noise: float = 0.0) -> str:
    """better | worse (the interval excludes 0 and the change reaches the threshold) | same
    (the whole interval inside +-threshold) | inconclusive | unknown (no interval)."""
    if ci_pct is None:
        return "unknown"
    lo, hi = ci_pct
    band = noise * 100
    if band > 0 and -band <= lo and hi <= band:
        return "same"
    if (lo > 0 or hi < 0) and abs(delta_pct) >= band:
        return "better" if (lo > 0) == (metric in HIGHER_IS_BETTER) else "worse"
    return "inconclusive"


def rounds_needed(centre: float, sd: float, noise: float, confidence: float,
                  max_rounds: int) -> int | None:
    """How many rounds would likely decide a comparison, at the change and the per-round
    spread measured: the fewest n whose interval, (t + z_0.8) * sd / sqrt(n) wide, would clear
    0 (a change at or over the threshold) or fit inside +-threshold (a smaller one), for an
    80% chance; None when more than `max_rounds` would be needed."""
    if sd <= 0:
        return 2
    if abs(_pct(centre)) >= noise * 100:
        room = abs(centre)
    else:
        room = min(math.log1p(noise) - centre, centre - math.log1p(-noise)) if noise < 1 \
            else 0.0
    if room <= 0:
        return None
    for n in range(2, max_rounds + 1):
        t = float(special.stdtrit(n - 1, 0.5 + confidence / 2))
        if (t + POWER_Z) * sd / math.sqrt(n) <= room:
            return n
    return None


def text(c: dict[str, Any]) -> str:
    """'+105% [+96, +114]', 'same (+1.2% [-2, +4], inside ±5%)', 'inconclusive (+3.1% [-20,
    +26]; about 12 rounds would decide)', '+3.1% (no interval)'."""
    ci = c.get("ci_pct")
    if ci is None:
        return f"{c['delta_pct']:+.1f}% (no interval)"
    shown = f"{c['delta_pct']:+.1f}% [{ci[0]:+.0f}, {ci[1]:+.0f}]" if max(
        abs(ci[0]), abs(ci[1])) < 1e5 else f"{c['delta_pct']:+.1f}% [{ci[0]:+.0f}, >+99999]"
    if c["verdict"] == "same":
        return f"same ({shown}, inside ±{c.get('noise_pct', NOISE_THRESHOLD * 100):g}%)"
    if c["verdict"] == "inconclusive":
        return f"inconclusive ({shown}; {decide_text(c)})"
    return shown


def decide_text(c: dict[str, Any]) -> str:
    """What more rounds would do for an inconclusive comparison."""
    if "rounds_max" not in c:
        return "no estimate of the rounds that would decide it"
    n, now, most = c.get("rounds_needed"), c["rounds_now"], c["rounds_max"]
    if n is None:
        return f"not reachable within {most} rounds at this spread"
    if n <= now:
        return f"as wide as {now} rounds' spread allows; another run may decide it"
    return f"about {n} rounds would decide it"


def mixed_models(step: dict[str, Any]) -> bool:
    """Whether a step's templates reach different models: their merged latency distribution
    has one mode per model, and its percentiles jump between them from round to round."""
    models = {c.get("model") for c in (step.get("client") or {}).values()}
    return len(step.get("client") or {}) > 1 and len(models) > 1


def template_view(step: dict[str, Any], name: str) -> dict[str, Any]:
    """One template of a step as a step of its own (its throughput and latencies, its rounds,
    its intervals), so `compare` reads it as it reads a step."""
    c = (step.get("client") or {}).get(name) or {}
    return {"throughput": c.get("throughput"), "latency_us": c.get("latency_us") or {},
            "run": step.get("run"),
            "rounds": [{"order": r.get("order", "interleaved"),
                        **((r.get("templates") or {}).get(name) or {})}
                       for r in step.get("rounds") or []],
            "intervals": (step.get("template_intervals") or {}).get(name) or {}}


def step_changes(base: dict[str, Any], step: dict[str, Any], confidence: float,
                 noise: float, max_rounds: int = MAX_ROUNDS) -> list[dict[str, Any]]:
    """Every comparison of `step` against `base` at one load: the whole step's metrics (its
    merged percentiles left out where its templates reach different models), then each
    template's throughput and percentiles where the step sent several."""
    out = []
    mixed = mixed_models(step) or mixed_models(base)
    for metric in METRICS:
        if mixed and (metric in PERCENTILES or metric.endswith("_p99")):
            continue
        c = compare(base, step, metric, confidence, noise, max_rounds)
        if c is not None:
            out.append({"metric": metric, **c})
    names = [n for n in (step.get("client") or {}) if n in (base.get("client") or {})]
    if len(names) > 1:
        for name in names:
            a, b = template_view(base, name), template_view(step, name)
            for metric in ("throughput", *PERCENTILES):
                c = compare(a, b, metric, confidence, noise, max_rounds)
                if c is not None:
                    out.append({"metric": metric, "template": name, **c})
    return out


def comparisons(results: dict[str, Any], confidence: float,
                noise: float = NOISE_THRESHOLD,
                max_rounds: int = MAX_ROUNDS) -> list[dict[str, Any]]:
    """results.json's `comparisons`: every phase against the reference (the first phase that
    measured anything), at each load level both measured, for each metric both have (per
    template too, where a step mixes templates)."""
    phases = [p for p in results["phases"] if p["steps"]]
    if len(phases) < 2:
        return []
    ref = phases[0]
    out = []
    for phase in phases[1:]:
        for step in phase["steps"]:
            base = next((s for s in ref["steps"] if s["load"] == step["load"]), None)
            if base is None:
                continue
            for c in step_changes(base, step, confidence, noise, max_rounds):
                out.append({"phase": phase["name"], "reference": ref["name"],
                            "load": step["load"], **c, "confidence": confidence})
    return out


def against_baseline(base: dict[str, Any], new: dict[str, Any], confidence: float,
                     noise: float = NOISE_THRESHOLD,
                     max_rounds: int = MAX_ROUNDS) -> list[dict[str, Any]]:
    """Each phase of `new` against the same-named phase of an earlier run `base`, at each load
    both measured (never paired round by round: the two runs' rounds were not interleaved)."""
    mine = {p["name"]: p for p in base["phases"]}
    out = []
    for phase in new["phases"]:
        ref = mine.get(phase["name"])
        if ref is None:
            continue
        for step in phase["steps"]:
            old = next((s for s in ref["steps"] if s["load"] == step["load"]), None)
            if old is None:
                continue
            for c in step_changes({**old, "run": "baseline"}, {**step, "run": "new"},
                                  confidence, noise, max_rounds):
                out.append({"phase": phase["name"], "reference": f"baseline/{ref['name']}",
                            "load": step["load"], **c, "confidence": confidence})
    return out


def judging(results: dict[str, Any]) -> tuple[float, float, int]:
    """(the level each comparison is judged at, the noise threshold, the most rounds) of a
    results.json: a `repeats: auto` run judges at its design's nominal level, so that its
    stated confidence holds across its looks (loadkit/stats/sequential.py)."""
    seq = results.get("sequential") or {}
    confidence = float(seq.get("nominal_confidence") or results.get("confidence", 0.95))
    noise = float(results.get("noise_threshold", NOISE_THRESHOLD))
    return confidence, noise, int(seq.get("max_rounds") or MAX_ROUNDS)


def undecided(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The comparisons more rounds could still decide (`unknown` ones have no interval to
    narrow: rounds do not help them)."""
    return [c for c in changes if c["verdict"] == "inconclusive"]
