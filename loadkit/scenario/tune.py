"""The `tune:` section: which ModelConfig fields `loadkit tune` searches, under what load, for
what objective and within which constraints (docs/tune.md)."""

from __future__ import annotations

import re
from typing import Any

from loadkit.modelconfig import check_overlay, path_overlay
from loadkit.scenario.checks import Checker, found
from loadkit.scenario.model import (
    DURATION_METRICS,
    MAXIMIZED,
    STRATEGIES,
    THRESHOLD_METRICS,
    Dimension,
    Objective,
    TuneSpec,
)
from loadkit.scenario.phases import _load, _threshold_items
from loadkit.scenario.source import KeyPath

TUNE_KEYS = ("models", "load", "objective", "constraints", "strategy", "budget", "seed",
             "config")
OBJECTIVE_METRICS = (*MAXIMIZED, *DURATION_METRICS)
MAX_GRID = 100_000
_TRIALS = re.compile(r"^\s*(\d+)\s*trials?\s*$")


def parse_budget(value: Any) -> tuple[float, int] | str:
    """'15m' -> (900.0, 0); '12 trials' or 12 -> (0.0, 12); else the reason it is not one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (0.0, value) if value > 0 else "expected at least 1 trial"
    if isinstance(value, str):
        m = _TRIALS.match(value)
        if m:
            return (0.0, int(m[1])) if int(m[1]) > 0 else "expected at least 1 trial"
        from loadkit.scenario.checks import parse_duration

        s = parse_duration(value)
        if s is not None:
            return (s, 0) if s > 0 else "expected a time above 0"
    return (f"expected a time such as '15m' or '90s', or a trial count such as '12 trials'; "
            f"found {found(value)}")


# Top-level config sections a dimension may switch off (None), on with Triton's defaults ({})
# or on with given fields: `dynamic_batching: [off, on, {max_queue_delay_microseconds: 500}]`.
SWITCHED = ("dynamic_batching",)
SWITCHES: dict[Any, Any] = {"off": None, False: None, "on": {}, True: {}}


def _dimensions(ck: Checker, raw: Any, path: KeyPath) -> list[Dimension]:
    if not isinstance(raw, dict) or not raw:
        ck.add(path, "expected a mapping of model -> {field.path: [values]}; found "
               f"{found(raw)}")
        return []
    dims = []
    for model, fields in raw.items():
        mp = (*path, model)
        if not isinstance(fields, dict) or not fields:
            ck.add(mp, "expected a mapping of ModelConfig field path -> list of values, e.g. "
                   f"instance_group.count: [1, 2]; found {found(fields)}")
            continue
        for fpath, values in fields.items():
            fp = (*mp, fpath)
            if not isinstance(fpath, str) or not re.match(r"^\w+(\.\w+)*$", fpath):
                ck.add(fp, f"expected a dotted field path such as dynamic_batching."
                       f"max_queue_delay_microseconds; found {found(fpath)}")
                continue
            if not isinstance(values, list) or not values:
                ck.add(fp, f"expected a non-empty list of values to try; found {found(values)}")
                continue
            if fpath in SWITCHED:  # off / on / on with these fields
                values = [SWITCHES.get(v, v) if isinstance(v, (str, bool)) or v is None else v
                          for v in values]
            bad = False
            for i, value in enumerate(values):
                if value is None and fpath in SWITCHED:
                    continue
                if isinstance(value, str) and fpath in SWITCHED:
                    ck.add((*fp, i), f"expected off, on or a mapping of {fpath} fields; "
                                     f"found {value!r}")
                    bad = True
                    break
                problems = check_overlay(path_overlay(fpath, value))
                for _sub, msg in problems[:1]:
                    ck.add((*fp, i) if msg.startswith("expected") else fp, msg)
                    bad = True
                if bad:
                    break
            if bad:
                continue
            if len({repr(v) for v in values}) != len(values):
                ck.add(fp, f"expected distinct values; found {values!r}")
                continue
            dims.append(Dimension(model=str(model), path=fpath, values=tuple(values),
                                  where=ck.where(fp)))
    return dims


def _objective(ck: Checker, raw: Any, path: KeyPath) -> Objective | None:
    m = ck.mapping(raw, path, ("maximize", "minimize", "weighted"))
    if m is None:
        return None
    if len(m) != 1:
        ck.add(path, "expected exactly one of maximize, minimize or weighted; found "
               f"{', '.join(m) or 'none'}")
        return None
    goal, value = next(iter(m.items()))
    if goal == "weighted":
        if not isinstance(value, dict) or not value:
            ck.add((*path, goal), f"expected a mapping of metric -> weight, e.g. {{throughput: "
                   f"2, p99: 1}}; found {found(value)}")
            return None
        weights = []
        for metric, w in value.items():
            if metric not in OBJECTIVE_METRICS:
                ck.add((*path, goal, metric), _unknown_metric(metric))
            elif ck.number(w, (*path, goal, metric), 0, exclusive=True) is not None:
                weights.append((str(metric), float(w)))
        return Objective("weighted", weights=tuple(weights)) if weights else None
    if value not in OBJECTIVE_METRICS:
        ck.add((*path, goal), _unknown_metric(value))
        return None
    if (value in MAXIMIZED) != (goal == "maximize"):
        better = "maximize" if value in MAXIMIZED else "minimize"
        ck.add((*path, goal), f"{value} is a metric to {better}; found {goal}: {value}")
        return None
    return Objective(goal, str(value))


def _unknown_metric(metric: Any) -> str:
    return (f"unknown objective metric {found(metric)}; expected one of "
            f"{', '.join(OBJECTIVE_METRICS)}")


def parse_tune(ck: Checker, raw: Any) -> TuneSpec | None:
    path: KeyPath = ("tune",)
    m = ck.mapping(raw, path, TUNE_KEYS, ("models", "load"))
    if m is None:
        return None
    dims = _dimensions(ck, m["models"], (*path, "models")) if "models" in m else []
    load = _load(ck, m["load"], (*path, "load")) if "load" in m else None
    objective = (_objective(ck, m["objective"], (*path, "objective")) if "objective" in m
                 else Objective("maximize", "throughput"))
    constraints: list[Any] = []
    gpu_memory = 0
    if "constraints" in m:
        cp = (*path, "constraints")
        c = ck.mapping(m["constraints"], cp, (*THRESHOLD_METRICS, "gpu_memory"))
        if c is not None:
            constraints = _threshold_items(ck, {k: v for k, v in c.items() if k != "gpu_memory"},
                                           cp, None)
            if "gpu_memory" in c:
                gpu_memory = ck.size(c["gpu_memory"], (*cp, "gpu_memory")) or 0
    strategy = ck.choice(m, "strategy", path, STRATEGIES, "quick")
    budget_s, trials = 0.0, 0
    if "budget" in m:
        b = parse_budget(m["budget"])
        if isinstance(b, str):
            ck.add((*path, "budget"), b)
        else:
            budget_s, trials = b
    seed = ck.integer(m.get("seed", 0), (*path, "seed"), 0) or 0
    fixed: dict[str, dict[str, Any]] = {}
    if "config" in m:
        if not isinstance(m["config"], dict):
            ck.add((*path, "config"), "expected a mapping of model -> config overlay set on every "
                   f"trial; found {found(m['config'])}")
        else:
            for model, overlay in m["config"].items():
                for sub, msg in check_overlay(overlay):
                    ck.add((*path, "config", model, *sub), msg)
                if isinstance(overlay, dict):
                    fixed[str(model)] = overlay
    size = 1
    for d in dims:
        size *= len(d.values)
    if size > MAX_GRID:
        ck.add((*path, "models"), f"the grid has {size} configs; expected at most {MAX_GRID}")
    if not dims or load is None or objective is None:
        return None
    return TuneSpec(dimensions=tuple(dims), load=load, objective=objective,
                    constraints=tuple(constraints), gpu_memory_bytes=gpu_memory, strategy=strategy,
                    budget_s=budget_s, budget_trials=trials, seed=seed, config=fixed)
