"""The Run: one object ties a run together (scenario, plan, drive state, controller, result).

Created once per run and attached to Locust's Environment (as `environment.loadkit`), so the
users, the shape and the conductor find it there instead of in module globals.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from loadkit.clock import utcnow
from loadkit.control.controller import Controller
from loadkit.control.server import ServerControl
from loadkit.drive.conductor import Conductor
from loadkit.drive.context import DriveContext
from loadkit.drive.distributed import MasterDrive
from loadkit.plan import Plan, build_plan
from loadkit.report import render, write_report
from loadkit.results import RunResult
from loadkit.scenario import Scenario
from loadkit.slo import Outcome, evaluate

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
    ):
        self.scenario = scenario
        self.plan: Plan = build_plan(scenario)
        self.address = address
        self.out_dir = out_dir
        self.result = RunResult(scenario.name, scenario.redacted(), address, embedded, utcnow())
        # DriveContext sends from this process; a MasterDrive (drive/distributed.py) has
        # Locust workers send. The conductor talks to either through begin/end.
        self.drive: DriveContext | MasterDrive = (
            MasterDrive(scenario, address, self.result.events)
            if distributed
            else DriveContext(scenario, self.plan, address, seed)
        )
        self.batch_sizes = {n: scenario.requests[n].batch_size for n in scenario.mix}
        self.template_models = {n: scenario.requests[n].model for n in scenario.mix}
        self.controller = Controller(
            control, scenario.models, self.result.events, scenario.target.reload_timeout_s
        )
        self.conductor = Conductor(self)
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
        if self.result.capacity:  # a capacity search breaks the SLO on purpose; it reports that
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
            self.result.events.append(
                {"at": utcnow(), "event": "report_render_failed", "detail": repr(exc)}
            )
            self.last_report = write_report(self.out_dir, self.result)
