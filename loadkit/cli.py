"""Command line (validate, run, worker, serve, report, compare); the only place that maps errors
to exit codes.

Exit codes: 0 success, 1 the run itself failed, 2 bad input or unusable target, 130 / 143
interrupted by SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from loadkit.errors import LoadkitError, ScenarioError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_SIGINT, EXIT_SIGTERM = 130, 143


def _err(message: str) -> None:
    print(f"loadkit: {message}", file=sys.stderr)


def _default_out(name: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("reports") / f"{stamp}-{name}"


def cmd_validate(args: argparse.Namespace) -> int:
    from loadkit.plan import build_plan
    from loadkit.scenario import check_against_models, load_scenario

    scenario = load_scenario(args.scenario)
    address = None if args.offline else args.target or scenario.target.grpc
    if address:
        from loadkit.control.server import ServerControl

        with ServerControl(address, scenario.target) as control:
            control.wait_live(timeout_s=5)
            infos = {m: control.model_info(m) for m in scenario.models}
        problems = check_against_models(scenario, infos)
        if problems:
            raise ScenarioError(problems)
        checked = f"checked against the models on {address}"
    else:
        checked = "checked offline (no server asked; use --target to check model metadata)"
    print(f"{args.scenario}: OK, {checked}")
    print(build_plan(scenario).describe())
    return EXIT_OK


def _progress_line(run: Any, last: dict[str, Any]) -> str:
    st = run.conductor.status()
    now = time.monotonic()
    window = st["window"]
    rate = ""
    if window is not None:
        count = sum(window.successes(n) * b for n, b in run.batch_sizes.items())
        if last.get("window") is window:
            dt = now - last["t"]
            rate = f"  {(count - last['count']) / dt:8.1f} infer/s" if dt > 0 else ""
        merged = window.merged()
        if merged.get_total_count():
            rate += f"  p99 {merged.get_value_at_percentile(99) / 1000:.2f} ms"
        errors = window.error_count()
        if errors:  # visible while it happens, with what the server said most often
            try:
                kept = max(((c, m, n) for c, ms in window.messages.items()
                            for m, n in ms.items()), key=lambda x: x[2], default=None)
            except RuntimeError:  # the engine thread added a message meanwhile: next line
                kept = None
            rate += f"  errors {errors}" + (f" ({kept[0]}: {kept[1][:80]})" if kept else "")
        last.update(window=window, t=now, count=count)
    if not st["phase"]:
        return f"[{st['stage']}]"
    total = len(run.plan.phases[[p.name for p in run.plan.phases].index(st["phase"])].steps)
    return (
        f"[{st['phase']} step {st['step'] + 1}/{total} {st['load']}] "
        f"{st['stage']} {st['elapsed_s']:.0f}s, {st['remaining_s']:.0f}s left{rate}"
    )


def cmd_run(args: argparse.Namespace) -> int:
    import loadkit.drive.bootstrap  # noqa: F401, I001  (first: Locust must not monkey-patch)

    import gevent
    from locust.env import Environment

    from loadkit.control.server import ServerControl
    from loadkit.drive.shape import LoadkitShape
    from loadkit.drive.users import TritonUser
    from loadkit.run import Run
    from loadkit.scenario import (
        check_against_models,
        load_scenario,
        unbatched_models,
        with_model_facts,
    )
    from loadkit.server import EmbeddedServer

    scenario = load_scenario(args.scenario)
    spec = _capacity_spec(args) if args.command == "capacity" else None
    out_dir = Path(args.out) if args.out else _default_out(scenario.name)
    address = args.target or scenario.target.grpc
    server = None
    out_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=out_dir / "loadkit.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    try:
        if address is None:
            print(
                f"starting the embedded Triton for models {', '.join(scenario.models)} ...",
                file=sys.stderr,
            )
            server = EmbeddedServer(models=scenario.models, log_path=out_dir / "tritonserver.log")
            server.start()
            address = server.grpc_address
            print(
                f"embedded Triton ready: grpc {address}, metrics {server.metrics_url}",
                file=sys.stderr,
            )
        metrics_url = args.metrics or (server.metrics_url if server is not None else None)
        control = ServerControl(address, scenario.target, metrics_url)
        try:
            control.wait_live(timeout_s=10)
            infos = {m: control.model_info(m) for m in scenario.models}
            problems = check_against_models(scenario, infos)
            if problems:
                raise ScenarioError(problems)
            scenario = with_model_facts(scenario, unbatched_models(infos))
            distributed = bool(args.workers or args.master)
            run = Run(
                scenario, address, control, out_dir, embedded=server is not None, seed=args.seed,
                distributed=distributed,
            )
            if spec is not None:
                from loadkit.drive.search import CapacityConductor

                run.conductor = CapacityConductor(run, spec)
                print(f"capacity search, SLO {args.slo}, budget {args.budget:g} s", file=sys.stderr)
            else:
                print(run.plan.describe(), file=sys.stderr)
            env = Environment(
                user_classes=[TritonUser], shape_class=LoadkitShape(), stop_timeout=5,
                parsed_options=_master_options() if distributed else None,
            )
            code = _drive(run, env, gevent, args, out_dir)
        finally:
            control.close()
    finally:
        if server is not None:
            server.stop()
    print(_summary(out_dir))
    print(f"report: {out_dir}")
    return code


def _capacity_spec(args: argparse.Namespace) -> Any:
    from loadkit.capacity import CapacityInputError, parse_rate, parse_slo
    from loadkit.drive.search import CapacitySpec

    if not 0 <= args.headroom < 1:
        raise CapacityInputError(f"--headroom: expected a fraction in [0, 1); found {args.headroom}"
                                 )
    if args.budget <= 0 or not 0 < args.precision < 1:
        raise CapacityInputError("--budget must be above 0 and --precision in (0, 1)")
    return CapacitySpec(
        slo=parse_slo(args.slo),
        slo_text=args.slo,
        peak=parse_rate(args.peak, "--peak") if args.peak else None,
        headroom=args.headroom,
        budget_s=args.budget,
        precision=args.precision,
        start_rate=parse_rate(args.start_rate, "--start-rate") if args.start_rate else None,
        max_rate=parse_rate(args.max_rate, "--max-rate") if args.max_rate else None,
    )


def _summary(out_dir: Path) -> str:
    return (out_dir / "summary.md").read_text()


def _master_options() -> Any:
    """Locust's defaults, with rebalancing on: a worker that joins or dies re-spreads users."""
    from locust import argument_parser

    parser = argument_parser.get_empty_argument_parser(default_config_files=[])
    argument_parser.setup_parser_arguments(parser)
    options = parser.parse(args=[])
    options.enable_rebalancing = True
    options.headless = True
    return options


def _drive(run: Any, env: Any, gevent: Any, args: argparse.Namespace, out_dir: Path) -> int:
    workers: Any = None
    if args.workers or args.master:
        from loadkit.drive.workers import LocalWorkers, master_address

        host, port = master_address(args)
        runner = env.create_master_runner(host, port)
        run.attach(env)
        workers = LocalWorkers(args, port, out_dir)
        workers.start(args.workers)
        expected = args.workers or args.expect_workers
        print(f"waiting for {expected} worker(s) on {host}:{port} ...", file=sys.stderr)
        if not workers.wait_connected(runner, expected, args.worker_wait):
            _err(
                f"only {len(runner.clients.ready)} of {expected} workers connected within "
                f"{args.worker_wait:g} s; see {out_dir}/workers/ for their logs"
            )
            runner.quit()
            workers.stop()
            return EXIT_FAILED
    else:
        runner = env.create_local_runner()
        run.attach(env)
    handlers = [
        gevent.signal_handler(
            signal.SIGINT, run.conductor.abort, "interrupted by SIGINT", EXIT_SIGINT
        ),
        gevent.signal_handler(
            signal.SIGTERM, run.conductor.abort, "interrupted by SIGTERM", EXIT_SIGTERM
        ),
    ]
    progress = None
    if not args.quiet:

        def report_progress() -> None:
            last: dict[str, Any] = {}
            while not run.conductor.finished.is_set():
                print(_progress_line(run, last), file=sys.stderr, flush=True)
                run.conductor.finished.wait(2.0)

        progress = gevent.spawn(report_progress)
    try:
        runner.start_shape()
        run.conductor.finished.wait()
    finally:
        runner.quit()
        if runner.greenlet is not None:
            runner.greenlet.join(timeout=10)
        if progress is not None:
            progress.kill(block=False)
        run.drive.stop()
        if workers is not None:
            workers.stop()
        for h in handlers:
            h.cancel()
    code = run.conductor.exit_code
    if code == 0 and run.result.status != "complete":
        code = EXIT_FAILED
    from loadkit.slo import FAILING

    if code == 0 and any(o["status"] in FAILING for o in run.result.thresholds):
        code = EXIT_FAILED  # an SLO gate failed: CI reads 1 (2 stays bad input)
    if run.result.status != "complete":
        _err(f"run {run.result.status}: {run.result.reason}")
    return code


def cmd_worker(args: argparse.Namespace) -> int:
    """A Locust worker: the master tells it the target and opens and closes its gate."""
    import loadkit.drive.bootstrap  # noqa: F401, I001  (first: Locust must not monkey-patch)

    import gevent
    from locust.env import Environment

    from loadkit.drive.distributed import WorkerAgent
    from loadkit.drive.users import TritonUser
    from loadkit.drive.workers import PARENT_ENV
    from loadkit.scenario import load_scenario
    from loadkit.server import die_with_parent

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
        _err(f"no loadkit master answered at {args.master_host}:{args.master_port}")
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
    from loadkit.scenario import load_scenario
    from loadkit.server import LOOPBACK_HOSTS

    load_scenario(args.scenario)  # bad input stops here, with the usual messages and exit 2
    if args.web_host not in LOOPBACK_HOSTS:
        _err(
            f"warning: the web UI listens on {args.web_host}:{args.web_port}; anyone who can "
            "reach it can start load. Pass Locust's --web-login (after --) to require a login."
        )
    locustfile = Path(__file__).resolve().parent / "drive" / "locustfile.py"
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
    from loadkit.server import EmbeddedServer

    models = tuple(
        args.models
        or [
            p.name
            for p in sorted(Path(args.model_repository).iterdir())
            if (p / "config.pbtxt").exists()
        ]
    )
    server = EmbeddedServer(
        model_repository=Path(args.model_repository).resolve(),
        models=models,
        host=args.host,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        log_path=Path(args.log).resolve() if args.log else None,
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
                _err(f"tritonserver exited with code {server.process.returncode}")
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
    from loadkit.report import read_run, render_comparison

    runs = []
    labels = args.labels.split(",") if args.labels else [Path(r).name for r in args.runs]
    if len(labels) != len(args.runs) or len(set(labels)) != len(labels):
        _err(f"--labels needs {len(args.runs)} distinct names; found {args.labels!r}")
        return EXIT_BAD_INPUT
    for label, run_dir in zip(labels, args.runs, strict=True):
        results, hists = read_run(Path(run_dir))
        runs.append((label, results, hists))
    out = Path(args.out) if args.out else None
    print(render_comparison(runs, out, title=" vs ".join(labels)), end="")
    if out is not None:
        print(f"report: {out / 'report.html'}", file=sys.stderr)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loadkit", description=__doc__.splitlines()[0])
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
        default=str(Path(__file__).resolve().parent.parent / "model_repository"),
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
            _err(f"arguments after -- are only for `loadkit ui`: {' '.join(extra)}")
            return EXIT_BAD_INPUT
        return int(args.func(args))
    except ScenarioError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        n = len(exc.problems)
        _err(f"{n} problem{'s' if n != 1 else ''} found; nothing was sent")
        return exc.exit_code
    except LoadkitError as exc:
        _err(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_SIGINT
