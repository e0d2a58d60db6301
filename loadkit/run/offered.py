"""A replay step, second by second: what the file offered (its arrivals in the measured window,
at the step's speed) beside what was served, per template, so the report shows whether the
server kept up with the recorded shape or fell behind where the traffic burst."""

from __future__ import annotations

from typing import Any

import numpy as np

from loadkit.plan import Replayed
from loadkit.record import StepWindow

MIX = "(mix)"  # arrivals of no model in particular: the phase's mix picked their template
MAX_SECONDS = 3600  # results.json keeps at most an hour of seconds per step


def offered_seconds(replayed: Replayed, warmup_s: float, duration_s: float) -> dict[str, list[int]]:
    """Arrivals per second of the measured window, per template, from the file's offsets (a
    looped replay tiles its period)."""
    n = max(1, min(MAX_SECONDS, int(np.ceil(duration_s - 1e-9))))
    offsets, model_of = replayed.offsets, replayed.model_of
    if replayed.loop and replayed.period_s > 0:
        laps = int(np.ceil((warmup_s + duration_s) / replayed.period_s))
        offsets = np.concatenate([offsets + k * replayed.period_s for k in range(laps)])
        model_of = np.tile(model_of, laps)
    t = offsets - warmup_s
    keep = (t >= 0) & (t < duration_s)
    seconds = t[keep].astype("int64")
    out: dict[str, list[int]] = {}
    for m, template in enumerate(replayed.templates):
        counts = np.bincount(seconds[model_of[keep] == m], minlength=n)[:n]
        name = template or MIX
        prior = out.get(name)
        out[name] = (counts if prior is None else counts + np.asarray(prior)).tolist()
    return {k: v for k, v in out.items() if any(v)}


def served_seconds(window: StepWindow, duration_s: float) -> dict[str, list[int]]:
    """Successes per second of the measured window, per template, by completion time."""
    n = max(1, min(MAX_SECONDS, int(np.ceil(duration_s - 1e-9))))
    out: dict[str, list[int]] = {}
    for i, sec in window.seconds.items():
        for name, count in sec.ok.items():
            row = out.setdefault(name, [0] * n)
            row[min(i, n - 1)] += count  # the drain's last completions fall in the last second
    return out


def per_second(replayed: Replayed, window: StepWindow, warmup_s: float,
               duration_s: float) -> dict[str, Any]:
    offered = offered_seconds(replayed, warmup_s, duration_s)
    served = served_seconds(window, duration_s)
    return {"offered": offered, "served": served,
            "peak_offered_per_s": max((max(v) for v in offered.values()), default=0),
            "peak_served_per_s": max((max(v) for v in served.values()), default=0)}
