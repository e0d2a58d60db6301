"""How sure a number is, and whether a difference is real: confidence intervals on a step's
throughput and latency percentiles, and the verdict of one step against another.

Two sources of spread (docs/verdicts.md has the method and its references):
- rounds (`repeats: N`, N >= 2): the step measured N times in interleaved rounds; the interval
  is Student's t over the N round values. It sees drift between minutes, since each round ran
  at another time.
- within-run (one round): batch means over the step's per-second buckets (contiguous batches
  of seconds, so the autocorrelation inside a batch does not shrink the interval); it cannot
  see drift between minutes, and says so (`method`).

A comparison of two steps of one run with the same rounds pairs them round by round (the
rounds were interleaved: a drift hits both alike) and takes t over the per-round log ratios;
otherwise it combines the two steps' own intervals (delta method on the log ratio, Welch-
Satterthwaite degrees of freedom). `same` when the interval of the change spans 0, or when
the change is smaller than the noise threshold (criterion.rs's, 5% by default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram
from scipy import special  # stdtrit is what scipy.stats.t.ppf computes, at a quarter of the import

from loadkit.record import Second, new_histogram

DEFAULT_CONFIDENCE = 0.95
# criterion.rs's noise threshold: a change smaller than this is `same` even when its interval
# excludes 0 (two runs of one config on a drifting machine differ "significantly" by a few
# percent; docs/verdicts.md has the A/A numbers that chose 5%)
NOISE_THRESHOLD = 0.05
MAX_BATCHES = 10
# what each metric is, where a step keeps it, and which way is better
HIGHER_IS_BETTER = {"throughput"}
PERCENTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0}
STREAM_METRICS = ("first_response_p99", "inter_response_p99")
METRICS = ("throughput", *PERCENTILES, *STREAM_METRICS)


def t_interval(values: Sequence[float], confidence: float) -> dict[str, float] | None:
    """Student's t interval of the mean of `values` (None with fewer than two)."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2:
        return None
    mean = float(x.mean())
    se = float(x.std(ddof=1) / math.sqrt(n))
    half = float(special.stdtrit(n - 1, 0.5 + confidence / 2)) * se
    return {"mean": mean, "se": se, "df": n - 1, "half": half}


def metric_of(step: dict[str, Any], metric: str) -> float | None:
    """A metric's value in a step's (or a round's) results.json form."""
    if metric == "throughput":
        return float(step["throughput"])
    if metric in PERCENTILES:
        lat = step.get("latency_us") or {}
        return float(lat[metric]) if lat.get(metric) else None
    kind, p = metric.rsplit("_", 1)
    value = (step.get("streaming") or {}).get(f"{kind}_us", {}).get(p)
    return float(value) if value else None


def _batches(seconds: dict[int, Second], full: int) -> list[list[Second]]:
    """The step's full seconds in at most MAX_BATCHES contiguous batches of equal length
    (the first seconds left over go unused: the window's start settles the most)."""
    k = min(full, MAX_BATCHES)
    size = full // k if k else 0
    skip = full - k * size
    return [[seconds.get(skip + b * size + j) or Second() for j in range(size)]
            for b in range(k)]


def batch_values(batch: list[Second], batch_sizes: dict[str, int]) -> dict[str, float | None]:
    """A run of per-second buckets as one: its inferences per second and its percentiles from
    the seconds' histograms merged (None where nothing succeeded)."""
    h: HdrHistogram = new_histogram()
    inferences = 0
    for sec in batch:
        h.add(sec.hist)
        inferences += sum(n * batch_sizes.get(t, 1) for t, n in sec.ok.items())
    out: dict[str, float | None] = {"throughput": inferences / len(batch)}
    for name, q in PERCENTILES.items():
        out[name] = float(h.get_value_at_percentile(q)) if h.get_total_count() else None
    return out


def within_run(seconds: dict[int, Second], duration_s: float, batch_sizes: dict[str, int],
               values: dict[str, float | None], confidence: float) -> dict[str, Any]:
    """Intervals from one measured window's per-second buckets (batch means), centred on the
    step's own `values` (the whole window's throughput and percentiles)."""
    full = int(duration_s)
    batches = _batches(seconds, full) if full >= 2 else []
    per = [batch_values(b, batch_sizes) for b in batches]
    out: dict[str, Any] = {}
    for metric in ("throughput", *PERCENTILES):
        value = values.get(metric)
        xs = [p[metric] for p in per if p[metric] is not None]
        ti = t_interval(xs, confidence) if len(xs) == len(per) else None
        out[metric] = _interval(value, ti, f"within-run batch means ({len(per)} batches of "
                                f"{full // len(per) if per else 0} s)", len(per))
    return out


def across_rounds(rounds: list[dict[str, Any]], pooled: dict[str, Any],
                  confidence: float, how: str = "interleaved") -> dict[str, Any]:
    """Intervals from the rounds' own values, centred on the pooled step's values (`how`:
    interleaved with other phases' rounds, or back-to-back as tune's and capacity's are)."""
    out: dict[str, Any] = {}
    for metric in METRICS:
        xs = [metric_of(r, metric) for r in rounds]
        value = metric_of(pooled, metric)
        if value is None or any(x is None for x in xs):
            continue
        ti = t_interval([float(x) for x in xs if x is not None], confidence)
        out[metric] = _interval(value, ti, f"across {len(rounds)} {how} rounds", len(rounds))
    return out


def mean_step(steps: list[dict[str, Any]], confidence: float) -> dict[str, Any]:
    """Several measurements of one config (a raced tune trial's) as one step: throughput and
    percentiles their means, with Student's t interval across them; one measurement is itself."""
    if len(steps) < 2:
        return steps[0]
    out: dict[str, Any] = {"latency_us": {}}
    for metric in ("throughput", *PERCENTILES):
        xs = [metric_of(s, metric) for s in steps]
        if any(x is None for x in xs):
            continue
        mean = sum(x for x in xs if x is not None) / len(xs)
        if metric == "throughput":
            out["throughput"] = mean
        else:
            out["latency_us"][metric] = mean
    out["intervals"] = across_rounds(steps, out, confidence, "separate")
    return out


def _interval(value: float | None, ti: dict[str, float] | None, method: str,
              n: int) -> dict[str, Any]:
    if value is None:
        return {"value": None, "ci": None, "method": method, "n": n}
    if ti is None:
        return {"value": value, "ci": None, "method": method + ": too few to say", "n": n}
    # rates and latencies are never negative: a wide interval (few rounds) stops at 0
    return {"value": value, "ci": [max(0.0, value - ti["half"]), value + ti["half"]],
            "se": ti["se"],
            "df": ti["df"], "method": method, "n": n}


def compare(ref: dict[str, Any], new: dict[str, Any], metric: str,
            confidence: float, noise: float = NOISE_THRESHOLD) -> dict[str, Any] | None:
    """`new` against `ref` (two steps in results.json form, with `rounds` and `intervals`):
    {delta_pct, ci_pct: [lo, hi], verdict, method}; None where either lacks the metric.
    Changes are ratios, so intervals are taken on their logarithm (never below -100%, and a
    halving weighs as much as a doubling)."""
    a, b = metric_of(ref, metric), metric_of(new, metric)
    if not a or not b:
        return None
    ra, rb = ref.get("rounds") or [], new.get("rounds") or []
    if len(ra) >= 2 and len(ra) == len(rb) and ref.get("run") == new.get("run") and all(
            r.get("order", "interleaved") == "interleaved" for r in (*ra, *rb)):
        logs = [_log_ratio(x, y, metric) for x, y in zip(ra, rb, strict=True)]
        ti = t_interval([v for v in logs if v is not None], confidence) \
            if all(v is not None for v in logs) else None
        centre = ti["mean"] if ti else math.log(b / a)
        lo_hi = None if ti is None else [_pct(centre - ti["half"]), _pct(centre + ti["half"])]
        method = (f"paired over {len(ra)} interleaved rounds (the geometric mean of the "
                  "per-round ratios)")
    else:
        centre = math.log(b / a)
        half = _log_half(a, b, (ref.get("intervals") or {}).get(metric),
                         (new.get("intervals") or {}).get(metric), confidence)
        lo_hi = None if half is None else [_pct(centre - half), _pct(centre + half)]
        method = "the two steps' own intervals (delta method on the log ratio)"
    out = {"delta_pct": round(_pct(centre), 1),
           "ci_pct": None if lo_hi is None else [round(lo_hi[0], 1), round(lo_hi[1], 1)],
           "verdict": verdict(metric, lo_hi, _pct(centre), noise), "method": method}
    if out["verdict"] == "same" and lo_hi is not None and not lo_hi[0] <= 0 <= lo_hi[1]:
        out["within_noise_pct"] = round(noise * 100, 1)  # significant, but below the threshold
    return out


def _pct(log_ratio: float) -> float:
    """exp(x) - 1 in percent; an interval so wide it would overflow is capped (at e^50: such an
    interval spans 0 anyway, and says `same`)."""
    return (math.exp(min(log_ratio, 50.0)) - 1) * 100


def _log_ratio(ra: dict[str, Any], rb: dict[str, Any], metric: str) -> float | None:
    x, y = metric_of(ra, metric), metric_of(rb, metric)
    return None if not x or not y else math.log(y / x)


def _log_half(a: float, b: float, ia: dict[str, Any] | None, ib: dict[str, Any] | None,
              confidence: float) -> float | None:
    """The half-width of log(b / a)'s interval from each side's standard error: relative
    errors add in quadrature; Welch-Satterthwaite gives the degrees of freedom."""
    if not ia or not ib or ia.get("se") is None or ib.get("se") is None:
        return None
    rel_a, rel_b = ia["se"] / a, ib["se"] / b
    var = rel_a**2 + rel_b**2
    if var == 0:
        return 0.0
    df = max(1.0, var**2 / (rel_a**4 / ia["df"] + rel_b**4 / ib["df"]))
    half = float(special.stdtrit(df, 0.5 + confidence / 2)) * math.sqrt(var)
    return half if math.isfinite(half) else None


def verdict(metric: str, ci_pct: list[float] | None, delta_pct: float = 0.0,
            noise: float = 0.0) -> str:
    """better | worse | same (the interval spans 0, or the change is under the noise
    threshold) | unknown (no interval could be had)."""
    if ci_pct is None:
        return "unknown"
    lo, hi = ci_pct
    if lo <= 0 <= hi or abs(delta_pct) < noise * 100:
        return "same"
    up = lo > 0
    return "better" if up == (metric in HIGHER_IS_BETTER) else "worse"


def text(c: dict[str, Any]) -> str:
    """'+105% [+96, +114]' or 'same (±4%)' or '+3.1% (no interval)'."""
    ci = c.get("ci_pct")
    if ci is None:
        return f"{c['delta_pct']:+.1f}% (no interval)"
    if c.get("within_noise_pct") is not None:
        return (f"same ({c['delta_pct']:+.1f}% [{ci[0]:+.0f}, {ci[1]:+.0f}], under the "
                f"{c['within_noise_pct']:g}% noise threshold)")
    if c["verdict"] == "same":
        half = max(abs(ci[0] - c["delta_pct"]), abs(ci[1] - c["delta_pct"]))
        return f"same (±{half:.0f}%)" if half < 1000 else "same (±>999%: too noisy to say)"
    return f"{c['delta_pct']:+.1f}% [{ci[0]:+.0f}, {ci[1]:+.0f}]"


def comparisons(results: dict[str, Any], confidence: float,
                noise: float = NOISE_THRESHOLD) -> list[dict[str, Any]]:
    """results.json's `comparisons`: every phase against the reference (the first phase that
    measured anything), at each load level both measured, for each metric both have."""
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
            for metric in METRICS:
                c = compare(base, step, metric, confidence, noise)
                if c is None:
                    continue
                out.append({"phase": phase["name"], "reference": ref["name"],
                            "load": step["load"], "metric": metric, **c,
                            "confidence": confidence})
    return out
