"""How sure a number is: confidence intervals on a step's throughput and latency percentiles.

Two sources of spread (docs/verdicts.md has the method and its references):
- rounds (`repeats: N`, N >= 2): the step measured N times in interleaved rounds; the interval
  is Student's t over the N round values. It sees drift between minutes, since each round ran
  at another time.
- within-run (one round): batch means over the step's per-second buckets (contiguous batches
  of seconds, so the autocorrelation inside a batch does not shrink the interval); it cannot
  see drift between minutes, and says so (`method`).
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
# criterion.rs's noise threshold: the band of changes too small to matter (two runs of one
# config on a drifting machine differ "significantly" by a few percent; docs/verdicts.md has
# the A/A numbers that chose 5%): `same` when a change's whole interval lies inside it
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
    """A metric's value in a step's (or a round's, or a template's) results.json form."""
    if metric == "throughput":
        value = step.get("throughput")
        return None if value is None else float(value)
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


def batch_values(batch: list[Second], batch_sizes: dict[str, int],
                 template: str | None = None) -> dict[str, float | None]:
    """A run of per-second buckets as one: its inferences per second and its percentiles from
    the seconds' histograms merged (None where nothing succeeded). For one `template`, its
    throughput only: a second's histogram merges every template's latencies."""
    inferences = sum(n * batch_sizes.get(t, 1) for sec in batch for t, n in sec.ok.items()
                     if template is None or t == template)
    out: dict[str, float | None] = {"throughput": inferences / len(batch)}
    if template is not None:
        return out
    h: HdrHistogram = new_histogram()
    for sec in batch:
        h.add(sec.hist)
    for name, q in PERCENTILES.items():
        out[name] = float(h.get_value_at_percentile(q)) if h.get_total_count() else None
    return out


def within_run(seconds: dict[int, Second], duration_s: float, batch_sizes: dict[str, int],
               values: dict[str, float | None], confidence: float,
               template: str | None = None) -> dict[str, Any]:
    """Intervals from one measured window's per-second buckets (batch means), centred on the
    step's own `values` (the whole window's throughput and percentiles; one `template`'s
    throughput)."""
    full = int(duration_s)
    batches = _batches(seconds, full) if full >= 2 else []
    per = [batch_values(b, batch_sizes, template) for b in batches]
    out: dict[str, Any] = {}
    for metric in ("throughput",) if template else ("throughput", *PERCENTILES):
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


def imprecise(results: dict[str, Any], within: float) -> list[dict[str, Any]]:
    """The estimates of a results.json whose interval reaches further than `within` (a
    fraction) from its value, or has none yet: what more rounds of a run with nothing to
    compare would narrow, so that a later `--baseline` comparison can decide."""
    out = []
    for phase in results["phases"]:
        for step in phase["steps"]:
            for metric, iv in (step.get("intervals") or {}).items():
                value, ci = iv.get("value"), iv.get("ci")
                if not value:
                    continue
                reach = None if ci is None else (ci[1] - value) / value
                if reach is None or reach > within:
                    out.append({"phase": phase["name"], "load": step["load"], "metric": metric,
                                "reach_pct": None if reach is None else round(100 * reach, 1)})
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


