"""A phase's `load: {replay: FILE, speed: 3, ...}`: recorded traffic as the load (the file
read by scenario/traffic.py), and the mapping of its models to the scenario's templates."""

from __future__ import annotations

import dataclasses
from typing import Any

from loadkit.errors import DatasetError, suggest
from loadkit.scenario.checks import Checker, found
from loadkit.scenario.model import MAX_CONCURRENCY, PhaseSpec, ReplayLoad, RequestTemplate
from loadkit.scenario.source import KeyPath
from loadkit.scenario.traffic import ANY, profile_traffic, read_traffic

REPLAY_KEYS = ("speed", "window", "loop", "models", "sample_rate")


def replay_load(ck: Checker, m: dict[str, Any], path: KeyPath) -> ReplayLoad | None:
    """The load, with the file read now (a bad file is refused before anything is sent)."""
    for key in ("arrival", "until_stable"):
        if key in m:
            ck.add((*path, key), f"'{key}' does not apply to a 'replay' load (the file gives "
                                 "the arrivals)")
    speeds = _speeds(ck, m.get("speed", 1), (*path, "speed"))
    window = _window(ck, m["window"], (*path, "window")) if "window" in m else None
    sample = ck.integer(m.get("sample_rate", 1), (*path, "sample_rate"), 1, 1_000_000)
    loop = ck.boolean(m, "loop", path, False)
    step = (ck.duration(m["step_duration"], (*path, "step_duration"), False)
            if "step_duration" in m else 0.0)
    if loop and not step:
        ck.add((*path, "loop"), "loop: true replays the file again and again; expected a "
                                "step_duration to end each step")
    warmup = ck.duration(m.get("warmup", 0), (*path, "warmup"), True)
    cap = ck.integer(m.get("max_concurrency", 0), (*path, "max_concurrency"), 0,
                     MAX_CONCURRENCY)
    late = ck.duration(m.get("late_tolerance", 0.005), (*path, "late_tolerance"), True)
    models = m.get("models", {})
    if not isinstance(models, dict) or not all(isinstance(v, str) for v in models.values()):
        ck.add((*path, "models"), f"expected a mapping of model -> request template; found "
                                  f"{found(models)}")
        models = {}
    raw = m["replay"]
    names = raw if isinstance(raw, list) and raw and all(isinstance(f, str) for f in raw) \
        else None
    file = ", ".join(names) if names else ck.string(raw, (*path, "replay"),
                                                    "a traffic file (or a list of a trace's parts)")
    if file is None or speeds is None or sample is None or warmup is None or cap is None \
            or late is None or step is None:
        return None
    try:
        where = [(ck.base_dir / f).resolve() for f in names] if names else \
            (ck.base_dir / file).resolve()
        traffic = read_traffic(where, window, sample, seed=0)
    except (DatasetError, OSError, UnicodeDecodeError, ValueError) as exc:
        ck.add((*path, "replay"), f"{file}: {exc}")
        return None
    return ReplayLoad(traffic=traffic, levels=speeds, warmup_s=warmup, spec=f"replay {file}",
                      loop=loop, step_duration_s=step,
                      sample_rate=sample, max_concurrency=cap, late_tolerance_s=late,
                      templates=tuple(models.get(name, "") for name in traffic.models))


def profile_load(ck: Checker, m: dict[str, Any], path: KeyPath) -> ReplayLoad | None:
    """`rate: {profile: [[0s, 100], [60s, 100], [61s, 800], [90s, 800], [91s, 100]]}` (the
    rate linear between the points) or k6's `rate: {start: 100, stages: [{duration: 60s,
    target: 800}, ...]}`: one step as long as the shape, arrivals constant or poisson."""
    p = (*path, "rate")
    shape = ck.mapping(m["rate"], p, ("profile", "stages", "start"))
    if shape is None:
        return None
    for key in ("step_duration", "until_stable", *REPLAY_KEYS):
        if key in m:
            ck.add((*path, key), f"'{key}' does not apply to a rate profile (its points give "
                                 "the step's length)")
    points = (_points(ck, shape["profile"], (*p, "profile")) if "profile" in shape and
              "stages" not in shape else _stages(ck, shape, p))
    arrival = ck.choice(m, "arrival", path, ("constant", "poisson"), "constant")
    seed = ck.integer(m.get("seed", 0), (*path, "seed"), 0)
    warmup = ck.duration(m.get("warmup", 0), (*path, "warmup"), True)
    cap = ck.integer(m.get("max_concurrency", 0), (*path, "max_concurrency"), 0,
                     MAX_CONCURRENCY)
    late = ck.duration(m.get("late_tolerance", 0.005), (*path, "late_tolerance"), True)
    if points is None or seed is None or warmup is None or cap is None or late is None:
        return None
    try:
        traffic = profile_traffic(points, arrival == "poisson", seed)
    except DatasetError as exc:
        ck.add(p, str(exc))
        return None
    return ReplayLoad(traffic=traffic, levels=(1.0,), warmup_s=warmup, spec="rate profile",
                      templates=(ANY,),
                      max_concurrency=cap, late_tolerance_s=late)


def _points(ck: Checker, raw: Any, path: KeyPath) -> list[tuple[float, float]] | None:
    expected = "a list of [time, rate] points such as [[0s, 100], [60s, 800]]"
    if not isinstance(raw, list) or len(raw) < 2:
        ck.add(path, f"expected {expected} (at least two); found {found(raw)}")
        return None
    out: list[tuple[float, float]] = []
    for i, item in enumerate(raw):
        if not (isinstance(item, list) and len(item) == 2):
            ck.add((*path, i), f"expected [time, rate]; found {found(item)}")
            return None
        t = ck.duration(item[0], (*path, i), True)
        r = ck.number(item[1], (*path, i), 0, exclusive=False)
        if t is None or r is None:
            return None
        if out and t <= out[-1][0]:
            ck.add((*path, i), f"expected times in increasing order; found {t:g} s after "
                               f"{out[-1][0]:g} s")
            return None
        out.append((t, r))
    if out[0][0] != 0:
        ck.add((*path, 0), f"expected the first point at 0s; found {out[0][0]:g} s")
        return None
    return out


def _stages(ck: Checker, shape: dict[str, Any], path: KeyPath) -> list[tuple[float, float]] | None:
    """k6's ramping-arrival-rate: from `start`, each stage ramps linearly to its target."""
    if "stages" not in shape:
        ck.add(path, "expected 'profile' (points) or 'stages' (k6's ramping stages)")
        return None
    start = ck.number(shape.get("start", 0), (*path, "start"), 0, exclusive=False)
    raw = shape["stages"]
    if not isinstance(raw, list) or not raw or start is None:
        ck.add((*path, "stages"), f"expected a list of {{duration, target}}; found {found(raw)}")
        return None
    points, t = [(0.0, float(start))], 0.0
    for i, item in enumerate(raw):
        q = (*path, "stages", i)
        st = ck.mapping(item, q, ("duration", "target"), ("duration", "target"))
        if st is None:
            return None
        d = ck.duration(st.get("duration"), (*q, "duration"), False)
        target = ck.number(st.get("target"), (*q, "target"), 0, exclusive=False)
        if d is None or target is None:
            return None
        t += d
        points.append((t, float(target)))
    return points


def _speeds(ck: Checker, raw: Any, path: KeyPath) -> tuple[float, ...] | None:
    values = raw if isinstance(raw, list) and raw else [raw]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1000
           for v in values):
        return tuple(float(v) for v in values)
    ck.add(path, f"expected a speed above 0 (2: twice as fast) or a list of speeds; found "
                 f"{found(raw)}")
    return None


def _window(ck: Checker, raw: Any, path: KeyPath) -> tuple[float, float] | None:
    if not isinstance(raw, list) or len(raw) != 2:
        ck.add(path, f"expected [start, end] such as [0s, 60s]; found {found(raw)}")
        return None
    lo, hi = (ck.duration(v, path, True) for v in raw)
    if lo is None or hi is None:
        return None
    if hi <= lo:
        ck.add(path, f"expected start < end; found {raw}")
        return None
    return lo, hi


def with_replay_templates(ck: Checker, requests: dict[str, RequestTemplate],
                          phases: tuple[PhaseSpec, ...]) -> tuple[PhaseSpec, ...]:
    """Each replayed model's template: `models:` names it, else the template of that name,
    else the only template for that model; a file without models leaves the choice to the
    phase's mix."""
    out = []
    for i, ph in enumerate(phases):
        load = ph.load
        if not isinstance(load, ReplayLoad):
            out.append(ph)
            continue
        chosen = []
        for model, given in zip(load.traffic.models, load.templates, strict=True):
            chosen.append(_template_for(ck, model, given, requests, ("phases", i, "load")))
        out.append(dataclasses.replace(ph, load=dataclasses.replace(load,
                                                                    templates=tuple(chosen))))
    return tuple(out)


def _template_for(ck: Checker, model: str, given: str, requests: dict[str, RequestTemplate],
                  path: KeyPath) -> str:
    if model == ANY:
        return ANY
    if given:
        if given not in requests:
            ck.add((*path, "models", model), f"no request named '{given}'"
                   f"{suggest(given, requests)} (have: {', '.join(requests)})")
        return given
    if model in requests:
        return model
    serving = [n for n, t in requests.items() if t.model == model]
    if len(serving) == 1:
        return serving[0]
    ck.add((*path, "replay"), f"the file has requests for model '{model}' and "
           + (f"templates {', '.join(serving)} send to it" if serving else
              "no template sends to it") + f"; expected models: {{{model}: TEMPLATE}}")
    return ANY

