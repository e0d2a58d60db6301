"""The commands other than run/capacity: validate, worker, ui, serve, report, compare."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from loadkit.exits import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    err,
)


def cmd_validate(args: argparse.Namespace) -> int:
    from loadkit.plan import build_plan
    from loadkit.scenario import checked_against, load_scenario

    scenario = load_scenario(args.scenario)
    address = None if args.offline else args.target or scenario.target.address
    if address:
        from loadkit.control.http_client import connect

        with connect(address, scenario.target) as control:
            control.wait_live(timeout_s=5)
            infos = {m: control.model_info(m) for m in scenario.models}
        scenario = checked_against(scenario, infos)
        checked = f"checked against the models on {address}"
    else:
        checked = "checked offline (no server asked; use --target to check model metadata)"
    print(f"{args.scenario}: OK, {checked}")
    print(build_plan(scenario).describe())
    if scenario.tune is not None:
        from loadkit.cli.running import describe_tune
        from loadkit.run.tune import TuneRun

        t = scenario.tune
        print(describe_tune(scenario, TuneRun(strategy=t.strategy, budget_s=t.budget_s,
                                              budget_trials=t.budget_trials)))
    return EXIT_OK


def cmd_worker(args: argparse.Namespace) -> int:
    """A Locust worker: the master tells it the target and opens and closes its gate."""
    import loadkit.locust.bootstrap  # noqa: F401, I001  (first: Locust must not monkey-patch)

    import gevent
    from locust.env import Environment

    from loadkit.locust.distributed import WorkerAgent
    from loadkit.locust.users import TritonUser
    from loadkit.locust.workers import PARENT_ENV
    from loadkit.scenario import load_scenario
    from loadkit.control.embedded import die_with_parent

    if os.environ.get(PARENT_ENV):
        die_with_parent(int(os.environ[PARENT_ENV]))
    scenario = load_scenario(args.scenario)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    env = Environment(user_classes=[TritonUser], stop_timeout=5)
    try:
        runner = env.create_worker_runner(args.master_host, args.master_port)
    except ConnectionError:
        err(f"no loadkit master answered at {args.master_host}:{args.master_port}")
        return EXIT_FAILED
    agent = WorkerAgent(env, scenario, args.seed)
    stop = {"signal": 0}

    def on_signal(signum: int) -> None:
        stop["signal"] = signum
        runner.quit()

    handlers = [gevent.signal_handler(s, on_signal, s) for s in (signal.SIGINT, signal.SIGTERM)]
    try:
        runner.greenlet.join()
    finally:
        agent.stop()
        for h in handlers:
            h.cancel()
    if stop["signal"]:
        return EXIT_SIGINT if stop["signal"] == signal.SIGINT else EXIT_SIGTERM
    return EXIT_OK


def cmd_ui(args: argparse.Namespace, extra: list[str]) -> int:
    """Locust's own web UI (with the Triton tab) on this scenario: `locust -f` underneath."""
    from loadkit.control.embedded import LOOPBACK_HOSTS
    from loadkit.scenario import load_scenario

    load_scenario(args.scenario)  # bad input stops here, with the usual messages and exit 2
    if args.web_host not in LOOPBACK_HOSTS:
        err(
            f"warning: the web UI listens on {args.web_host}:{args.web_port}; anyone who can "
            "reach it can start load. Pass Locust's --web-login (after --) to require a login."
        )
    import loadkit.locust

    locustfile = Path(loadkit.locust.__file__).resolve().parent / "locustfile.py"
    argv = [sys.executable, "-m", "locust", "-f", str(locustfile), "--scenario", args.scenario,
            "--web-host", args.web_host, "--web-port", str(args.web_port)]
    if args.target:
        argv += ["--triton-target", args.target]
    if args.out:
        argv += ["--loadkit-out", args.out]
    env = {**os.environ, "LOCUST_SKIP_MONKEY_PATCH": "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv + extra, env)
    return EXIT_FAILED  # not reached


def cmd_serve(args: argparse.Namespace) -> int:
    from loadkit.control.embedded import EmbeddedServer, unservable

    if args.models:
        models = tuple(args.models)
    else:  # every model this server can load; the others named, with why
        folders = [p for p in sorted(Path(args.model_repository).iterdir())
                   if (p / "config.pbtxt").exists()]
        skipped = {p.name: why for p in folders if (why := unservable(p))}
        for name, why in skipped.items():
            err(f"not loading {name}: {why}")
        models = tuple(p.name for p in folders if p.name not in skipped)
    server = EmbeddedServer(
        model_repository=Path(args.model_repository).resolve(),
        models=models,
        host=args.host,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        log_path=Path(args.log).resolve() if args.log else None,
        extra_args=(f"--trace-config=triton,file={Path(args.trace_file).resolve()}",)
        if args.trace_file else (),
    )
    stop = {"signal": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["signal"] = signum

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    server.start()
    try:
        print(f"Triton ready with models: {', '.join(models)}")
        print(f"  grpc    {server.grpc_address}")
        print(f"  http    {server.http_address}")
        print(f"  metrics {server.metrics_url}")
        print(f"  log     {server.log_path}")
        print("Ctrl-C to stop.", flush=True)
        while not stop["signal"]:
            if server.process is not None and server.process.poll() is not None:
                err(f"tritonserver exited with code {server.process.returncode}")
                return EXIT_FAILED
            time.sleep(0.2)
    finally:
        server.stop()
    return EXIT_SIGINT if stop["signal"] == signal.SIGINT else EXIT_SIGTERM


def cmd_report(args: argparse.Namespace) -> int:
    from loadkit.report import render

    run_dir = Path(args.run)
    md = render(run_dir)
    print(md, end="")
    print(f"report: {run_dir / 'report.html'}", file=sys.stderr)
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from loadkit.cli import gate
    from loadkit.report import read_run, render_comparison

    found = gate.rules(args)
    if found and len(args.runs) != 2:
        err(f"--fail-on gates one run against another: give BASE NEW; found {len(args.runs)} "
            "runs")
        return EXIT_BAD_INPUT
    if args.junit and not found:
        err("--junit writes the gate's cases: give --fail-on too")
        return EXIT_BAD_INPUT
    runs = []
    labels = args.labels.split(",") if args.labels else [Path(r).name for r in args.runs]
    if len(labels) != len(args.runs) or len(set(labels)) != len(labels):
        err(f"--labels needs {len(args.runs)} distinct names; found {args.labels!r}")
        return EXIT_BAD_INPUT
    for label, run_dir in zip(labels, args.runs, strict=True):
        results, hists = read_run(Path(run_dir))
        runs.append((label, results, hists))
    out = Path(args.out) if args.out else None
    md = render_comparison(runs, out, title=" vs ".join(labels))
    print(md, end="")
    for line in md.splitlines():  # what differs besides the configs, said on stderr too
        if line.startswith("WARNING: "):
            err(line)
    if out is not None:
        print(f"report: {out / 'report.html'}", file=sys.stderr)
    if found:
        return gate.apply(runs[0][1], runs[1][1], found, out, args.junit)
    return EXIT_OK


