"""Run a loadkit scenario with plain Locust, web UI included:

    locust -f locustfile.py --scenario FILE.yaml

(loadkit's gRPC engine needs a process Locust has not monkey-patched: this file re-executes the
command with LOCUST_SKIP_MONKEY_PATCH=1 when it was not set; see loadkit/locust/__init__.py.)

Without --triton-target the embedded Triton is started for the session and stopped when Locust
quits. With `--master` the master runs the phases and the controller, and `--worker` processes
(given the same --scenario) send the load. The scenario's phases drive the load: the user count
and spawn rate fields of the web UI are ignored, because the shape (LoadkitShape) sets them step
by step.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import gevent
import gevent.monkey
from locust import events
from locust.runners import MasterRunner, WorkerRunner

from loadkit.errors import LoadkitError
from loadkit.exits import EXIT_BAD_INPUT, EXIT_SIGINT, err, report_error
from loadkit.locust import webui
from loadkit.locust.assembly import new_run
from loadkit.locust.bootstrap import PATCHED, PATCHED_MESSAGE, reexec_unpatched
from loadkit.locust.distributed import WorkerAgent
from loadkit.locust.shape import LoadkitShape
from loadkit.locust.users import TritonUser
from loadkit.run.run import Run
from loadkit.run.session import Session, default_out
from loadkit.scenario import load_scenario

__all__ = ["LoadkitShape", "TritonUser"]

reexec_unpatched()
# Locust's own main loop waits for workers (`--expect-workers`) and quits with time.sleep, which
# only yields to the hub when patched. Patching time alone is safe for the engine thread.
gevent.monkey.patch_time()


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    parser.add_argument("--scenario", help="loadkit scenario YAML", env_var="LOADKIT_SCENARIO")
    parser.add_argument(
        "--triton-target",
        default="",
        help="HOST:PORT (default: embedded Triton)",
        env_var="LOADKIT_TARGET",
    )
    parser.add_argument(
        "--triton-metrics",
        default="",
        help="Triton's Prometheus URL (default: the embedded server's, or target.metrics)",
        env_var="LOADKIT_METRICS",
    )
    parser.add_argument("--loadkit-out", default="", help="report folder (default reports/...)")
    parser.add_argument("--loadkit-seed", type=int, default=0,
                        help="seed for the request mix (as `loadkit run --seed`; default 0)")


class _LocustSession:
    """What the locustfile owns for the Locust process: the target (run/session.py) and a
    new Run for every test the web UI starts."""

    def __init__(self, environment: Any):
        opts = environment.parsed_options
        if not opts.scenario:
            raise LoadkitError("--scenario is required (a loadkit scenario YAML)")
        scenario = load_scenario(opts.scenario)
        self.out = opts.loadkit_out
        self.seed = opts.loadkit_seed
        self.target = Session(scenario, opts.triton_target or scenario.target.address,
                              opts.triton_metrics or None)
        self.scenario = self.target.scenario
        self.environment = environment

    def new_run(self) -> Run:
        out = Path(self.out) if self.out else default_out(self.scenario.name)
        assert self.target.control is not None
        run = new_run(self.target, out, seed=self.seed,
                      distributed=isinstance(self.environment.runner, MasterRunner),
                      renew=self.new_run)
        run.attach(self.environment)
        return run

    def close(self) -> None:
        self.target.close(log_copy=Path(self.environment.loadkit.out_dir) / "tritonserver.log")


def _start_worker(environment: Any) -> None:
    """`locust -f ... --worker`: no server, no controller; the master says where to send."""
    try:
        agent = WorkerAgent(environment, load_scenario(environment.parsed_options.scenario))
    except LoadkitError as exc:
        sys.exit(report_error(exc))
    environment.events.quitting.add_listener(lambda **_: agent.stop())


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    if environment.parsed_options is None:
        return  # imported by `loadkit run`, which builds its own Run
    if PATCHED:
        err(PATCHED_MESSAGE)
        sys.exit(EXIT_BAD_INPUT)
    if isinstance(environment.runner, WorkerRunner):
        _start_worker(environment)
        return
    try:
        session = _LocustSession(environment)
    except LoadkitError as exc:
        sys.exit(report_error(exc))
    session.new_run()
    webui.install(environment)
    _prefill_form(environment, session)
    _hdr_summary_instead_of_locusts()
    interrupted = {"signal": 0}
    _quiet_locust_lines(interrupted)

    def _on_sigint() -> None:
        """Ctrl-C at any point: an unpatched process never sees KeyboardInterrupt while the
        gevent hub waits (seen: idle after a finished run, Triton still up), so SIGINT takes
        Locust's own SIGTERM path: quitting fires, the run stops, the server goes."""
        interrupted["signal"] = signal.SIGINT
        err("Ctrl-C: stopping the run and writing its report")
        os.kill(os.getpid(), signal.SIGTERM)

    gevent.signal_handler(signal.SIGINT, _on_sigint)

    @environment.events.quitting.add_listener
    def _on_quit(**_: Any) -> None:
        run = environment.loadkit
        if run.conductor.greenlet is not None and not run.conductor.finished.is_set():
            run.conductor.abort("interrupted" if interrupted["signal"] else "Locust quit",
                                EXIT_SIGINT if interrupted["signal"] else 0)
            run.conductor.finished.wait(30)
        session.close()
        if (Path(run.out_dir) / "summary.md").exists():
            print((Path(run.out_dir) / "summary.md").read_text())
        print(f"loadkit report: {run.out_dir}", file=sys.stderr)
        if environment.process_exit_code is None and run.conductor.greenlet is not None:
            environment.process_exit_code = run.exit_code()


def _prefill_form(environment: Any, session: _LocustSession) -> None:
    """The start form shows the run's target (Locust would leave Host empty and ask for one)
    and its most users (Locust shows 0 in the field it disables for a shape: charts.js fills
    it in); the scenario's phases still drive the load."""
    most = webui.peak_users(session.scenario)
    opts = environment.parsed_options
    opts.num_users = opts.num_users or most
    opts.spawn_rate = opts.spawn_rate or most
    environment.host = environment.host or f"grpc://{session.target.address}"


class _LocustLines(logging.Filter):
    """Two Locust lines that mislead here: the spawn-rate warning (the shape sets every step's
    users at once, by design) and "Got SIGTERM" after a Ctrl-C (loadkit turns SIGINT into
    Locust's SIGTERM path, and says so itself)."""

    def __init__(self, interrupted: dict[str, int]):
        super().__init__()
        self.interrupted = interrupted

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "spawn rate is very high" in text:
            return False
        return not (text.startswith("Got SIGTERM") and self.interrupted["signal"])


def _quiet_locust_lines(interrupted: dict[str, int]) -> None:
    for name in ("locust.runners", "locust.main"):
        logging.getLogger(name).addFilter(_LocustLines(interrupted))


def _hdr_summary_instead_of_locusts() -> None:
    """At exit Locust prints its own tables, whole milliseconds from its own statistics; the
    run's summary (HDR, µs) is printed instead (quitting, above). Locust looks these up on its
    stats module at call time."""
    import locust.stats

    def quiet(*_: Any, **__: Any) -> None:
        return None

    for name in ("print_stats", "print_percentile_stats", "print_error_report"):
        setattr(locust.stats, name, quiet)
