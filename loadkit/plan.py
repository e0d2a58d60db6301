"""Plan: a validated scenario turned into the exact phases and steps that will run.

Plain frozen data, so `loadkit validate` can print what will happen before any load is sent, and
the drive stage only walks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadkit.scenario import Requirements, Scenario


@dataclass(frozen=True)
class Step:
    phase_index: int
    phase: str
    index: int
    concurrency: int
    warmup_s: float
    duration_s: float

    @property
    def key(self) -> str:
        return f"{self.phase}/{self.index}"

    @property
    def load(self) -> dict[str, int]:
        return {"concurrency": self.concurrency}


@dataclass(frozen=True)
class PhasePlan:
    index: int
    name: str
    steps: tuple[Step, ...]
    config: dict[str, dict[str, Any]] = field(default_factory=dict)
    requires: Requirements = Requirements()


@dataclass(frozen=True)
class Plan:
    scenario: str
    phases: tuple[PhasePlan, ...]
    think_time_s: float

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(s for p in self.phases for s in p.steps)

    @property
    def max_concurrency(self) -> int:
        return max(s.concurrency for s in self.steps)

    @property
    def estimated_s(self) -> float:
        return sum(s.warmup_s + s.duration_s for s in self.steps)

    def describe(self) -> str:
        lines = [
            f"plan for '{self.scenario}': {len(self.phases)} phase(s), "
            f"{len(self.steps)} step(s), about {self.estimated_s:.0f} s of load"
        ]
        for p in self.phases:
            levels = ", ".join(str(s.concurrency) for s in p.steps)
            first = p.steps[0]
            cfg = f"; config overlay for {', '.join(p.config)}" if p.config else ""
            if p.requires.gpu or p.requires.files:
                needs = ["a GPU"] if p.requires.gpu else []
                needs += [f.name for f in p.requires.files]
                cfg += f"; needs {', '.join(needs)}"
            lines.append(
                f"  {p.index + 1}. {p.name}: concurrency {levels}; each step "
                f"{first.warmup_s:g} s warm-up + {first.duration_s:g} s measured{cfg}"
            )
        return "\n".join(lines)


def build_plan(scenario: Scenario) -> Plan:
    phases = []
    for i, ph in enumerate(scenario.phases):
        steps = tuple(
            Step(i, ph.name, j, c, ph.load.warmup_s, ph.load.step_duration_s)
            for j, c in enumerate(ph.load.levels)
        )
        phases.append(PhasePlan(i, ph.name, steps, ph.config, ph.requires))
    return Plan(scenario.name, tuple(phases), scenario.think_time_s)
