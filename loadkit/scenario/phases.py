"""The phases section: loads (concurrency ramps, arrival rates), thresholds, requirements."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from loadkit.modelconfig import check_overlay, needs_gpu
from loadkit.scenario.checks import Checker, found
from loadkit.scenario.model import (
    ARRIVALS,
    AT_LEAST_METRICS,
    DURATION_METRICS,
    MAX_CONCURRENCY,
    MAX_RATE,
    THRESHOLD_METRICS,
    ConcurrencyLoad,
    PhaseSpec,
    RateLoad,
    ReplayLoad,
    Requirements,
    Stability,
    Threshold,
    Thresholds,
)
from loadkit.scenario.replay import REPLAY_KEYS, profile_load, replay_load
from loadkit.scenario.requests import _mix
from loadkit.scenario.source import KeyPath


def parse_ramp(spec: Any) -> tuple[tuple[int, ...] | None, str | None]:
    """'2:16:2' -> (2, 4, ..., 16); '2:32:x2' -> (2, 4, 8, 16, 32); 8 -> (8,); [1, 4, 8] ->
    (1, 4, 8). Returns (levels, error)."""
    expected = ("an integer, a list of integers, or a ramp 'start:stop:step' such as '2:16:2' "
                "('2:32:x2' doubles)")
    if isinstance(spec, bool):
        return None, f"expected {expected}; found {found(spec)}"
    if isinstance(spec, int):
        if not 1 <= spec <= MAX_CONCURRENCY:
            return None, f"expected a concurrency between 1 and {MAX_CONCURRENCY}; found {spec}"
        return (spec,), None
    if isinstance(spec, list):
        if not spec or not all(isinstance(v, int) and not isinstance(v, bool) for v in spec):
            return None, f"expected {expected}; found {spec!r}"
        if not all(1 <= v <= MAX_CONCURRENCY for v in spec):
            return None, f"expected concurrencies between 1 and {MAX_CONCURRENCY}; found {spec!r}"
        return tuple(spec), None
    if isinstance(spec, str):
        parts = spec.split(":")
        times = re.match(r"^\s*x(\d+)\s*$", parts[2]) if len(parts) == 3 else None
        if times and parts[0].strip().isdigit() and parts[1].strip().isdigit():
            start, stop, factor = int(parts[0]), int(parts[1]), int(times[1])
            if start < 1 or factor < 2 or stop < start or stop > MAX_CONCURRENCY:
                return None, (f"expected 1 <= start <= stop <= {MAX_CONCURRENCY} and a factor "
                              f">= 2 in 'start:stop:xFACTOR'; found '{spec}'")
            levels = [start]
            while levels[-1] * factor <= stop:
                levels.append(levels[-1] * factor)
            return tuple(levels), None
        if len(parts) in (2, 3) and all(p.strip().isdigit() for p in parts):
            start, stop = int(parts[0]), int(parts[1])
            step = int(parts[2]) if len(parts) == 3 else 1
            if start < 1 or step < 1:
                return (
                    None,
                    f"expected start >= 1 and step >= 1 in 'start:stop:step'; found '{spec}'",
                )
            if stop < start:
                return None, f"expected stop >= start in 'start:stop:step'; found '{spec}'"
            if stop > MAX_CONCURRENCY:
                return None, f"expected stop <= {MAX_CONCURRENCY}; found '{spec}'"
            return tuple(range(start, stop + 1, step)), None
    return None, f"expected {expected}; found {found(spec)}"


def _load(ck: Checker, raw: Any, path: KeyPath
          ) -> ConcurrencyLoad | RateLoad | ReplayLoad | None:
    allowed = (
        "concurrency", "rate", "replay", "step_duration", "warmup", "arrival", "seed",
        "max_concurrency", "late_tolerance", "until_stable", *REPLAY_KEYS,
    )
    m = ck.mapping(raw, path, allowed)
    if m is None:
        return None
    kinds = [k for k in ("concurrency", "rate", "replay") if k in m]
    if len(kinds) != 1:
        ck.add(path, "expected exactly one of 'concurrency' (closed loop), 'rate' (open loop) "
                     "or 'replay' (recorded traffic)" + (f"; found {', '.join(kinds)}"
                                                          if kinds else ""))
        return None
    if "replay" in m:
        return replay_load(ck, m, path)
    if isinstance(m.get("rate"), dict):
        return profile_load(ck, m, path)
    for key in REPLAY_KEYS:
        if key in m:
            ck.add((*path, key), f"'{key}' applies to a 'replay' load")
    if "step_duration" not in m:
        ck.add(path, "missing required key 'step_duration'")
        return None
    step = (
        ck.duration(m["step_duration"], (*path, "step_duration"), False)
        if "step_duration" in m
        else None
    )
    warmup = ck.duration(m.get("warmup", 2.0), (*path, "warmup"), True)
    stable = (_stable(ck, m["until_stable"], (*path, "until_stable"), step)
              if "until_stable" in m else None)
    if "concurrency" in m:
        for key in ("arrival", "seed", "max_concurrency", "late_tolerance"):
            if key in m:
                ck.add((*path, key), f"'{key}' applies to a 'rate' load, not to 'concurrency'")
        levels, err = parse_ramp(m["concurrency"])
        if err:
            ck.add((*path, "concurrency"), err)
        if levels is None or step is None or warmup is None:
            return None
        return ConcurrencyLoad(levels=levels, step_duration_s=step, warmup_s=warmup,
                               spec=str(m["concurrency"]), stable=stable)
    rates, err = parse_rate_ramp(m["rate"])
    if err:
        ck.add((*path, "rate"), err)
    arrival = ck.choice(m, "arrival", path, ARRIVALS, "constant")
    seed = m.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        ck.add((*path, "seed"), f"expected a non-negative integer; found {found(seed)}")
        seed = 0
    cap = m.get("max_concurrency", 0)
    if "max_concurrency" in m and (
        isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_CONCURRENCY
    ):
        ck.add(
            (*path, "max_concurrency"),
            f"expected an integer between 1 and {MAX_CONCURRENCY}; found {found(cap)}",
        )
        cap = 0
    late = ck.duration(m.get("late_tolerance", 0.005), (*path, "late_tolerance"), True)
    if rates is None or step is None or warmup is None or late is None:
        return None
    return RateLoad(
        levels=rates, step_duration_s=step, warmup_s=warmup, spec=str(m["rate"]),
        arrival=str(arrival), seed=seed, max_concurrency=cap, late_tolerance_s=late,
        stable=stable,
    )


def _stable(ck: Checker, raw: Any, path: KeyPath, seconds: float | None) -> Stability | None:
    """`until_stable: {within: 5%, windows: 3, max: 60s}` (perf_analyzer's stability)."""
    m = ck.mapping(raw, path, ("within", "windows", "max", "allow_unstable"), ("within",))
    if m is None or "within" not in m:
        return None
    within = _fraction(ck, m["within"], (*path, "within"))
    windows = ck.integer(m.get("windows", 3), (*path, "windows"), 2, 20)
    max_s = ck.duration(m.get("max", 60), (*path, "max"), False)
    if max_s is not None and seconds and windows and max_s < seconds * windows:
        ck.add((*path, "max"), f"expected at least {windows} windows of the step_duration "
                               f"({seconds * windows:g} s); found {max_s:g} s")
        return None
    if not within or windows is None or max_s is None:
        if within == 0:
            ck.add((*path, "within"), "expected a bound above 0 such as 5%; found 0")
        return None
    allow = m.get("allow_unstable", False)
    if not isinstance(allow, bool):
        ck.add((*path, "allow_unstable"), f"expected true or false; found {found(allow)}")
        allow = False
    return Stability(within=within, windows=windows, max_s=max_s, allow_unstable=allow)


def parse_rate_ramp(spec: Any) -> tuple[tuple[float, ...] | None, str | None]:
    """'100:500:100' -> (100, 200, ..., 500) requests/s; 250 -> (250,); [50, 200] -> (50, 200)."""
    expected = (
        "a rate in requests/s, a list of rates, or a ramp 'start:stop:step' such as '100:500:100'"
    )

    def ok(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= MAX_RATE

    if ok(spec):
        return (float(spec),), None
    if isinstance(spec, list) and spec and all(ok(v) for v in spec):
        return tuple(float(v) for v in spec), None
    if isinstance(spec, str):
        text = spec.strip().removesuffix("/s")
        parts = text.split(":")
        try:
            nums = [float(p) for p in parts]
        except ValueError:
            nums = []
        if len(nums) == 1 and 0 < nums[0] <= MAX_RATE:
            return (nums[0],), None
        if len(parts) in (2, 3) and len(nums) == len(parts):
            start, stop = nums[0], nums[1]
            step = nums[2] if len(nums) == 3 else 1.0
            if start <= 0 or step <= 0:
                return None, f"expected start > 0 and step > 0 in 'start:stop:step'; found '{spec}'"
            if stop < start:
                return None, f"expected stop >= start in 'start:stop:step'; found '{spec}'"
            if stop > MAX_RATE:
                return None, f"expected stop <= {MAX_RATE:.0f}; found '{spec}'"
            n = int((stop - start) / step + 1e-9) + 1
            return tuple(round(start + i * step, 6) for i in range(n)), None
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return None, f"expected a rate above 0 and at most {MAX_RATE:.0f} requests/s; found {spec}"
    return None, f"expected {expected}; found {found(spec)}"


def _phases(ck: Checker, raw: Any) -> tuple[PhaseSpec, ...]:
    if not isinstance(raw, list) or not raw:
        ck.add(("phases",), f"expected a non-empty list of phases; found {found(raw)}")
        return ()
    out: list[PhaseSpec] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        p: KeyPath = ("phases", i)
        m = ck.mapping(
            item, p, ("name", "load", "config", "requires", "thresholds", "mix"),
            ("name", "load")
        )
        if m is None:
            continue
        name = ck.string(m.get("name"), (*p, "name"), "a phase name") if "name" in m else None
        if name in names:
            ck.add((*p, "name"), f"duplicate phase name '{name}'")
        if name:
            names.add(name)
        load = _load(ck, m["load"], (*p, "load")) if "load" in m else None
        config: dict[str, dict[str, Any]] = {}
        if "config" in m:
            c = m["config"]
            if not isinstance(c, dict):
                ck.add(
                    (*p, "config"),
                    f"expected a mapping of model -> config overlay; found {found(c)}",
                )
            else:
                for model, overlay in c.items():
                    for sub, msg in check_overlay(overlay):
                        ck.add((*p, "config", model, *sub), msg)
                    if isinstance(overlay, dict):
                        config[model] = overlay
        requires = _requires(ck, m.get("requires"), (*p, "requires"), config)
        own = _thresholds(ck, m["thresholds"], (*p, "thresholds")) if "thresholds" in m else None
        mix = _mix(ck, m["mix"], list(ck.request_names), (*p, "mix")) if "mix" in m else {}
        if name and load:
            out.append(PhaseSpec(name=name, load=load, config=config, requires=requires,
                                 thresholds=own or Thresholds(), mix=mix))
    return tuple(out)


def _fraction(ck: Checker, value: Any, path: KeyPath) -> float | None:
    """'1%' or 0.01 -> 0.01."""
    expected = "a fraction such as 0.01 or a percentage such as '1%'"
    if isinstance(value, str) and re.match(r"^\s*\d+(\.\d+)?\s*%\s*$", value):
        f = float(value.strip().rstrip("%")) / 100
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        f = float(value)
    else:
        ck.add(path, f"expected {expected}; found {found(value)}")
        return None
    if not 0 <= f <= 1:
        ck.add(path, f"expected {expected} between 0 and 100%; found {value!r}")
        return None
    return f


def _threshold_items(
    ck: Checker, m: dict[str, Any], path: KeyPath, template: str | None
) -> list[Threshold]:
    out = []
    for metric, value in m.items():
        p = (*path, metric)
        where = ck.where(p)
        if metric in DURATION_METRICS:
            seconds = ck.duration(value, p, False)
            if seconds is not None:
                out.append(Threshold(metric=metric, limit=seconds * 1e6, template=template,
                                     where=where))
        elif metric in ("error_rate", "max_dropped"):
            f = _fraction(ck, value, p)
            if f is not None:
                out.append(Threshold(metric=metric, limit=f, template=template, where=where))
        elif metric in AT_LEAST_METRICS:
            n = ck.number(value, p, 0, exclusive=True)
            if n is not None:
                out.append(Threshold(metric=metric, limit=n, template=template, where=where))
    return out


def _thresholds(ck: Checker, raw: Any, path: KeyPath) -> Thresholds | None:
    """`thresholds: {p99: 50ms, error_rate: 1%, min_throughput: 500, templates: {...}}`."""
    m = ck.mapping(raw, path, (*THRESHOLD_METRICS, "abort_on_fail", "templates"))
    if m is None:
        return None
    abort = ck.boolean(m, "abort_on_fail", path, False)
    items = _threshold_items(
        ck, {k: v for k, v in m.items() if k in THRESHOLD_METRICS}, path, None
    )
    if "templates" in m:
        t = m["templates"]
        if not isinstance(t, dict):
            ck.add(
                (*path, "templates"),
                f"expected a mapping of request name -> thresholds; found {found(t)}",
            )
        else:
            for tname, traw in t.items():
                tp = (*path, "templates", tname)
                if tname not in ck.request_names:
                    ck.add(tp, f"no request template named '{tname}'{ck.suggest(tname)}")
                    continue
                tm = ck.mapping(traw, tp, DURATION_METRICS + ("error_rate",))
                if tm is not None:
                    items += _threshold_items(ck, tm, tp, str(tname))
    return Thresholds(tuple(items), abort)


def _requires(
    ck: Checker, raw: Any, path: KeyPath, config: dict[str, dict[str, Any]]
) -> Requirements:
    """`requires: {gpu: true, files: [...]}`; a KIND_GPU overlay implies gpu: true."""
    gpu = any(needs_gpu(overlay) for overlay in config.values())
    files: list[Path] = []
    if raw is None:
        return Requirements(gpu)
    m = ck.mapping(raw, path, ("gpu", "files"))
    if m is None:
        return Requirements(gpu)
    gpu = ck.boolean(m, "gpu", path, False) or gpu
    if "files" in m:
        names = m["files"]
        if not isinstance(names, list):
            ck.add((*path, "files"), f"expected a list of file paths; found {found(names)}")
        else:
            for i, name in enumerate(names):
                text = ck.string(name, (*path, "files", i), "a file path")
                if text:  # relative to the scenario file; absence skips the phase at run time
                    files.append((ck.base_dir / text).resolve())
    return Requirements(gpu, tuple(files))
