"""One assembly of a run for every entry point: `loadkit run`, `capacity` and `tune` (cli/) and
plain `locust -f locustfile.py` (locust/locustfile.py) build their Run here, with the drive
(this process's engine, or a master's workers), the conductor the command chose, the reporter
and the seed; Run.exit_code is their one exit-code decision."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadkit.events import EventLog
from loadkit.locust.distributed import MasterDrive
from loadkit.locust.local_drive import LocalDrive
from loadkit.plan import Plan, build_plan
from loadkit.report import Files
from loadkit.run.capacity import CapacityConductor, CapacitySpec
from loadkit.run.conductor import Conductor
from loadkit.run.drive import Drive
from loadkit.run.run import Run
from loadkit.run.tune import TuneConductor, TuneRun, trial_scenario


def new_run(session: Any, out_dir: Path, *, seed: int = 0, distributed: bool = False,
            capacity: CapacitySpec | None = None, tune: TuneRun | None = None,
            baseline: dict[str, Any] | None = None,
            renew: Callable[[], Run] | None = None) -> Run:
    """The Run for `session` (run/session.py): its plan (tune walks trials of its own load, as
    one phase), drive, conductor and reporter. `renew`: what the web UI calls to start the
    next run when this one has finished."""
    scenario, address = session.scenario, session.address
    plan = build_plan(scenario if tune is None else trial_scenario(scenario))

    def drive(plan: Plan, events: EventLog) -> Drive:
        if distributed:
            return MasterDrive(scenario, plan, address, events)
        return LocalDrive(scenario, plan, address, seed)

    conductor: Any = (functools.partial(CapacityConductor, spec=capacity) if capacity
                      else functools.partial(TuneConductor, opts=tune) if tune else Conductor)
    return Run(scenario, address, session.control, out_dir, session.embedded, drive=drive,
               reporter=Files(), conductor=conductor, plan=plan, baseline=baseline,
               renew=renew)
