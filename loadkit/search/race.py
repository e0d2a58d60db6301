"""Racing: before `loadkit tune` names a winner, the configs it cannot tell apart from the
leader are measured again, interleaved with it, and judged on all their measurements.

A trial's operating point carries its objective's interval (loadkit/stats.py). The leader's
contenders are the trials whose interval overlaps the leader's, and those whose constraints
were broken only within noise (`uncertain`). After the re-measures each raced trial stands for
the mean of its measurements, with Student's t interval over them; the trials not told apart
from the best are its `ties`, each `same` (within ±noise of it) or `inconclusive`, and among the
best and its `same` ties the report recommends the cheapest: fewest instances, then the
smallest queue delay.
"""

from __future__ import annotations

from typing import Any

from loadkit.stats import NOISE_THRESHOLD, t_interval, verdict

RACE_MAX = 2  # contenders raced beside the leader (6 more measurements in all)
RACE_ROUNDS = 2  # re-measures of each, interleaved


def field_size(measured: int) -> int:
    """How many trials may race (the leader included): racing never measures more often than
    the search did, so it at most doubles the search's time (a quick search of 6 trials races
    the leader and one contender; a grid of 13, the leader and RACE_MAX)."""
    return min(RACE_MAX + 1, max(0, measured - 1) // RACE_ROUNDS)


def interval(point: dict[str, Any]) -> tuple[float, float] | None:
    """The point's objective interval as (lo, hi) in score terms (higher is better)."""
    ci = point.get("objective_ci")
    if not ci or point.get("objective") is None:
        return None
    sign = 1.0 if point["score"] == point["objective"] else -1.0
    a, b = ci[0] * sign, ci[1] * sign
    return (min(a, b), max(a, b))


def overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two points' objective intervals overlap (no interval: they cannot be told apart
    from anything)."""
    ia, ib = interval(a), interval(b)
    if ia is None or ib is None:
        return True
    return ia[0] <= ib[1] and ib[0] <= ia[1]


def contenders(trials: list[dict[str, Any]], leader: dict[str, Any]) -> list[dict[str, Any]]:
    """The trials to race against the leader, most promising first."""
    lp = leader["point"]
    found = []
    for t in trials:
        p = t.get("point")
        if t is leader or p is None:
            continue
        close = p["constraints_met"] and overlaps(p, lp)
        unsure = bool(p.get("uncertain")) and p["score"] >= (interval(lp) or (lp["score"],))[0]
        if close or unsure:
            found.append(t)
    found.sort(key=lambda t: -t["point"]["score"])
    return found[:RACE_MAX]


def combine(points: list[dict[str, Any]], confidence: float) -> dict[str, Any]:
    """One point for a trial measured several times: the first point's step and load, the
    mean objective and score with their t interval, the constraints met when most
    measurements met them (a constraint broken in one of three is noise, in two it is not)."""
    out = dict(points[0])
    objectives = [p["objective"] for p in points if p.get("objective") is not None]
    scores = [p["score"] for p in points]
    out["score"] = sum(scores) / len(scores)
    if objectives:
        out["objective"] = sum(objectives) / len(objectives)
        ti = t_interval(objectives, confidence)
        out["objective_ci"] = ([out["objective"] - ti["half"], out["objective"] + ti["half"]]
                               if ti else None)
    met = sum(1 for p in points if p["constraints_met"])
    out["constraints_met"] = met * 2 > len(points)
    out["broken"] = [] if out["constraints_met"] else points[-1]["broken"]
    out["uncertain"] = []
    out["measurements"] = len(points)
    return out


def cost(trial: dict[str, Any]) -> tuple[int, float]:
    """(instances, queue delay µs) of a trial's config, from its overlays (what the search set;
    a model whose instance count it did not set counts 1)."""
    instances, delay = 0, 0.0
    for overlay in trial.get("overlay", {}).values():
        groups = overlay.get("instance_group") or [{"count": 1}]
        instances += sum(int(g.get("count", 1)) for g in groups)
        batching = overlay.get("dynamic_batching") or {}
        delay += float(batching.get("max_queue_delay_microseconds", 0) or 0)
    return (instances or 1, delay)


def word(point: dict[str, Any], best: dict[str, Any], noise: float = NOISE_THRESHOLD) -> str:
    """A trial's objective against the best's in the four words (loadkit/stats/verdict.py):
    the change's interval is the ratio of the two intervals' ends (conservative: each end at
    its own level), `same` when it lies inside ±noise, `worse` when it excludes 0 beyond the
    threshold, else `inconclusive`; `unknown` without both intervals."""
    a, b = best.get("objective_ci"), point.get("objective_ci")
    if not a or not b or a[0] <= 0 or best.get("objective") in (None, 0) or \
            point.get("objective") is None:
        return "unknown"
    ci = [(b[0] / a[1] - 1) * 100, (b[1] / a[0] - 1) * 100]
    delta = (point["objective"] / best["objective"] - 1) * 100
    higher = best["score"] == best["objective"]  # the objective is a rate: higher is better
    return verdict("throughput" if higher else "p99", ci, delta, noise)


def ties(trials: list[dict[str, Any]], best: dict[str, Any],
         noise: float = NOISE_THRESHOLD) -> dict[int, str]:
    """The trials (within the constraints) the best cannot be told from: trial -> `same`
    (known to be within ±noise of it) or `inconclusive` (not told apart either way). A trial
    without an interval is not counted: unknown is not a tie."""
    if interval(best["point"]) is None:
        return {}
    out = {}
    for t in trials:
        if t is best or not t.get("point") or not t["point"]["constraints_met"]:
            continue
        w = word(t["point"], best["point"], noise)
        if w in ("same", "inconclusive"):
            out[t["trial"]] = w
    return out


def recommend(trials: list[dict[str, Any]], best: dict[str, Any],
              tied: dict[int, str]) -> dict[str, Any]:
    """The cheapest of the best and the trials known to be the `same` as it, and why (one
    only `inconclusive` against the best is not recommended: it may be worse)."""
    pool = [best, *(t for t in trials if tied.get(t["trial"]) == "same")]
    pick = min(pool, key=lambda t: (cost(t), -t["point"]["score"]))
    cheaper_unsure = [t["trial"] for t in trials if tied.get(t["trial"]) == "inconclusive"
                      and cost(t) < cost(pick)]
    unsure = (f"; trial(s) {', '.join(map(str, cheaper_unsure))} would be cheaper but are "
              "inconclusive against it (more rounds: `repeats`)" if cheaper_unsure else "")
    if pick is best:
        why = ("the best, and no config the same as it is cheaper" if tied else
               "the best, beyond noise from every other config")
    else:
        n, d = cost(pick)
        why = (f"the same as the best (trial {best['trial']}) within noise, and cheaper: "
               f"{n} instance(s), {d:g} µs queue delay against {cost(best)[0]}, "
               f"{cost(best)[1]:g}")
    return {"trial": pick["trial"], "why": why + unsure}
