"""`until_stable`: a step's measured window goes on, one `step_duration` window at a time,
until its last `windows` windows agree (throughput and p99 each within `within` of their
mean), or until `max`: perf_analyzer's stability percentage, on the live window's per-second
buckets. The step then reports the whole window (its accounting stays exact) and says whether
it became stable, after how long, with each window's numbers (`stability`)."""

from __future__ import annotations

from typing import Any

from loadkit.record import Second, StepWindow
from loadkit.scenario import Stability
from loadkit.stats import batch_values


def window_values(window: StepWindow, length_s: float, elapsed_s: float,
                  batch_sizes: dict[str, int]) -> list[dict[str, float]]:
    """Throughput (infer/s) and p99 (µs) of each whole `length_s` window in the `elapsed_s`
    since the measured window opened (the second under way is not one yet)."""
    size = max(1, round(length_s))
    out = []
    for w in range(int(elapsed_s) // size):
        v = batch_values([window.seconds.get(i) or Second() for i in
                          range(w * size, (w + 1) * size)], batch_sizes)
        out.append({"throughput": round(float(v["throughput"] or 0.0), 2),
                    "p99_us": v["p99"] or 0.0})
    return out


def stable(values: list[dict[str, float]], spec: Stability) -> bool:
    """Whether the last `windows` windows agree within the bound (each metric against its
    mean over those windows), as perf_analyzer judges its stability windows."""
    last = values[-spec.windows:]
    if len(last) < spec.windows:
        return False
    for key in ("throughput", "p99_us"):
        xs = [v[key] for v in last]
        mean = sum(xs) / len(xs)
        if mean <= 0 or any(abs(x - mean) > spec.within * mean for x in xs):
            return False
    return True


def report(spec: Stability, values: list[dict[str, float]], became: bool,
           elapsed_s: float) -> dict[str, Any]:
    """The step's `stability` section."""
    return {
        "within": spec.within, "windows": spec.windows, "max_s": spec.max_s,
        "stable": became, "allow_unstable": spec.allow_unstable,
        "reason": (f"the last {spec.windows} windows agreed within {spec.within * 100:g}%"
                   if became else f"not stable within {spec.max_s:g} s: the last "
                   f"{spec.windows} windows differed by more than {spec.within * 100:g}%"),
        "measured_s": round(elapsed_s, 2),
        "window_values": values,
    }
