"""Capacity planning: the highest arrival rate each config sustains within an SLO, and how many
replicas a peak needs.

Pure functions and a small search state machine; run/capacity.py runs the measurements. The
search brackets (doubling up from the start rate until the SLO breaks, or halving down until it
holds), bisects until the bracket is within `precision`, then repeats the best passing rate to
confirm it; a failed confirmation moves the bracket down, lengthens every later probe to the
confirmation's window, and the search goes on. Every probe is
an ordinary open-loop step in results.json, so the report shows the evidence for the answer.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from loadkit.errors import CapacityInputError

MAX_CONFIRMS = 3
MAX_EDGES = 2  # probes spent per side to find where the SLO holds (breaks) with confidence
EDGE_STEP = 0.15  # each such probe 15% further from the answer
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(/s)?\s*$")


def parse_peak(text: str) -> tuple[float | None, float | None]:
    """`--peak 3000/s` (a rate) or `--peak 3x` (a replay's traffic, three times as fast):
    (rate, speed), one of them None."""
    m = re.match(r"^\s*([0-9]*\.?[0-9]+)\s*x\s*$", text)
    if m is not None and float(m[1]) > 0:
        return None, float(m[1])
    try:
        return parse_rate(text, "--peak"), None
    except CapacityInputError:
        raise CapacityInputError(f"--peak: expected a rate such as 3000/s, or a multiple of "
                                 f"the replayed traffic such as 3x (above 0); found "
                                 f"{text!r}") from None


def parse_rate(text: str, flag: str) -> float:
    m = _RATE.match(text)
    if m is None or float(m[1]) <= 0:
        raise CapacityInputError(f"{flag}: expected a rate above 0 such as 3000 or 3000/s; "
                                 f"found {text!r}")
    return float(m[1])


def replicas(peak: float, max_rate: float, headroom: float) -> int:
    """Replicas so that at the peak each runs at no more than (1 - headroom) of its max."""
    return math.ceil(peak / (max_rate * (1.0 - headroom)) - 1e-9)


@dataclass(kw_only=True)
class Probe:
    rate: float
    kind: str  # bracket | bisect | confirm | edge
    passed: bool  # the measured values held every limit
    broken: list[str]
    step: int
    latency_us: dict[str, float]
    achieved_rate: float
    generator_limited: bool  # sends left late: the generator did not keep the schedule
    # the SLO judged with the probe's intervals (slo.probe_outcome): held / broken with
    # confidence, inconclusive, or no interval (a replay probe of one round)
    outcome: str = "no interval"
    limited_by: str = ""  # server (arrivals found every slot busy: dropped) | generator | ""
    rounds: int = 1


@dataclass(kw_only=True)
class Search:
    """Where the search stands for one config; `next_rate` says what to measure next."""

    start: float
    precision: float = 0.05
    min_rate: float = 1.0
    max_rate: float = 100_000.0
    probes: list[Probe] = field(default_factory=list)
    lo: float | None = None  # highest rate that held (below hi)
    hi: float | None = None  # lowest rate that broke
    confirmed: bool = False
    # Set by a failed confirmation: near the edge the short probes were optimistic (a queue
    # that grows slowly passes 3 s and breaks in 6 s), so every later probe measures as long
    # as a confirmation and the bisection is no longer drawn back to a rate that cannot hold.
    long_probes: bool = False
    stopped: str = ""  # why the search ended early: budget, aborted, floor, ceiling

    def _kind(self) -> str:
        if self.hi is None or self.lo is None:
            return "bracket"
        return "confirm" if self._narrow() else "bisect"

    def _narrow(self) -> bool:
        assert self.lo is not None and self.hi is not None
        return (self.hi - self.lo) / self.lo <= self.precision

    def long(self, kind: str) -> bool:
        """Whether the next probe of this kind measures for the confirmation's longer window."""
        return kind == "confirm" or self.long_probes

    def next_rate(self) -> tuple[float, str] | None:
        if self.stopped:
            return None
        if self.confirmed:
            return self._edge()
        if not self.probes:
            return self.start, "bracket"
        if self.lo is None:  # nothing held yet: halve
            rate = self.probes[-1].rate / 2 if not self.probes[-1].passed else self.start
            if rate < self.min_rate:
                self.stopped = "floor"
                return None
            return round(rate, 2), "bracket"
        if self.hi is None:  # everything held so far: double
            rate = self.lo * 2
            if rate > self.max_rate:
                self.stopped = "ceiling"
                return None
            return round(rate, 2), "bracket"
        if self._narrow():
            confirms = sum(p.kind == "confirm" for p in self.probes)
            if confirms >= MAX_CONFIRMS:
                self.stopped = "unstable"
                return None
            return self.lo, "confirm"
        return round((self.lo + self.hi) / 2, 2), "bisect"

    def record(self, probe: Probe) -> None:
        self.probes.append(probe)
        if probe.kind == "edge":  # measured for the interval: the answer stands
            return
        rate = probe.rate
        if probe.passed:
            if probe.kind == "confirm" and rate == self.lo:
                self.confirmed = True
            if self.hi is None or rate < self.hi:
                self.lo = max(self.lo or 0.0, rate)
        else:
            if probe.kind == "confirm":
                self.long_probes = True
            self.hi = rate if self.hi is None else min(self.hi, rate)
            if self.lo is not None and self.lo >= self.hi:
                held = [p.rate for p in self.probes if p.passed and p.rate < self.hi]
                self.lo = max(held) if held else None

    def _edge(self) -> tuple[float, str] | None:
        """After the confirmation, at most MAX_EDGES probes a side, each 15% further out: below
        the lowest rate whose SLO was not held with confidence until one holds with confidence
        (so that below the interval every probe held), and above the answer until one breaks
        with confidence (the interval's top). None: done."""
        if all(p.outcome == "no interval" for p in self.probes):
            return None  # probes without intervals: another would not have one either
        low, high = self.interval()
        edges = [p for p in self.probes if p.kind == "edge"]
        if low is not None and not any(p.outcome == "held" and p.rate < low
                                       for p in self.probes):
            below = [p for p in edges if p.rate < low]
            if len(below) < MAX_EDGES:
                rate = round(min([low, *(p.rate for p in below)]) * (1 - EDGE_STEP), 2)
                if rate >= self.min_rate:
                    return rate, "edge"
        if high is None and self.hi is not None:
            above = [p for p in edges if p.rate > (self.lo or 0)]
            if len(above) < MAX_EDGES:
                rate = round(max([self.hi, *(p.rate for p in above)]) * (1 + EDGE_STEP), 2)
                if rate <= self.max_rate:
                    return rate, "edge"
        return None

    def interval(self) -> tuple[float | None, float | None]:
        """The answer's interval across runs, from the probes' outcomes judged with their
        intervals: from the lowest rate whose SLO was not held with confidence (below it,
        every probe held) to the lowest that broke it with confidence. In between, probes were
        inconclusive (or contradicted each other as the server's speed moved): another run may
        answer anywhere there. None at an end no probe reached."""
        unsure = [p.rate for p in self.probes if p.outcome in ("inconclusive", "broken")]
        broke = [p.rate for p in self.probes if p.outcome == "broken"]
        low = min(unsure) if unsure else None
        if low is not None and self.lo is not None:
            low = min(low, self.lo)  # the answer itself lies in its interval
        return low, (min(broke) if broke else None)

    @property
    def best(self) -> Probe | None:
        """The measurement that stands for the answer: the last passing probe at `lo`."""
        at = [p for p in self.probes if p.passed and p.rate == self.lo]
        return at[-1] if at else None


def phase_summary(name: str, search: Search, status: str, reason: str,
                  peak: float | None, headroom: float, batch: float,
                  replay_rate: float | None = None,
                  peak_speed: float | None = None) -> dict[str, Any]:
    """One phase's answer. A replay phase (`replay_rate`: its file's mean rate at speed 1)
    searched the speed: its max rate is the file's mean at the highest speed that held, and
    its peak is a speed (`--peak 3x`) or a rate turned into one."""
    best = search.best
    top = search.lo if best else None
    rate = top * replay_rate if top and replay_rate is not None else top
    out: dict[str, Any] = {
        "phase": name,
        "status": status,
        "reason": reason,
        "max_rate": round(rate, 2) if rate else None,
        "max_infer_s": round(rate * batch, 2) if rate else None,
        "latency_us": best.latency_us if best else {},
        "bracket": [search.lo, search.hi],
        "confirmed": search.confirmed,
        "stopped": search.stopped,
        "generator_limited": any(p.generator_limited for p in search.probes if not p.passed),
        "limited_by": sorted({p.limited_by for p in search.probes
                              if not p.passed and p.limited_by}),
        "points": [asdict(p) for p in search.probes],
    }
    out |= _interval(search, replay_rate)
    if replay_rate is not None:
        out |= {"search": "speed", "max_speed": top, "rate_at_speed_1": round(replay_rate, 2)}
        if peak_speed is None and peak is not None and replay_rate > 0:
            peak_speed = peak / replay_rate
        if peak_speed is not None and top:
            out["peak_speed"] = round(peak_speed, 3)
            out["replicas"] = replicas(peak_speed, top, headroom)
    elif peak is not None and rate:
        out["replicas"] = replicas(peak, rate, headroom)
    elif peak_speed is not None:
        out["reason"] = (reason + "; " if reason else "") + (
            f"--peak {peak_speed:g}x is a multiple of replayed traffic; this phase's load is "
            "a rate (give --peak as requests/s)")
    return out


def _interval(search: Search, replay_rate: float | None) -> dict[str, Any]:
    """The answer's interval (rates, and a replay's speeds) with what it means."""
    low, high = search.interval()
    held = [p.rate for p in search.probes if p.outcome == "held"]
    crossed = bool(held and low is not None and max(held) > low)
    scale = replay_rate if replay_rate is not None else 1.0
    out: dict[str, Any] = {
        "interval": [None if low is None else round(low * scale, 2),
                     None if high is None else round(high * scale, 2)]}
    if replay_rate is not None:
        out["interval_speed"] = [low, high]
    if all(p.outcome == "no interval" for p in search.probes):
        out["interval_note"] = ("no probe had an interval (a replay's seconds follow its "
                                "file: measure each probe in rounds, --repeats 3 or auto)")
    else:
        out["interval_note"] = ("from the lowest rate whose SLO was not held with confidence "
                                "to the lowest that broke it with confidence"
                                + ("" if low is not None and high is not None else
                                   "; an end no probe reached is open")
                                + ("; a rate held with confidence above the interval's start: "
                                   "the server's speed moved between probes" if crossed else ""))
    return out


def cheapest(phases: list[dict[str, Any]]) -> str | None:
    """Fewest replicas for the peak (or, without a peak, the most per replica); ties go to
    the higher max rate."""
    found = [p for p in phases if p.get("max_rate")]
    if not found:
        return None
    best = min(found, key=lambda p: (p.get("replicas", 0), -p["max_rate"]))
    return str(best["phase"])
