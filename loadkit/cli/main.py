"""Command line (validate, run, capacity, tune, worker, ui, serve, report, compare): the parser and
`main`, the only place that turns errors into exit codes (cli/exits.py says which)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from loadkit.cli.commands import (
    cmd_compare,
    cmd_report,
    cmd_serve,
    cmd_ui,
    cmd_validate,
    cmd_worker,
)
from loadkit.cli.running import cmd_run
from loadkit.control.embedded import DEFAULT_MODEL_REPOSITORY
from loadkit.errors import LoadkitError
from loadkit.exits import EXIT_BAD_INPUT, EXIT_SIGINT, err, report_error


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loadkit", description="Scenario-driven load testing for Triton Inference Server.")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="validate a scenario and print its plan")
    v.add_argument("scenario")
    v.add_argument("--target", help="HOST:PORT of a Triton gRPC endpoint to check models against")
    v.add_argument(
        "--offline", action="store_true", help="do not contact the scenario's target server"
    )
    v.set_defaults(func=cmd_validate)
    r = sub.add_parser("run", help="run a scenario headless and write a report")
    _run_options(r)
    r.set_defaults(func=cmd_run)
    k = sub.add_parser(
        "capacity",
        help="find each config phase's highest arrival rate within an SLO, and replicas for a peak",
    )
    _capacity_options(k)
    _run_options(k)
    k.set_defaults(func=cmd_run)
    t = sub.add_parser(
        "tune", help="search the model-config space of the scenario's tune: section for the best "
                     "config under its constraints; writes best/<model>/config.pbtxt")
    t.add_argument("--strategy", choices=("brute", "quick", "bayes"),
                   help="brute: the whole grid; quick: climb one field at a time; bayes: optuna "
                        "TPE (default: tune.strategy, else quick)")
    t.add_argument("--budget", help="stop after this long ('15m', '90s') or this many trials "
                                    "('12 trials'); default: tune.budget, else no limit")
    t.add_argument("--resume", metavar="DIR",
                   help="continue the search saved in DIR (measures only the configs it has not "
                        "measured; writes into DIR unless --out says otherwise)")
    _run_options(t)
    t.set_defaults(func=cmd_run)
    _other_commands(sub)
    return parser


def _capacity_options(k: argparse.ArgumentParser) -> None:
    k.add_argument("--slo", required=True,
                   help="e.g. 'p99<50ms' or 'p99<50ms,p50<10ms,error_rate<0.5%%' "
                        "(error rate and dropped ratio default to 1%%)")
    k.add_argument("--peak", help="peak arrival rate to size for, e.g. 3000/s (requests/s)")
    k.add_argument("--headroom", type=float, default=0.3,
                   help="fraction of each replica's max kept free at the peak (default 0.3)")
    k.add_argument("--budget", type=float, default=600.0, metavar="S",
                   help="seconds of search for all phases together (default 600)")
    k.add_argument("--precision", type=float, default=0.05,
                   help="stop bisecting when the bracket is this tight (default 0.05 = 5%%)")
    k.add_argument("--max-rate", help="never try more than this rate (default: no ceiling)")
    k.add_argument("--start-rate", help="first rate to try (default: the phase's first rate, "
                                        "or 100/s)")


def _run_options(r: argparse.ArgumentParser) -> None:
    r.add_argument("scenario")
    r.add_argument("--target", help="HOST:PORT of a Triton gRPC endpoint (default: embedded)")
    r.add_argument(
        "--metrics", help="Triton's Prometheus URL, e.g. http://127.0.0.1:8002/metrics "
        "(default: target.metrics, or the embedded server's)"
    )
    r.add_argument("--out", help="report folder (default reports/<UTC timestamp>-<name>/)")
    r.add_argument("--seed", type=int, default=0, help="seed for the request mix (default 0)")
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    r.add_argument("--repeats", type=int, default=0, metavar="N",
                   help="measure every phase N times in interleaved rounds, for intervals that "
                        "see the machine's drift (default: the scenario's repeats, else 1)")
    r.add_argument("--prometheus-port", type=int, default=0, metavar="P",
                   help="serve loadkit's live metrics for Prometheus on this port while the run "
                        "lasts (docs/observe.md)")
    r.add_argument("--prometheus-host", default="127.0.0.1",
                   help="interface for --prometheus-port (default 127.0.0.1)")
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
    w = sub.add_parser("worker", help="send a master's load: a Locust worker for `run --master`")
    w.add_argument("scenario", help="the same scenario file the master runs")
    w.add_argument("--master-host", default="127.0.0.1")
    w.add_argument("--master-port", type=int, default=5557)
    w.add_argument("--seed", type=int, default=0)
    w.set_defaults(func=cmd_worker)
    rp = sub.add_parser(
        "report", help="re-render comparison.md, plots and report.html of a run folder"
    )
    rp.add_argument("run", help="a report folder written by `loadkit run`")
    rp.set_defaults(func=cmd_report)
    c = sub.add_parser("compare", help="compare the phases of two or more runs")
    c.add_argument(
        "runs", nargs="+", metavar="RUN", help="report folders (the first is the reference)"
    )
    c.add_argument("--labels", help="comma-separated names for the runs (default: folder names)")
    c.add_argument("--out", help="write comparison.md, plots and report.html here")
    c.set_defaults(func=cmd_compare)
    u = sub.add_parser(
        "ui", help="Locust's web UI with a Triton tab; arguments after -- go to Locust",
    )
    u.add_argument("scenario")
    u.add_argument("--target", help="HOST:PORT of a Triton gRPC endpoint (default: embedded)")
    u.add_argument("--web-host", default="127.0.0.1",
                   help="interface for the web UI (default 127.0.0.1)")
    u.add_argument("--web-port", type=int, default=8089)
    u.add_argument("--out", help="report folder of the first run (default reports/...)")
    u.set_defaults(func=cmd_ui)
    s = sub.add_parser("serve", help="run the embedded Triton in the foreground")
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
