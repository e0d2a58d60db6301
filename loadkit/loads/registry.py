"""The load models, by kind: which lane runner a step's load gets.

A load model is one file in loads/ with its lane runner, written against the lane interface
(engine/host.py) and nothing else of the engine; it is registered here under the kind of load
it runs, and the drive asks `runner_for` (locust/local_drive.py), so a new model is one file
and one entry. Sequence templates in a mix are each model's own business (a closed loop walks
sequences back to back, an open loop starts one per arrival). The kind's keys are checked in
scenario/phases.py and described in plan.py: those stages come before loads/ in the pipeline
(a plan is printed without an engine).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from loadkit.engine.host import LaneRunner
from loadkit.loads.closed import run_closed
from loadkit.loads.open_rate import run_replay, run_schedule
from loadkit.loads.sequence import Ids, sequences
from loadkit.plan import Arrivals
from loadkit.scenario import SequenceSpec

Specs = list[SequenceSpec | None] | None
Trackers = list[Ids | None] | None


@dataclass(frozen=True)
class LoadModel:
    kind: str
    what: str  # one line, for the docs and errors
    runner: Callable[[Arrivals | None, Specs, Trackers], LaneRunner]


def _closed(_a: Arrivals | None, specs: Specs, ids: Trackers) -> LaneRunner:
    return sequences(specs, ids) if specs and ids else run_closed


def _rate(a: Arrivals | None, specs: Specs, ids: Trackers) -> LaneRunner:
    return functools.partial(run_schedule, arrivals=a, specs=specs, ids=ids)


def _replay(a: Arrivals | None, _specs: Specs, _ids: Trackers) -> LaneRunner:
    return functools.partial(run_replay, arrivals=a)


MODELS = {m.kind: m for m in (
    LoadModel("concurrency", "closed loop: each lane sends its next request when the last "
              "ended (loads/closed.py; sequences: loads/sequence.py)", _closed),
    LoadModel("rate", "open loop on a schedule fixed in advance, constant or Poisson "
              "(loads/open_rate.py; sequences: loads/open_sequence.py)", _rate),
    LoadModel("replay", "open loop at a file's recorded offsets (loads/open_rate.py)", _replay),
)}


def kind_of(arrivals: Arrivals | None) -> str:
    """A step's load kind: no arrivals is a closed loop."""
    if arrivals is None:
        return "concurrency"
    return "replay" if arrivals.replay is not None else "rate"


def runner_for(arrivals: Arrivals | None, specs: Specs, ids: Trackers) -> LaneRunner:
    """The lane runner for a step's load (a mix with sequence templates: their ids)."""
    return MODELS[kind_of(arrivals)].runner(arrivals, specs, ids)
