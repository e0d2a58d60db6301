"""load_scenario: the YAML file, through every section's checks, into one Scenario."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from loadkit.errors import ScenarioError
from loadkit.scenario.checks import Checker, found
from loadkit.scenario.llm import with_cancel, with_endpoint
from loadkit.scenario.model import (
    DEFAULT_AUTO_ROUNDS,
    MAX_REPEATS,
    MIN_AUTO_ROUNDS,
    ConcurrencyLoad,
    Goodput,
    PhaseSpec,
    RequestTemplate,
    Requirements,
    Scenario,
    Thresholds,
)
from loadkit.scenario.phases import _phases, _thresholds
from loadkit.scenario.replay import with_replay_templates
from loadkit.scenario.requests import _mix, _template
from loadkit.scenario.source import load_yaml
from loadkit.scenario.target import _target
from loadkit.scenario.tune import parse_tune

TOP_KEYS = (
    "name", "description", "target", "requests", "mix", "think_time", "thresholds", "phases",
    "goodput", "tune", "repeats", "max_repeats", "max_time", "confidence", "noise_threshold",
)


def load_scenario(path: str | Path, base: Path | None = None) -> Scenario:
    """Parse and validate a scenario file offline; raises ScenarioError listing every problem.
    `base`: the folder its relative paths are read from (default: the file's own; a scenario
    rewritten elsewhere, as command-line overrides are, keeps its source's)."""
    path = Path(path)
    src = load_yaml(path)
    ck = Checker(src, (base or path.parent).resolve())
    top = ck.mapping(src.data, (), TOP_KEYS, ("requests",))
    if top is None:
        raise ScenarioError(ck.problems or [src.problem((), "not a scenario")])
    name = top.get("name", path.stem)
    if not isinstance(name, str) or not re.match(r"^[\w.\-]+$", name):
        ck.add(
            ("name",), f"expected a name of letters, digits, '.', '_' or '-'; found {found(name)}"
        )
        name = path.stem
    target = _target(ck, top.get("target", {}))
    requests: dict[str, RequestTemplate] = {}
    raw_requests = top.get("requests")
    if "requests" in top:
        if not isinstance(raw_requests, dict) or not raw_requests:
            ck.add(
                ("requests",),
                f"expected a mapping of request name -> template; found {found(raw_requests)}",
            )
        else:
            for rname, rraw in raw_requests.items():
                where = ("requests", rname)
                t = with_endpoint(ck, rraw, where, with_cancel(
                    ck, rraw, where, _template(ck, rname, rraw, where)))
                if t is not None:
                    requests[rname] = t
    names = list(raw_requests) if isinstance(raw_requests, dict) else []
    mix = _mix(ck, top.get("mix"), names)
    think = ck.duration(top.get("think_time", 0), ("think_time",), True)
    ck.request_names = tuple(names)
    thresholds = None
    if "thresholds" in top:
        thresholds = _thresholds(ck, top["thresholds"], ("thresholds",))
    phases = _phases(ck, top["phases"]) if "phases" in top else ()
    tune = parse_tune(ck, top["tune"]) if "tune" in top else None
    if "phases" not in top and "tune" not in top:
        ck.add((), "missing required key 'phases' (or a 'tune' section for `loadkit tune`)")
    if "phases" not in top and tune is not None:  # `loadkit run` measures the config as it is
        phases = (PhaseSpec(name="baseline", load=tune.load, config={}, requires=Requirements(),
                            thresholds=Thresholds(tune.constraints)),)
    if "goodput" not in top:
        where = [(("thresholds",), thresholds)] + [(("phases", i, "thresholds"), ph.thresholds)
                                                   for i, ph in enumerate(phases)]
        for key, ts in where:
            if ts is not None and any(t.metric == "goodput_min" for t in ts.items):
                ck.add((*key, "goodput_min"), "goodput_min needs the scenario's goodput: "
                       "{first_response: ..., inter_response: ...} to say which requests are "
                       "good; found no goodput")
    if thresholds is not None:
        phases = tuple(
            dataclasses.replace(ph, thresholds=thresholds.extended(ph.thresholds))
            for ph in phases
        )
    phases = with_replay_templates(ck, requests, phases)
    _check_sequences(ck, requests, phases)
    goodput = _goodput(ck, top["goodput"]) if "goodput" in top else None
    repeats, auto, max_time = _repeats(ck, top)
    confidence = _confidence(ck, top["confidence"]) if "confidence" in top else 0.95
    noise = _noise(ck, top["noise_threshold"]) if "noise_threshold" in top else 0.05
    if ck.problems:
        raise ScenarioError(ck.problems)
    return Scenario(name=name, path=path, target=target, requests=requests, mix=mix,
                    think_time_s=think or 0.0, phases=phases, source=src, goodput=goodput,
                    tune=tune, repeats=repeats, confidence=confidence, noise_threshold=noise,
                    auto=auto, max_time_s=max_time)


def _repeats(ck: Checker, top: dict[str, Any]) -> tuple[int, bool, float]:
    """`repeats: N`, or `repeats: auto` with `max_repeats` (default 10) and `max_time`:
    (rounds, or the most rounds for auto; auto; max_time in seconds, 0 for none)."""
    raw = top.get("repeats", 1)
    auto = raw == "auto"
    for key in ("max_repeats", "max_time"):
        if key in top and not auto:
            ck.add((key,), f"{key} bounds `repeats: auto`; found repeats: {raw!r} (give "
                           "repeats: auto, or drop it)")
    if not auto:
        if isinstance(raw, str):
            ck.add(("repeats",), f"expected an integer between 1 and {MAX_REPEATS}, or auto; "
                                 f"found {raw!r}")
            return 1, False, 0.0
        return ck.integer(raw, ("repeats",), 1, MAX_REPEATS) or 1, False, 0.0
    most = (ck.integer(top["max_repeats"], ("max_repeats",), MIN_AUTO_ROUNDS, MAX_REPEATS)
            if "max_repeats" in top else None) or DEFAULT_AUTO_ROUNDS
    limit = ck.duration(top["max_time"], ("max_time",), False) if "max_time" in top else None
    return most, True, limit or 0.0


def _share(raw: Any) -> float | None:
    """`95%` or `0.95` as a number (None when it is neither)."""
    value = raw
    if isinstance(raw, str) and raw.strip().endswith("%"):
        try:
            value = float(raw.strip()[:-1]) / 100
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _confidence(ck: Checker, raw: Any) -> float:
    """`confidence: 95%` (or 0.95): the level of every interval and verdict."""
    value = _share(raw)
    if value is None or not 0.5 <= value < 1:
        ck.add(("confidence",), f"expected a confidence level from 50% to 99.99% such as "
                                f"95% or 0.95; found {raw!r}")
        return 0.95
    return value


def _noise(ck: Checker, raw: Any) -> float:
    """`noise_threshold: 5%` (or 0.05): a change smaller than this is `same` (criterion.rs's
    noise threshold; 0 turns it off)."""
    value = _share(raw)
    if value is None or not 0 <= value <= 0.5:
        ck.add(("noise_threshold",), f"expected a share from 0% to 50% such as 5% or 0.05; "
                                     f"found {raw!r}")
        return 0.05
    return value


def _goodput(ck: Checker, raw: Any) -> Goodput | None:
    """`goodput: {first_response: 200ms, inter_response: 20ms, latency: 5s}`."""
    path = ("goodput",)
    m = ck.mapping(raw, path, ("first_response", "inter_response", "latency"))
    if m is None:
        return None
    if not m:
        ck.add(path, "expected at least one of first_response, inter_response, latency")
        return None
    limits = {}
    for key in ("first_response", "inter_response", "latency"):
        if key in m:
            seconds = ck.duration(m[key], (*path, key), False)
            if seconds is not None:
                limits[f"{key}_us"] = seconds * 1e6
    return Goodput(**limits)


def _check_sequences(ck: Checker, requests: dict[str, RequestTemplate],
                     phases: tuple[PhaseSpec, ...]) -> None:
    """Every open sequence needs its own correlation id: the ids must cover the most users a
    closed-loop phase runs and an open-loop phase's `max_concurrency` (without one, the id
    range is the cap on open sequences and arrivals beyond it are dropped, counted)."""
    seq = {n: t.sequence for n, t in requests.items() if t.sequence is not None}
    if not seq:
        return
    most = max((max(ph.load.levels) if isinstance(ph.load, ConcurrencyLoad)
                else ph.load.max_concurrency for ph in phases), default=1)
    for name, s in seq.items():
        size = s.ids[1] - s.ids[0] + 1
        if size < most:
            ck.add(("requests", name, "sequence", "ids"),
                   f"{size} correlation ids for up to {most} sequences in flight; expected at "
                   f"least {most}")
