"""Plan: a validated scenario turned into the exact phases and steps that will run.

Plain frozen data, so `loadkit validate` can print what will happen before any load is sent, and
the drive stage only walks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadkit.scenario import (
    RateLoad,
    ReplayLoad,
    RequestTemplate,
    Requirements,
    Scenario,
    Stability,
    Thresholds,
    mixed_shapes,
)


def load_label(load: dict[str, Any]) -> str:
    """A step's load as reports print it: '8', '300/s', '200/s poisson (cap 16)'."""
    if set(load) == {"concurrency"}:
        return str(load["concurrency"])
    if "replay" in load:
        label = f"{load['replay']} x{load['speed']:g}"
        return label + (f" (cap {load['max_concurrency']})" if load.get("max_concurrency")
                        else "")
    if "rate" in load:
        label = f"{load['rate']:g}/s"
        if load.get("arrival", "constant") != "constant":
            label += f" {load['arrival']}"
        if load.get("max_concurrency"):
            label += f" (cap {load['max_concurrency']})"
        return label
    return ", ".join(f"{k} {v}" for k, v in load.items())


@dataclass(frozen=True, kw_only=True)
class Replayed:
    """A replay step's arrivals: offsets (s, at the step's speed) and each one's template
    ('' for the mix to pick), from a traffic file (scenario/traffic.py)."""

    file: str
    format: str
    speed: float
    period_s: float  # the file's window at this speed (a looped replay starts again there)
    loop: bool
    templates: tuple[str, ...]  # per traffic model
    offsets: Any = field(repr=False, compare=False)  # numpy float64
    model_of: Any = field(repr=False, compare=False)  # numpy int32 index into templates
    in_file: int = 0
    # mooncake: each arrival's line of the file, the entry of its template's pool it sends
    entry_of: Any = field(default=None, repr=False, compare=False)
    times: int = 0  # a looped replay: the file this many times whole (0: while the step lasts)
    notes: tuple[str, ...] = ()  # what the file holds that a reader should know (gaps, order)

    def summary(self) -> dict[str, Any]:
        return {"file": self.file, "format": self.format, "speed": self.speed,
                "in_window": int(len(self.offsets)), "records": self.in_file,
                "window_s": round(self.period_s * self.speed, 3), "loop": self.loop,
                **({"times": self.times} if self.times else {}),
                **({"notes": list(self.notes)} if self.notes else {})}


@dataclass(frozen=True, kw_only=True)
class Arrivals:
    """An open-loop step's schedule: the whole run's rate, how it arrives, its limits (a
    replay's rate is its file's mean at the step's speed)."""

    rate: float
    arrival: str = "constant"
    seed: int = 0
    max_concurrency: int = 0
    late_tolerance_s: float = 0.005
    replay: Replayed | None = field(default=None, compare=False)


@dataclass(frozen=True, kw_only=True)
class Step:
    """One load level. Closed loop: `concurrency` users. Open loop (`arrivals` set): one user
    per process runs the schedule, so `concurrency` is 1 there."""

    phase_index: int
    phase: str
    index: int
    concurrency: int
    warmup_s: float
    duration_s: float
    arrivals: Arrivals | None = None
    # until_stable: extend the window, one duration_s at a time (run/stability.py)
    stable: Stability | None = None

    @property
    def key(self) -> str:
        return f"{self.phase}/{self.index}"

    @property
    def open_loop(self) -> bool:
        return self.arrivals is not None

    @property
    def load(self) -> dict[str, Any]:
        a = self.arrivals
        if a is None:
            return {"concurrency": self.concurrency}
        out: dict[str, Any] = ({"replay": a.replay.file, "speed": a.replay.speed}
                               if a.replay is not None else {"rate": a.rate,
                                                             "arrival": a.arrival})
        if a.max_concurrency:
            out["max_concurrency"] = a.max_concurrency
        return out

    @property
    def label(self) -> str:
        a = self.arrivals
        if a is not None and a.replay is not None:
            return f"replay {a.replay.file} x{a.replay.speed:g}"
        return f"concurrency {self.concurrency}" if a is None else f"rate {a.rate:g}/s"


@dataclass(frozen=True, kw_only=True)
class PhasePlan:
    index: int
    name: str
    steps: tuple[Step, ...]
    config: dict[str, dict[str, Any]] = field(default_factory=dict)
    requires: Requirements = Requirements()
    thresholds: Thresholds = Thresholds()
    mix: dict[str, float] = field(default_factory=dict)  # template -> weight in this phase


@dataclass(frozen=True, kw_only=True)
class Plan:
    scenario: str
    phases: tuple[PhasePlan, ...]
    think_time_s: float
    requests: tuple[str, ...] = ()  # what each template with several requests sends
    sequences: bool = False  # open-loop arrivals start sequences (loads/open_sequence.py)
    # per template, inferences per request: infer/s everywhere is requests x this
    batch_sizes: dict[str, int] = field(default_factory=dict)
    # every phase measured this many times, in interleaved rounds (run/conductor.py); with
    # `auto`, at most this many: rounds stop once every comparison is decided or `max_time_s`
    # of load has passed (loadkit/stats/sequential.py)
    repeats: int = 1
    auto: bool = False
    max_time_s: float = 0.0

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(s for p in self.phases for s in p.steps)

    @property
    def max_concurrency(self) -> int:
        return max(s.concurrency for s in self.steps)

    @property
    def estimated_s(self) -> float:
        """Seconds of load (with `auto`: at most, within its max_time)."""
        total = sum(s.warmup_s + s.duration_s for s in self.steps) * self.repeats
        return min(total, self.max_time_s) if self.auto and self.max_time_s else total

    def describe(self) -> str:
        lines = [
            f"plan for '{self.scenario}': {len(self.phases)} phase(s), "
            f"{len(self.steps)} step(s), {'at most' if self.auto else 'about'} "
            f"{self.estimated_s:.0f} s of load"
        ]
        if self.auto:
            limit = f" or {self.max_time_s:g} s of load" if self.max_time_s else ""
            lines.append(f"  repeats: auto: interleaved rounds (every phase in turn, then again "
                         f"in reverse order, ...) until every comparison is decided, at most "
                         f"{self.repeats} rounds{limit}")
        elif self.repeats > 1:
            lines.append(f"  {self.repeats} interleaved rounds: every phase in turn, then "
                         "again in reverse order, ... (each step's numbers pool its rounds)")
        varied = len({tuple(sorted(p.mix.items())) for p in self.phases}) > 1
        for p in self.phases:
            first = p.steps[0]
            if first.arrivals is None:
                levels = "concurrency " + ", ".join(str(s.concurrency) for s in p.steps)
            elif first.arrivals.replay is not None:
                r, a = first.arrivals.replay, first.arrivals
                source = (f"a rate profile ({len(r.offsets)} requests in "
                          f"{r.period_s * r.speed:g} s)" if r.format == "profile" else
                          f"replay of {r.file} ({r.format}, {len(r.offsets)} requests in "
                          f"{r.period_s * r.speed:g} s)")
                levels = (f"{source} at speed "
                          + ", ".join(f"{s.arrivals.replay.speed:g}" for s in p.steps
                                      if s.arrivals and s.arrivals.replay)
                          + (", looped" if r.loop else "")
                          + (f", at most {a.max_concurrency} in flight"
                             if a.max_concurrency else ""))
            else:
                a = first.arrivals
                what = "sequences open" if self.sequences else "in flight"
                cap = f", at most {a.max_concurrency} {what}" if a.max_concurrency else ""
                levels = (
                    f"{a.arrival} arrivals at "
                    + ", ".join(f"{s.arrivals.rate:g}" for s in p.steps if s.arrivals)
                    + (" sequences/s started" if self.sequences else " requests/s")
                    + cap
                )
            cfg = f"; config overlay for {', '.join(p.config)}" if p.config else ""
            if p.requires.gpu or p.requires.files:
                needs = ["a GPU"] if p.requires.gpu else []
                needs += [f.name for f in p.requires.files]
                cfg += f"; needs {', '.join(needs)}"
            replay = first.arrivals.replay if first.arrivals else None
            if replay is not None:  # the file decides each arrival's template
                cfg += "; the file sends " + _trace_split(replay)
            if (varied or len(p.mix) > 1) and (replay is None or "" in replay.templates):
                total = sum(p.mix.values())
                cfg += ("; mix " if replay is None else "; mix of its arrivals of no model ") \
                    + ", ".join(f"{n} {w / total:.0%}" for n, w in p.mix.items() if w > 0)
            lines.append(
                f"  {p.index + 1}. {p.name}: {levels}; each step "
                f"{first.warmup_s:g} s warm-up + {first.duration_s:g} s measured{cfg}"
            )
            lines += [f"     note: {n}" for n in (replay.notes if replay is not None else ())]
        lines += [f"  requests {r}" for r in self.requests]
        return "\n".join(lines)


def build_plan(scenario: Scenario) -> Plan:
    phases = []
    for i, ph in enumerate(scenario.phases):
        load = ph.load
        if isinstance(load, RateLoad):
            steps = tuple(
                Step(
                    phase_index=i, phase=ph.name, index=j, concurrency=1, warmup_s=load.warmup_s,
                    duration_s=load.step_duration_s,
                    arrivals=Arrivals(
                        rate=r, arrival=load.arrival, seed=load.seed + j,
                        max_concurrency=load.max_concurrency,
                        late_tolerance_s=load.late_tolerance_s,
                    ),
                    stable=load.stable,
                )
                for j, r in enumerate(load.levels)
            )
        elif isinstance(load, ReplayLoad):
            steps = tuple(replay_step(i, ph.name, j, load, speed, ph.mix or scenario.mix)
                          for j, speed in enumerate(load.levels))
        else:
            steps = tuple(
                Step(phase_index=i, phase=ph.name, index=j, concurrency=c, warmup_s=load.warmup_s,
                     duration_s=load.step_duration_s, arrivals=None, stable=load.stable)
                for j, c in enumerate(load.levels)
            )
        phases.append(PhasePlan(index=i, name=ph.name, steps=steps, config=ph.config,
                                requires=ph.requires, thresholds=ph.thresholds,
                                mix=ph.mix or scenario.mix))
    return Plan(scenario=scenario.name, phases=tuple(phases), think_time_s=scenario.think_time_s,
                requests=tuple(_describe_template(t) for t in scenario.requests.values()
                      if t.dataset is not None or t.pool > 1),
                sequences=any(t.sequence is not None for t in scenario.requests.values()),
                batch_sizes={n: t.batch_size for n, t in scenario.requests.items()},
                repeats=scenario.repeats,
                auto=scenario.auto, max_time_s=scenario.max_time_s)


def replay_step(i: int, phase: str, j: int, load: ReplayLoad, speed: float,
                mix: dict[str, float]) -> Step:
    """The step replaying `load` at `speed` (arrivals of no model go to the mix's template
    when it has only one, so the report can name it)."""
    traffic = load.traffic
    period = traffic.duration_s / speed
    only = next(iter(mix)) if len(mix) == 1 else ""
    replayed = Replayed(file=traffic.file.name, format=traffic.format, speed=speed,
                        period_s=period, loop=load.loop,
                        templates=tuple(t or only for t in load.templates),
                        offsets=traffic.offsets / speed, model_of=traffic.model_of,
                        in_file=traffic.in_file, entry_of=traffic.entry_of, times=load.times,
                        notes=traffic.notes)
    rate = len(traffic.offsets) / period
    return Step(phase_index=i, phase=phase, index=j, concurrency=1, warmup_s=load.warmup_s,
                duration_s=load.duration_s(speed),
                arrivals=Arrivals(rate=rate, arrival="replay", seed=j,
                                  max_concurrency=load.max_concurrency,
                                  late_tolerance_s=load.late_tolerance_s, replay=replayed))


def _trace_split(r: Replayed) -> str:
    """A replay's arrivals per template, as the file sends them ('the mix' for arrivals the
    file names no model for)."""
    counts: dict[str, int] = {}
    for m in r.model_of.tolist():
        name = r.templates[m] or "the mix"
        counts[name] = counts.get(name, 0) + 1
    total = sum(counts.values()) or 1
    return ", ".join(f"{n} {c / total:.0%} ({c})" for n, c in sorted(
        counts.items(), key=lambda kv: -kv[1]))


def _split(spec: Any, n: int) -> list[tuple[tuple[int, ...], int]]:
    """How many of a pool of n requests carry each of an input's shapes: what is sent, where
    the weights only ask (7 requests at 1:1:1 are 3, 2, 2)."""
    mixed = mixed_shapes(spec, n)
    return [(shape, mixed.count(shape)) for shape, _ in spec.shapes]


def _describe_template(t: RequestTemplate) -> str:
    """'prompts: 200 distinct requests from prompts.jsonl, in random order'."""
    if t.dataset is not None:
        count, b = len(t.dataset.entries), (t.batch_size if t.batched else 1)
        n = max(1, -(-count // b))
        where = f"from {t.dataset.file.name} ({count} entries)"
        if count % b:
            where += (f"; {count} is not a multiple of batch_size {b}: the last request takes "
                      f"the last {count % b} and wraps round to the first {b - count % b}")
        if t.sequence is not None and t.dataset.sequences:
            lens = t.dataset.sequences
            where += (f"; {len(lens)} sequences of {min(lens)}..{max(lens)} steps, each "
                      "walked in order by one user")
    else:
        n, where = t.pool, "generated (seeded)"
    shapes = [f"{s.name} shapes " + ", ".join(
        f"{list(shape)} x{w:g}" for shape, w in s.shapes) + " (the pool of "
        f"{n}: " + ", ".join(f"{list(shape)} {sent}" for shape, sent in _split(s, n)) + ")"
        for s in t.inputs if s.shapes]
    extra = f"; {'; '.join(shapes)}" if shapes else ""
    return f"{t.name}: {n} distinct requests {where}, in {t.order} order{extra}"
