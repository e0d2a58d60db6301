"""Run a loadkit scenario with plain Locust, web UI included:

    locust -f locustfile.py --scenario FILE.yaml

(loadkit's gRPC engine needs a process Locust has not monkey-patched: this file re-executes the
command with LOCUST_SKIP_MONKEY_PATCH=1 when it was not set; see loadkit/drive/__init__.py.)

Without --triton-target the embedded Triton is started for the session and stopped when Locust
quits. With `--master` the master runs the phases and the controller, and `--worker` processes
(given the same --scenario) send the load. The scenario's phases drive the load: the user count
and spawn rate fields of the web UI are ignored, because the shape (LoadkitShape) sets them step
by step.
"""

from __future__ import annotations

import os
import signal
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gevent
import gevent.monkey
from locust import events
from locust.runners import MasterRunner, WorkerRunner

from loadkit.control.server import ServerControl
from loadkit.drive import webui
from loadkit.drive.bootstrap import PATCHED, PATCHED_MESSAGE, reexec_unpatched
from loadkit.drive.distributed import WorkerAgent
from loadkit.drive.shape import LoadkitShape
from loadkit.drive.users import TritonUser
from loadkit.errors import LoadkitError, ScenarioError
from loadkit.run import Run
from loadkit.scenario import (
    check_against_models,
    load_scenario,
    unbatched_models,
    with_model_facts,
)
from loadkit.server import EmbeddedServer
from loadkit.slo import FAILING

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


class _Session:
    """What the locustfile owns for the Locust process: server, control client, current run."""

    def __init__(self, environment: Any):
        opts = environment.parsed_options
        if not opts.scenario:
            raise LoadkitError("--scenario is required (a loadkit scenario YAML)")
        self.scenario = load_scenario(opts.scenario)
        self.out = opts.loadkit_out
        self.server: EmbeddedServer | None = None
        address = opts.triton_target or self.scenario.target.grpc
        if not address:
            self.server = EmbeddedServer(models=self.scenario.models).start()
            address = self.server.grpc_address
        self.address = address
        metrics = opts.triton_metrics or (self.server.metrics_url if self.server else None)
        self.control = ServerControl(address, self.scenario.target, metrics)
        self.control.wait_live()
        infos = {m: self.control.model_info(m) for m in self.scenario.models}
        problems = check_against_models(self.scenario, infos)
        if problems:
            raise ScenarioError(problems)
        self.scenario = with_model_facts(self.scenario, unbatched_models(infos))
        self.environment = environment

    def new_run(self) -> Run:
        if self.out:
            out = Path(self.out)
        else:
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            out = Path("reports") / f"{stamp}-{self.scenario.name}"
        run = Run(
            self.scenario, self.address, self.control, out, self.server is not None,
            distributed=isinstance(self.environment.runner, MasterRunner),
        )
        run.attach(self.environment)
        run.session = self  # type: ignore[attr-defined]
        return run

    def close(self) -> None:
        self.control.close()
        if self.server is not None:
            self.server.copy_log(Path(self.environment.loadkit.out_dir) / "tritonserver.log")
            self.server.stop()


def _start_worker(environment: Any) -> None:
    """`locust -f ... --worker`: no server, no controller; the master says where to send."""
    try:
        agent = WorkerAgent(environment, load_scenario(environment.parsed_options.scenario))
    except ScenarioError as exc:
        for p in exc.problems:
            print(p, file=sys.stderr)
        sys.exit(2)
    environment.events.quitting.add_listener(lambda **_: agent.stop())


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    if environment.parsed_options is None:
        return  # imported by `loadkit run`, which builds its own Run
    if PATCHED:
        print(f"loadkit: {PATCHED_MESSAGE}", file=sys.stderr)
        sys.exit(2)
    if isinstance(environment.runner, WorkerRunner):
        _start_worker(environment)
        return
    try:
        session = _Session(environment)
    except ScenarioError as exc:
        for p in exc.problems:
            print(p, file=sys.stderr)
        sys.exit(2)
    except LoadkitError as exc:
        print(f"loadkit: {exc}", file=sys.stderr)
        sys.exit(2)
    session.new_run()
    webui.install(environment)
    _hdr_summary_instead_of_locusts()
    interrupted = {"signal": 0}

    def _on_sigint() -> None:
        """Ctrl-C at any point: an unpatched process never sees KeyboardInterrupt while the
        gevent hub waits (seen: idle after a finished run, Triton still up), so SIGINT takes
        Locust's own SIGTERM path: quitting fires, the run stops, the server goes."""
        interrupted["signal"] = signal.SIGINT
        os.kill(os.getpid(), signal.SIGTERM)

    gevent.signal_handler(signal.SIGINT, _on_sigint)

    @environment.events.quitting.add_listener
    def _on_quit(**_: Any) -> None:
        run = environment.loadkit
        if run.conductor.greenlet is not None and not run.conductor.finished.is_set():
            run.conductor.abort("interrupted" if interrupted["signal"] else "Locust quit", 0)
            run.conductor.finished.wait(30)
        session.close()
        if (Path(run.out_dir) / "summary.md").exists():
            print((Path(run.out_dir) / "summary.md").read_text())
        print(f"loadkit report: {run.out_dir}", file=sys.stderr)
        if environment.process_exit_code is None and run.conductor.greenlet is not None:
            failed = run.result.status != "complete" or any(
                o["status"] in FAILING for o in run.result.thresholds)
            environment.process_exit_code = (130 if interrupted["signal"] and
                                             run.result.status == "interrupted" else int(failed))


def _hdr_summary_instead_of_locusts() -> None:
    """At exit Locust prints its own tables, whole milliseconds from its own statistics; the
    run's summary (HDR, µs) is printed instead (quitting, above). Locust looks these up on its
    stats module at call time."""
    import locust.stats

    def quiet(*_: Any, **__: Any) -> None:
        return None

    for name in ("print_stats", "print_percentile_stats", "print_error_report"):
        setattr(locust.stats, name, quiet)
