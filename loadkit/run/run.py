"""The Run: one object ties a run together (scenario, plan, drive, controller, result, events).

Created once per run and attached to Locust's Environment (as `environment.loadkit`), so the
users, the shape and the conductor find it there instead of in module globals. The drive and
the conductor are chosen here and nowhere else: a local or a master drive, an ordinary or a
capacity-search conductor.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from loadkit.clock import utcnow
from loadkit.control.client import ServerControl
from loadkit.control.controller import Controller
from loadkit.events import EventLog, ReportRenderFailed
from loadkit.locust.distributed import MasterDrive
from loadkit.locust.local_drive import LocalDrive
from loadkit.plan import Plan, build_plan
from loadkit.report import render, write_report
from loadkit.run.accounting import template_calls
from loadkit.run.capacity import CapacityConductor, CapacitySpec
from loadkit.run.conductor import Conductor
from loadkit.run.drive import Drive
from loadkit.run.results import RunResult
from loadkit.run.slo import Outcome, evaluate
from loadkit.run.tune import TuneConductor, TuneRun
from loadkit.scenario import PhaseSpec, Requirements, Scenario, Thresholds

log = logging.getLogger(__name__)


class Run:
    def __init__(
        self,
        scenario: Scenario,
        address: str,
        control: ServerControl,
        out_dir: Path,
        embedded: bool,
        seed: int = 0,
        distributed: bool = False,
        capacity: CapacitySpec | None = None,
        tune: TuneRun | None = None,
    ):
        self.scenario = scenario
        # `loadkit tune` walks trials of its own load; its plan is that load as one phase
        self.plan: Plan = build_plan(scenario if tune is None else trial_scenario(scenario))
        self.address = address
        self.out_dir = out_dir
        self.result = RunResult(scenario.name, scenario.redacted(), address, embedded, utcnow())
        self.events = EventLog(self.result.events)
        self.result.requests = list(self.plan.requests)
        # A LocalDrive sends from this process; a MasterDrive has Locust workers send. The
        # conductor talks to either through the Drive protocol (run/drive.py).
        self.drive: Drive = (
            MasterDrive(scenario, address, self.events)
            if distributed
            else LocalDrive(scenario, self.plan, address, seed)
        )
        self.batch_sizes = {n: t.batch_size for n, t in scenario.requests.items()}
        self.template_models = {n: t.model for n, t in scenario.requests.items()}
        # template -> {model: requests there per request}: the accounting's expected counts
        self.template_calls = template_calls(
            self.template_models, {n: t.composing for n, t in scenario.requests.items()},
            {n: t.composing_known for n, t in scenario.requests.items()},
            {n: t.scripted for n, t in scenario.requests.items()})
        # llm templates: mean input tokens per request and what counted them (scenario/llm.py)
        self.input_tokens = {n: (t.llm.input_tokens_mean, t.llm.tokens_by)
                             for n, t in scenario.requests.items() if t.llm is not None}
        # model -> the template model it runs inside (an ensemble's steps, BLS calls)
        self.composing = {m: t.model for t in scenario.requests.values() for m in t.composing}
        self.controller = Controller(
            control, scenario.models, self.events, scenario.target.reload_timeout_s,
            observed=tuple(self.composing),
        )
        self.conductor: Conductor = (
            CapacityConductor(self, capacity) if capacity is not None
            else TuneConductor(self, tune) if tune is not None
            else Conductor(self)
        )
        self.environment: Any = None
        self.last_report: dict[str, Any] = {}

    def attach(self, environment: Any) -> None:
        environment.loadkit = self
        self.environment = environment
        environment.events.test_stop.add_listener(self._on_test_stop)
        self.drive.attach(environment)

    def _on_test_stop(self, **_: Any) -> None:
        self.drive.stop()

    def check_thresholds(self) -> list[Outcome]:
        if self.result.capacity or self.result.tune:  # searches break limits on purpose and
            # report that themselves
            return []
        outcomes = evaluate(self.plan, self.result.to_json())
        self.result.thresholds = [o.to_json() for o in outcomes]
        return outcomes

    def save(self, final: bool = False) -> None:
        if final:
            self.check_thresholds()
        self.last_report = write_report(self.out_dir, self.result)
        if not final:
            return
        try:
            render(self.out_dir)
        except Exception as exc:  # results.json is safe on disk; say why the rest is missing
            log.exception("rendering the comparison report failed")
            self.events.add(ReportRenderFailed(repr(exc)))
            self.last_report = write_report(self.out_dir, self.result)


def trial_scenario(scenario: Scenario) -> Scenario:
    """The scenario with one phase, its `tune:` load: the template of every trial."""
    assert scenario.tune is not None
    phase = PhaseSpec("trial", scenario.tune.load, {}, Requirements(), Thresholds())
    return dataclasses.replace(scenario, phases=(phase,))
