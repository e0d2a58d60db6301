"""A trial's worth: each measured step's metrics, whether it keeps the constraints, the
objective as one number where higher is better, and the trials ranked.

A trial runs the tune load's steps (e.g. concurrency 2, 4, .., 32) on one config; like Model
Analyzer, the trial stands for its best step within the constraints (its operating point), and
for its best step overall, marked, when no step keeps them.
"""

from __future__ import annotations

from typing import Any

from loadkit.scenario import MAXIMIZED, Objective, Threshold, TuneSpec
from loadkit.slo import judge_step, step_value

SERVER_FIELDS = ("avg_batch", "queue_us", "compute_infer_us")


def gpu_memory_bytes(step: dict[str, Any]) -> float | None:
    """The server's GPU memory in use at the end of the step, over all GPUs (None: the server
    reports no GPU)."""
    gauges = step.get("metrics", {}).get("gauges", {})
    used = [v for k, v in gauges.items() if k.startswith("nv_gpu_memory_used_bytes")]
    return float(sum(used)) if used else None


def metric_value(metric: str, step: dict[str, Any]) -> float | None:
    """A step's value of an objective metric (None: nothing was measured)."""
    if not step.get("requests"):
        return None
    if metric == "throughput":
        return float(step["throughput"])
    streaming = step.get("streaming", {})
    if metric == "goodput":
        good = streaming.get("goodput")
        return float(good["per_s"]) if good else None
    if metric == "output_tokens_per_s":
        v = streaming.get("output_tokens_per_s")
        return float(v) if v is not None else None
    return step_value(Threshold(metric=metric, limit=0.0), step)


def _gain(metric: str, value: float | None, ref: float | None) -> float | None:
    if value is None or not ref:
        return None
    if metric in MAXIMIZED:
        return value / ref
    return ref / value if value > 0 else None


def score(objective: Objective, step: dict[str, Any],
          reference: dict[str, float | None] | None) -> float | None:
    """Higher is better: the metric (maximize), minus it (minimize), or the weighted mean gain
    over the reference (the baseline's operating point) for `weighted`."""
    if objective.goal == "weighted":
        if reference is None:
            return None
        total, weight = 0.0, 0.0
        for metric, w in objective.weights:
            g = _gain(metric, metric_value(metric, step), reference.get(metric))
            if g is None:
                return None
            total, weight = total + w * g, weight + w
        return total / weight
    v = metric_value(objective.metric, step)
    if v is None:
        return None
    return v if objective.goal == "maximize" else -v


def judge(spec: TuneSpec, step: dict[str, Any]) -> tuple[bool, list[str], str, list[str]]:
    """(keeps every constraint, what broke, why a constraint could not be checked, what broke
    inconclusively). A latency constraint counts as broken only when its interval lies
    above the limit; broken by the value alone it is `uncertain` (racing measures it again)."""
    ok, broken = judge_step(spec.constraints, step) if spec.constraints else (
        step.get("status") == "ok", [] if step.get("status") == "ok" else [
            f"step {step.get('status')}"])
    uncertain = []
    intervals = step.get("intervals") or {}
    for t in spec.constraints:
        ci = (intervals.get(t.metric) or {}).get("ci")
        hit = [b for b in broken if b.startswith(t.name + " ")]
        if hit and ci is not None and t.template is None and ci[0] <= t.limit:
            broken.remove(hit[0])
            uncertain.append(hit[0] + " (inconclusive: its interval reaches the limit)")
    ok = ok or (not broken and bool(uncertain))
    skipped = ""
    if spec.gpu_memory_bytes:
        used = gpu_memory_bytes(step)
        if used is None:
            skipped = "gpu_memory: skipped, the server's metrics report no GPU"
        elif used > spec.gpu_memory_bytes:
            ok = False
            broken.append(f"gpu_memory {used / 2**20:.0f} MiB")
    return ok, broken, skipped, uncertain


def operating_point(spec: TuneSpec, steps: list[dict[str, Any]],
                    reference: dict[str, float | None] | None) -> dict[str, Any] | None:
    """The step a trial stands for: the best-scoring step within the constraints, else the
    best-scoring step, marked. None when no step measured anything."""
    best: tuple[tuple[bool, float], dict[str, Any]] | None = None
    for step in steps:
        if step.get("accounting", {}).get("status") == "mismatch":
            continue  # numbers that do not add up stand for nothing (the run fails anyway)
        s = score(spec.objective, step, reference)
        if s is None:
            continue
        ok, broken, skipped, uncertain = judge(spec, step)
        rank = (ok, s)
        if best is None or rank > best[0]:
            best = (rank, {"step": step["index"], "score": s, "constraints_met": ok,
                           "broken": broken, "skipped": skipped, "uncertain": uncertain})
    if best is None:
        return None
    point = best[1]
    step = next(s for s in steps if s["index"] == point["step"])
    lat = step["latency_us"]
    point.update({
        "load": step["load"],
        "throughput": step["throughput"],
        "p50_us": lat.get("p50"),
        "p99_us": lat.get("p99"),
        "errors": sum(step["errors"].values()),
        "server": {m: {k: s.get(k) for k in SERVER_FIELDS} for m, s in step["server"].items()},
    })
    if step.get("streaming"):
        st = step["streaming"]
        point["first_response_p99_us"] = st.get("first_response_us", {}).get("p99")
        point["output_tokens_per_s"] = st.get("output_tokens_per_s")
    if spec.objective.goal != "weighted":
        point["objective"] = metric_value(spec.objective.metric, step)
        i = (step.get("intervals") or {}).get(spec.objective.metric) or {}
        point["objective_ci"] = i.get("ci")  # loadkit/stats.py: racing reads it
    else:
        point["objective"] = point["score"]
    return point


def reference_of(spec: TuneSpec, steps: list[dict[str, Any]]) -> dict[str, float | None]:
    """The baseline's metrics at its operating point by throughput: what `weighted` gains are
    measured against."""
    plain = TuneSpec(dimensions=spec.dimensions, load=spec.load,
                     objective=Objective("maximize", "throughput"),
                     constraints=spec.constraints, gpu_memory_bytes=spec.gpu_memory_bytes)
    point = operating_point(plain, steps, None)
    if point is None:
        return {}
    step = next(s for s in steps if s["index"] == point["step"])
    return {m: metric_value(m, step) for m, _ in spec.objective.weights}


def rank_key(trial: dict[str, Any]) -> tuple[int, int, float]:
    """Sort key, best first: measured before refused, within the constraints before not,
    then by score."""
    point = trial.get("point")
    if point is None:
        return (1, 1, 0.0)
    return (0, 0 if point["constraints_met"] else 1, -point["score"])


def better(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether trial a beats trial b (None: not measured, or refused)."""
    if a is None or a.get("point") is None:
        return False
    if b is None or b.get("point") is None:
        return True
    return rank_key(a) < rank_key(b)


def pareto(trials: list[dict[str, Any]]) -> list[int]:
    """The trials on the throughput-vs-p99 front: none measured more throughput at a p99 no
    higher."""
    pts = [(t["trial"], t["point"]["throughput"], t["point"]["p99_us"]) for t in trials
           if t.get("point") and t["point"].get("p99_us") is not None]
    front = []
    for n, thr, p99 in pts:
        if not any((t2 >= thr and q2 <= p99) and (t2 > thr or q2 < p99) for _, t2, q2 in pts):
            front.append(n)
    return sorted(front)
