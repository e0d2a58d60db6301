"""Command line (validate, run, capacity, tune, worker, ui, serve, report, compare): the parser and
`main`, the only place that turns errors into exit codes (cli/exits.py says which)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from loadkit import __version__
from loadkit.cli.commands import (
    cmd_compare,
    cmd_report,
    cmd_serve,
    cmd_ui,
    cmd_validate,
    cmd_worker,
)
from loadkit.cli.helptext import EXAMPLES, exit_codes
from loadkit.cli.quick import add_model_options
from loadkit.cli.running import cmd_init, cmd_run
from loadkit.cli.trace import add_trace_command
from loadkit.control.embedded import DEFAULT_MODEL_REPOSITORY
from loadkit.errors import LoadkitError
from loadkit.exits import EXIT_BAD_INPUT, EXIT_SIGINT, err, report_error

TARGET_HELP = ("HOST:PORT of a Triton gRPC endpoint, or http(s)://HOST:PORT for its HTTP/REST "
               "one")


def _command(sub: Any, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    """A subcommand whose --help says what it does, shows examples and the exit codes."""
    epilog = "\n\n".join(filter(None, [EXAMPLES.get(name, ""), exit_codes(name)]))
    return sub.add_parser(name, help=summary, description=description, epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loadkit", description="Scenario-driven load testing for Triton Inference Server.",
        epilog="`loadkit COMMAND --help` for a command's options, examples and exit codes.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"loadkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    v = _command(sub, "validate", "validate a scenario and print its plan",
                 "Check a scenario file (every problem, with file:line) and print its plan; "
                 "with a target, check its templates against the models' metadata too. Sends "
                 "no inference.")
    v.add_argument("scenario")
    v.add_argument("--target", "-u", help=TARGET_HELP + " to check models "
                                          "against")
    v.add_argument(
        "--offline", action="store_true", help="do not contact the scenario's target server"
    )
    v.set_defaults(func=cmd_validate)
    r = _command(sub, "run", "run a scenario (or one model: -m) and write a report",
                 "Drive the load a scenario file describes (or, with -m, one model at the load "
                 "the flags give, as perf_analyzer does), measure every request, check it "
                 "against the server's own counts and write the report.")
    _run_options(r, "run", optional=True)
    add_model_options(r)
    r.set_defaults(func=cmd_run)
    k = _command(
        sub, "capacity",
        "find each config phase's highest arrival rate within an SLO, and replicas for a peak",
        "Bracket and bisect the arrival rate of each phase (each config) for the highest that "
        "holds the SLO, confirm it, and size the replicas a peak rate needs.")
    _capacity_options(k)
    _run_options(k, "capacity", optional=True)
    add_model_options(k)
    k.set_defaults(func=cmd_run)
    t = _command(
        sub, "tune", "search the model-config space of the scenario's tune: section for the best "
                     "config under its constraints; writes best/<model>/config.pbtxt",
        "Search the config fields the scenario's tune: section names (brute, quick or bayes), "
        "re-measure the close ones, and write the best config with its interval.")
    t.add_argument("--strategy", choices=("brute", "quick", "bayes"),
                   help="brute: the whole grid; quick: climb one field at a time; bayes: optuna "
                        "TPE (default: tune.strategy, else quick)")
    t.add_argument("--budget", help="stop after this long ('15m', '90s') or this many trials "
                                    "('12 trials'); default: tune.budget, else no limit")
    t.add_argument("--resume", metavar="DIR",
                   help="continue the search saved in DIR (measures only the configs it has not "
                        "measured; writes into DIR unless --out says otherwise)")
    _run_options(t, "tune")
    t.set_defaults(func=cmd_run)
    i = _command(sub, "init", "write a scenario for a model from its metadata, to edit",
                 "Ask the server for the model's inputs and write the scenario `loadkit run -m` "
                 "would run, with every input spelled out, as a starting point to edit.")
    i.add_argument("--target", "-u", help=TARGET_HELP + " (default: "
                                          "the embedded server)")
    i.add_argument("-o", "--output", metavar="FILE", help="where to write (default MODEL.yaml)")
    i.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    add_model_options(i)
    i.set_defaults(func=cmd_init)
    add_trace_command(sub, _command)
    _other_commands(sub)
    return parser


def _capacity_options(k: argparse.ArgumentParser) -> None:
    k.add_argument("--slo", required=True,
                   help="e.g. 'p99<50ms' or 'p99<50ms,p50<10ms,error_rate<0.5%%' "
                        "(error rate and dropped ratio default to 1%%)")
    k.add_argument("--peak", help="the peak to size replicas for: a rate such as 3000/s, or a "
                                  "multiple of a replayed traffic such as 3x")
    k.add_argument("--headroom", type=float, default=0.3,
                   help="fraction of each replica's max kept free at the peak (default 0.3)")
    k.add_argument("--budget", default="10m", metavar="DURATION",
                   help="time for the search of all phases together, as tune's: '10m', '90s' "
                        "(or seconds; default 10m)")
    k.add_argument("--precision", type=float, default=0.05,
                   help="stop bisecting when the bracket is this tight (default 0.05 = 5%%)")
    k.add_argument("--max-rate", help="never try more than this rate (default: no ceiling)")
    k.add_argument("--start-rate", help="first rate to try, or a replay's first speed such as "
                                        "4x (default: the phase's first rate or speed, or "
                                        "100/s)")
    k.add_argument("--min-probe", metavar="DURATION",
                   help="every probe lasts at least this long; a replay repeats its file whole "
                        "to fill it (default: 5s for a replay, the phase's step_duration for a "
                        "rate)")


def _run_options(r: argparse.ArgumentParser, command: str, optional: bool = False) -> None:
    """The options run, capacity and tune share; each shows only those it accepts (tune runs
    in one process with fixed rounds; only run gates against a baseline)."""
    if optional:
        r.add_argument("scenario", nargs="?", help="a scenario file (or -m MODEL instead)")
    else:
        r.add_argument("scenario")
    r.add_argument("--target", "-u", help=TARGET_HELP + " (default: the "
                                          "embedded server)")
    r.add_argument(
        "--metrics", help="Triton's Prometheus URL, e.g. http://127.0.0.1:8002/metrics "
        "(default: target.metrics, or the embedded server's)"
    )
    r.add_argument("--out", help="report folder (default reports/<UTC timestamp>-<name>/)")
    r.add_argument("--seed", type=int, default=0, help="seed for the request mix (default 0)")
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    r.add_argument("--repeats", default="", metavar="N|auto",
                   help="measure every phase N times in interleaved rounds, for intervals that "
                        "see the machine's drift; auto: add rounds until every comparison is "
                        "decided (docs/verdicts.md). tune, capacity: each trial or probe N "
                        "times back to back. Default: the scenario's repeats, else 1")
    if command == "run":
        r.add_argument("--max-time", default="", metavar="DURATION",
                       help="with --repeats auto: no round that would end after this ('3m', "
                            "'90s'; default: the scenario's max_time, else none)")
        r.add_argument("--baseline", metavar="DIR",
                       help="a CI gate: after the run, compare each phase with the same phase of "
                            "this earlier report of the same scenario, and exit 1 on a regression "
                            "(--fail-on, default worse); writes gate.json and gate.junit.xml "
                            "(docs/ci.md)")
        r.add_argument("--fail-on", action="append", metavar="WORD[:METRICS]",
                       help="with --baseline: the words that fail the gate (worse, inconclusive, "
                            "unknown; worse:throughput,p99 for some metrics). Repeatable")
    if command != "tune":
        r.add_argument("--max-repeats", type=int, default=0, metavar="N",
                       help="with --repeats auto: at most N rounds (default: the scenario's "
                            "max_repeats, else 10)")
    r.add_argument("--prometheus-port", type=int, default=0, metavar="P",
                   help="serve loadkit's live metrics for Prometheus on this port while the run "
                        "lasts (docs/observe.md)")
    r.add_argument("--prometheus-host", default="127.0.0.1",
                   help="interface for --prometheus-port (default 127.0.0.1)")
    if command == "tune":
        return
    d = r.add_argument_group("distributed (Locust master + workers)")
    d.add_argument(
        "--workers", type=int, default=0, metavar="N",
        help="start a Locust master and N local worker processes that send the load",
    )
    d.add_argument(
        "--master", action="store_true",
        help="be a Locust master for workers started elsewhere (`loadkit worker`)",
    )
    d.add_argument("--expect-workers", type=int, default=1, metavar="N",
                   help="with --master: workers to wait for before the first step (default 1)")
    d.add_argument("--master-bind-host", default="127.0.0.1",
                   help="with --master: interface to listen on (default 127.0.0.1)")
    d.add_argument("--master-port", type=int, default=5557,
                   help="with --master: port to listen on (default 5557)")
    d.add_argument("--worker-wait", type=float, default=120.0, metavar="S",
                   help="seconds to wait for the workers to connect (default 120)")


def _other_commands(sub: Any) -> None:
    w = _command(sub, "worker", "send a master's load: a Locust worker for `run --master`",
                 "Join a `loadkit run --master` and send the share of its load the master "
                 "gives this process (start it with the master's scenario file).")
    w.add_argument("scenario", help="the same scenario file the master runs")
    w.add_argument("--master-host", default="127.0.0.1")
    w.add_argument("--master-port", type=int, default=5557)
    w.add_argument("--seed", type=int, default=0)
    w.set_defaults(func=cmd_worker)
    rp = _command(sub, "report", "re-render comparison.md, plots and report.html of a run "
                  "folder", "Render a report folder's results.json again (after an upgrade, "
                  "or to rebuild the plots); sends nothing.")
    rp.add_argument("run", help="a report folder written by `loadkit run`")
    rp.set_defaults(func=cmd_report)
    c = _command(sub, "compare", "compare the phases of two or more runs",
                 "Put the phases of two or more report folders side by side, every change "
                 "with its interval and verdict; warns when targets, configs or loads differ.")
    c.add_argument(
        "runs", nargs="+", metavar="RUN", help="report folders (the first is the reference)"
    )
    c.add_argument("--labels", help="comma-separated names for the runs (default: folder names)")
    c.add_argument("--out", help="write comparison.md, plots and report.html here")
    c.add_argument("--fail-on", action="append", metavar="WORD[:METRICS]",
                   help="a CI gate: exit 1 when a phase of the second run is WORD (worse, "
                        "inconclusive, unknown) against the same phase of the first at the "
                        "same load; optionally for some metrics only (worse:throughput,p99). "
                        "Repeatable. Writes gate.json and gate.junit.xml with --out "
                        "(docs/ci.md)")
    c.add_argument("--junit", metavar="FILE", help="with --fail-on: also write the gate's "
                                                   "JUnit XML here")
    c.set_defaults(func=cmd_compare)
    u = _command(sub, "ui", "Locust's web UI with a Triton tab; arguments after -- go to "
                 "Locust", "Serve Locust's web UI for the scenario: start and stop runs from "
                 "the browser; the Triton tab shows the server's numbers beside loadkit's.")
    u.add_argument("scenario")
    u.add_argument("--target", help=TARGET_HELP + " (default: embedded)")
    u.add_argument("--web-host", default="127.0.0.1",
                   help="interface for the web UI (default 127.0.0.1)")
    u.add_argument("--web-port", type=int, default=8089)
    u.add_argument("--out", help="report folder of the first run (default reports/...)")
    u.set_defaults(func=cmd_ui)
    s = _command(sub, "serve", "run the embedded Triton in the foreground",
                 "Start the Triton that ships with loadkit (pip's tritonserver) on fixed ports, "
                 "with the shipped model repository, until Ctrl-C.")
    s.add_argument(
        "--model-repository",
        default=str(DEFAULT_MODEL_REPOSITORY),
    )
    s.add_argument("--models", nargs="*", help="models to load (default: all in the repository)")
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; anything else exposes the server)",
    )
    s.add_argument("--grpc-port", type=int, default=8001)
    s.add_argument("--http-port", type=int, default=8000)
    s.add_argument("--metrics-port", type=int, default=8002)
    s.add_argument("--log", help="server log file (default: a temp folder)")
    s.add_argument("--trace-file", metavar="PATH",
                   help="where Triton writes traces when tracing is turned on (`loadkit trace`; "
                        "Triton's trace API cannot set the file, only the server's start)")
    s.set_defaults(func=cmd_serve)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:  # `loadkit ui FILE -- --web-login ...`: the rest is Locust's
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = build_parser().parse_args(argv)
    try:
        if args.func is cmd_ui:
            return cmd_ui(args, extra)
        if extra:
            err(f"arguments after -- are only for `loadkit ui`: {' '.join(extra)}")
            return EXIT_BAD_INPUT
        return int(args.func(args))
    except LoadkitError as exc:
        return report_error(exc)
    except KeyboardInterrupt:
        err("interrupted")
        return EXIT_SIGINT
