"""The Run: one object ties a run together (scenario, plan, drive, controller, result, events).

Created once per run and attached to Locust's Environment (as `environment.loadkit`), so the
users, the shape and the conductor find it there instead of in module globals. The caller
chooses what varies, as Locust's Environment lets its caller choose a runner: the drive (a
local engine or a Locust master: `DriveFactory`), the conductor (ordinary, capacity search,
tune search: `ConductorFactory`) and the reporter that writes the files (report/). So run/
imports neither locust/ nor report/, and a new load-driving command adds its own factories.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from loadkit.clock import utcnow
from loadkit.control.client import ServerControl
from loadkit.control.controller import Controller
from loadkit.events import EventLog, ReportRenderFailed
from loadkit.exits import EXIT_FAILED, EXIT_OK
from loadkit.plan import Plan, build_plan
from loadkit.run.accounting import template_calls
from loadkit.run.conductor import Conductor, Hub
from loadkit.run.drive import Drive
from loadkit.run.results import RunResult
from loadkit.scenario import Scenario
from loadkit.slo import FAILING, Outcome, evaluate

log = logging.getLogger(__name__)

# (the run's plan, its event log) -> the drive that sends its load
DriveFactory = Callable[[Plan, EventLog], Drive]
ConductorFactory = Callable[[Hub], Conductor]


class Reporter(Protocol):
    """Writes a run's files: results.json and summary.md after every step (`write`, which
    returns what it wrote), the rest once at the end (`render`). report/ has the real one."""

    def write(self, out_dir: Path, result: RunResult) -> dict[str, Any]: ...

    def render(self, out_dir: Path) -> None: ...


class Run:
    def __init__(
        self,
        scenario: Scenario,
        address: str,
        control: ServerControl,
        out_dir: Path,
        embedded: bool,
        *,
        drive: DriveFactory,
        reporter: Reporter,
        conductor: ConductorFactory = Conductor,
        plan: Plan | None = None,
        baseline: dict[str, Any] | None = None,
        renew: Callable[[], Run] | None = None,
    ):
        self.scenario = scenario
        self.plan: Plan = plan if plan is not None else build_plan(scenario)
        self.address = address
        self.out_dir = out_dir
        self.reporter = reporter
        # `--baseline DIR`'s results.json: `repeats: auto` looks at the comparisons against
        # it too (the CI gate's), not only at the run's own phases
        self.baseline = baseline
        # the web UI's next start, once this run has finished (locust/shape.py); None: one run
        self.renew = renew
        self.result = RunResult(scenario_name=scenario.name, scenario=scenario.redacted(),
                                target=address, embedded=embedded, started_at=utcnow())
        self.events = EventLog(self.result.events)
        self.result.requests = list(self.plan.requests)
        self.result.repeats, self.result.confidence = self.plan.repeats, scenario.confidence
        self.result.noise_threshold = scenario.noise_threshold
        self.drive: Drive = drive(self.plan, self.events)
        self.batch_sizes = self.plan.batch_sizes
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
        self.conductor: Conductor = conductor(self)
        self.environment: Any = None
        self.last_report: dict[str, Any] = {}

    def exit_code(self) -> int:
        """The run's one exit-code decision, for the CLI and the locustfile alike: an abort's
        own code (130 / 143 interrupted, 1 failed), else 1 when the run is not complete, a
        threshold or SLO failed, or tune kept no config; else 0."""
        code = self.conductor.exit_code
        if code:
            return code
        if self.result.status != "complete":
            return EXIT_FAILED
        if any(o["status"] in FAILING for o in self.result.thresholds):
            return EXIT_FAILED  # an SLO gate: CI reads 1 (2 stays bad input)
        if self.result.tune and self.result.tune.get("best") is None:
            return EXIT_FAILED
        return EXIT_OK

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
        self.last_report = self.reporter.write(self.out_dir, self.result)
        if not final:
            return
        try:
            self.reporter.render(self.out_dir)
        except Exception as exc:  # results.json is safe on disk; say why the rest is missing
            log.exception("rendering the comparison report failed")
            self.events.add(ReportRenderFailed(repr(exc)))
            self.last_report = self.reporter.write(self.out_dir, self.result)
