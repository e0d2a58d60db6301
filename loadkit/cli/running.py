"""`loadkit run` and `loadkit capacity`: set up the target (run/session.py), build the Run, hand
it to Locust's runner (local, or a master with workers) and wait for the conductor."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from loadkit.exits import EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM, err


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    import loadkit.locust.bootstrap  # noqa: F401, I001  (first: Locust must not monkey-patch)

    from locust.env import Environment

    from loadkit.locust.assembly import new_run
    from loadkit.locust.shape import LoadkitShape
    from loadkit.locust.users import TritonUser
    from loadkit.run.session import Session, default_out
    from loadkit.scenario import load_scenario

    from loadkit.cli import gate, overrides
    from loadkit.errors import LoadkitError

    out_dir = _quick_start(args)
    overrides.refuse_idle(args)
    scenario = load_scenario(args.scenario)
    if out_dir is None and hasattr(args, "concurrency"):  # perf_analyzer's flags beside a file
        scenario, out_dir = _overridden(args, scenario)
    scenario = with_repeats(scenario, args)
    found = gate.rules(args)
    if getattr(args, "baseline", None) and args.command != "run":
        raise LoadkitError(f"--baseline gates `loadkit run`; `loadkit {args.command}` "
                           "searches configs (compare its report with `loadkit compare`)")
    baseline = gate.read_baseline(args)
    if baseline is not None:
        from loadkit.plan import build_plan

        gate.check_plan(baseline, build_plan(scenario), args.baseline)
    spec = capacity_spec(args) if args.command == "capacity" else None
    tune, carried = tune_run(args, scenario) if args.command == "tune" else (None, None)
    out_dir = out_dir or (Path(args.out) if args.out else Path(args.resume) if getattr(
        args, "resume", None) else default_out(scenario.name))
    out_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=out_dir / "loadkit.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    with Session(scenario, args.target or scenario.target.address, args.metrics,
                 log_path=out_dir / "tritonserver.log", say=_say) as session:
        assert session.control is not None
        distributed = bool(getattr(args, "workers", 0) or getattr(args, "master", False))
        run = new_run(session, out_dir, seed=args.seed, distributed=distributed,
                      capacity=spec, tune=tune, baseline=baseline)
        if carried is not None:
            run.result.carried_phases, run.result.carried_histograms = carried
        if spec is not None:
            _say(f"capacity search, SLO {args.slo}, budget {spec.budget_s:g} s" + (
                f", each probe in {session.scenario.repeats} rounds back to back"
                if session.scenario.repeats > 1 else ""))
        elif tune is not None:
            _say(describe_tune(session.scenario, tune))
        else:
            _say(run.plan.describe())
        env = Environment(
            user_classes=[TritonUser], shape_class=LoadkitShape(), stop_timeout=5,
            parsed_options=_master_options() if distributed else None,
        )
        exporter = _exporter(run, args)
        try:
            code = _drive(run, env, args, out_dir)
        finally:
            if exporter is not None:
                exporter.stop()
    print((out_dir / "summary.md").read_text())
    print(f"report: {out_dir}")
    if baseline is not None:
        judged = gate.apply(baseline, run.result.to_json(), found, out_dir, None)
        code = code or judged
    return code


def _overridden(args: argparse.Namespace, scenario: Any) -> tuple[Any, Path | None]:
    """The scenario with perf_analyzer's flags applied (cli/overrides.py), written into the
    report folder, which is returned (the file itself, and None, when no flag was given)."""
    from loadkit.cli import overrides
    from loadkit.cli.quick import command_line
    from loadkit.run.session import default_out
    from loadkit.scenario import load_scenario

    found = overrides.overrides(args)
    if not found:
        return scenario, None
    data, said = overrides.apply(scenario.source.data, found)
    out_dir = Path(args.out) if args.out else default_out(scenario.name)
    source = Path(args.scenario)
    path = overrides.write(out_dir / "scenario.yaml", source, data, said, command_line())
    for line in said:
        _say(f"override: {line}")
    args.scenario = str(path)
    return load_scenario(path, base=source.resolve().parent), out_dir


def cmd_init(args: argparse.Namespace) -> int:
    """`loadkit init -m MODEL`: the scenario `run -m` would run, with every input the model's
    metadata gives written out, to edit."""
    from loadkit.cli.quick import command_line, scenario_data, scenario_text
    from loadkit.errors import LoadkitError
    from loadkit.run.session import Session
    from loadkit.scenario import load_scenario

    if not args.model:
        raise LoadkitError("`loadkit init` needs -m MODEL (the model to write a scenario for)")
    path = Path(args.output or f"{args.model}.yaml")
    if path.exists() and not args.force:
        raise LoadkitError(f"{path} exists; choose another -o FILE, or --force to overwrite it")
    data = scenario_data(args, path.parent)
    path.write_text(scenario_text(data, "being written by loadkit init"))
    try:
        with Session(load_scenario(path), args.target, say=_say) as session:
            filled = session.scenario.requests[args.model].filled
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    data["requests"][args.model].update(filled)
    filled = filled["inputs"]
    where = args.target or "the embedded Triton"
    path.write_text(scenario_text(data, f"written by `{command_line()}` from model "
                                        f"'{args.model}' on {where}: edit freely, then "
                                        f"`loadkit run {path}`"))
    print(f"wrote {path}: model '{args.model}', inputs "
          + ", ".join(f"{n} {v.get('dtype')} {v.get('shape', v.get('data', ''))}"
                      for n, v in filled.items()))
    print(f"next: loadkit run {path}" + (f" --target {args.target}" if args.target else ""))
    return 0


def _quick_start(args: argparse.Namespace) -> Path | None:
    """`-m MODEL` instead of a scenario file: the scenario the flags describe is written into
    the report folder, which is returned (None with a scenario file)."""
    from loadkit.errors import LoadkitError
    from loadkit.run.session import default_out

    model = getattr(args, "model", None)
    if model and args.scenario:
        raise LoadkitError(f"give a scenario file or -m {model}, not both")
    replay = getattr(args, "replay", None)
    if replay and args.scenario:
        raise LoadkitError(f"--replay {replay} with a scenario file: give the phase "
                           f"`load: {{replay: {replay}}}` there instead (docs/replay.md), or "
                           "leave the scenario out")
    if not model and not replay:
        if not args.scenario:
            raise LoadkitError(f"`loadkit {args.command}` needs a scenario file, or -m MODEL to "
                               "load a model with inputs from its metadata (see --help)")
        return None
    from loadkit.cli.quick import write_scenario

    out_dir = Path(args.out) if args.out else default_out(model or "replay")
    args.scenario = str(write_scenario(args, out_dir))
    return out_dir


def with_repeats(scenario: Any, args: argparse.Namespace) -> Any:
    """`--repeats N|auto`, `--max-repeats`, `--max-time` over the scenario's keys (tune and
    capacity: each trial or probe in N rounds, docs/verdicts.md). A value given is applied or
    refused, never replaced by a default."""
    import dataclasses

    from loadkit.errors import LoadkitError
    from loadkit.scenario.checks import parse_duration
    from loadkit.scenario.model import DEFAULT_AUTO_ROUNDS, MAX_REPEATS, MIN_AUTO_ROUNDS

    raw = str(getattr(args, "repeats", "") or "").strip()
    auto = raw == "auto" or (not raw and scenario.auto)
    if raw and raw != "auto" and (not raw.isdigit() or not 1 <= int(raw) <= MAX_REPEATS):
        raise LoadkitError(f"--repeats: expected 1 to {MAX_REPEATS}, or auto; found {raw!r}")
    most, limit = getattr(args, "max_repeats", 0), getattr(args, "max_time", "")
    if (most or limit) and not auto:
        flag = "--max-repeats" if most else "--max-time"
        raise LoadkitError(f"{flag} bounds --repeats auto (or the scenario's repeats: auto); "
                           f"found repeats {raw or scenario.repeats}")
    if auto and args.command == "tune":
        raise LoadkitError("`loadkit tune` measures each trial in a fixed number of rounds back "
                           "to back and races the close ones: give --repeats N")
    if not auto:
        return dataclasses.replace(scenario, repeats=int(raw) if raw else scenario.repeats)
    if most and not MIN_AUTO_ROUNDS <= most <= MAX_REPEATS:
        raise LoadkitError(f"--max-repeats: expected {MIN_AUTO_ROUNDS} to {MAX_REPEATS}; "
                           f"found {most}")
    seconds = scenario.max_time_s
    if limit:
        seconds = parse_duration(limit)
        if seconds is None or seconds <= 0:
            raise LoadkitError(f"--max-time: expected a duration above 0 such as 3m or 90s; "
                               f"found {limit!r}")
    rounds = most or (scenario.repeats if scenario.auto else DEFAULT_AUTO_ROUNDS)
    return dataclasses.replace(scenario, repeats=rounds, auto=True, max_time_s=seconds)


def _exporter(run: Any, args: argparse.Namespace) -> Any:
    """`--prometheus-port`: loadkit's live metrics while the run lasts (run/exporter.py)."""
    if not args.prometheus_port:
        return None
    from loadkit.control.embedded import LOOPBACK_HOSTS
    from loadkit.run.exporter import Exporter

    host = args.prometheus_host
    if host not in LOOPBACK_HOSTS:
        err(f"warning: live metrics on {host}:{args.prometheus_port} can be read by anyone who "
            "can reach it (they name the scenario's templates and target)")
    exporter = Exporter(run)
    exporter.start(host, args.prometheus_port)
    _say(f"live metrics: http://{host}:{args.prometheus_port}/metrics")
    return exporter


def capacity_spec(args: argparse.Namespace) -> Any:
    from loadkit.errors import CapacityInputError
    from loadkit.run.capacity import CapacitySpec
    from loadkit.search.capacity import parse_peak, parse_rate
    from loadkit.slo import parse_slo

    if not 0 <= args.headroom < 1:
        raise CapacityInputError(
            f"--headroom: expected a fraction in [0, 1); found {args.headroom}")
    from loadkit.scenario.checks import parse_duration

    budget = parse_duration(args.budget)
    if budget is None or budget <= 0:
        raise CapacityInputError(f"--budget: expected a time above 0 such as 10m or 90s; found "
                                 f"{args.budget!r}")
    if not 0 < args.precision < 1:
        raise CapacityInputError(f"--precision: expected a fraction in (0, 1) such as 0.05; "
                                 f"found {args.precision:g}")
    peak, peak_speed = parse_peak(args.peak) if args.peak else (None, None)
    start_speed = None
    if args.start_rate and args.start_rate.strip().endswith("x"):  # a replay's first speed
        try:
            start_speed = parse_peak(args.start_rate)[1]
        except CapacityInputError:
            start_speed = None
        if start_speed is None:
            raise CapacityInputError(f"--start-rate: expected a rate such as 100/s or a "
                                     f"replay's speed such as 4x; found {args.start_rate!r}")
    min_probe = None
    if args.min_probe is not None:
        min_probe = parse_duration(args.min_probe)
        if min_probe is None or min_probe <= 0:
            raise CapacityInputError(f"--min-probe: expected a duration above 0 such as 5s; "
                                     f"found {args.min_probe!r}")
    return CapacitySpec(
        min_probe_s=min_probe,
        slo=parse_slo(args.slo),
        slo_text=args.slo,
        peak=peak,
        peak_speed=peak_speed,
        headroom=args.headroom,
        budget_s=budget,
        precision=args.precision,
        start_rate=parse_rate(args.start_rate, "--start-rate") if args.start_rate and not
        start_speed else None,
        start_speed=start_speed,
        max_rate=parse_rate(args.max_rate, "--max-rate") if args.max_rate else None,
    )


def tune_run(args: argparse.Namespace, scenario: Any) -> tuple[Any, Any]:
    """The search `loadkit tune` runs, and what a resumed one carries over (its phases and
    histograms)."""
    from loadkit.errors import TuneInputError
    from loadkit.run.tune import TuneRun
    from loadkit.scenario.tune import parse_budget
    from loadkit.search.resume import read_search

    tune = scenario.tune
    if tune is None:
        raise TuneInputError(f"{args.scenario}: no 'tune' section; `loadkit tune` needs one "
                             "(docs/tune.md)")
    budget_s, trials = tune.budget_s, tune.budget_trials
    if args.budget:
        b = parse_budget(args.budget)
        if isinstance(b, str):
            raise TuneInputError(f"--budget: {b}")
        budget_s, trials = b
    strategy = args.strategy or tune.strategy
    if not args.resume:
        return TuneRun(strategy=strategy, budget_s=budget_s, budget_trials=trials), None
    trials_done, phases, hists, elapsed_s = read_search(Path(args.resume), tune)
    return (TuneRun(strategy=strategy, budget_s=budget_s, budget_trials=trials,
                    resumed=tuple(trials_done), resumed_from=str(args.resume),
                    resumed_elapsed_s=elapsed_s), (phases, hists))


def describe_tune(scenario: Any, tune: Any) -> str:
    spec = scenario.tune
    budget = ", ".join(filter(None, [f"{tune.budget_s:g} s" if tune.budget_s else "",
                                     f"{tune.budget_trials} trials" if tune.budget_trials
                                     else ""])) or "none"
    lines = [f"tune '{scenario.name}': {tune.strategy} search over {spec.grid_size} configs, "
             f"{spec.objective.text}, budget {budget}"]
    lines += [f"  {d.name}: {', '.join(map(str, d.values))}" for d in spec.dimensions]
    if scenario.repeats > 1:
        lines.append(f"  each trial measured in {scenario.repeats} rounds back to back")
    if tune.resumed:
        lines.append(f"  resuming {tune.resumed_from}: {len(tune.resumed)} trials kept")
    return "\n".join(lines)


def _master_options() -> Any:
    """Locust's defaults, with rebalancing on: a worker that joins or dies re-spreads users."""
    from locust import argument_parser

    parser = argument_parser.get_empty_argument_parser(default_config_files=[])
    argument_parser.setup_parser_arguments(parser)
    options = parser.parse(args=[])
    options.enable_rebalancing = True
    options.headless = True
    return options


def _drive(run: Any, env: Any, args: argparse.Namespace, out_dir: Path) -> int:
    import gevent

    from loadkit.cli.progress import report_progress

    workers: Any = None
    if getattr(args, "workers", 0) or getattr(args, "master", False):
        from loadkit.locust.workers import LocalWorkers, master_address

        host, port = master_address(args)
        runner = env.create_master_runner(host, port)
        run.attach(env)
        workers = LocalWorkers(args, port, out_dir)
        workers.start(args.workers)
        expected = args.workers or args.expect_workers
        _say(f"waiting for {expected} worker(s) on {host}:{port} ...")
        if not workers.wait_connected(runner, expected, args.worker_wait):
            err(
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
    progress = None if args.quiet else gevent.spawn(report_progress, run)
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
    code = run.exit_code()
    if run.result.tune and run.result.tune.get("best") is None:
        err("tune: no config kept the constraints (see the ranked table)")
    if run.result.status != "complete":
        err(f"run {run.result.status}: {run.result.reason}")
    return code
