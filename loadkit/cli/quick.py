"""`loadkit run -m MODEL` and `loadkit init -m MODEL`: perf_analyzer's zero-config start. The
flags keep perf_analyzer's meanings (-m, -b, --shape, --input-data, --concurrency-range,
--request-rate-range, -u, -p) and become an ordinary scenario, written into the report folder
(or, by `init`, to a file to edit), so every later feature applies to it unchanged."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from loadkit.errors import LoadkitError


def add_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("without a scenario file (perf_analyzer's flags and meanings)")
    g.add_argument("-m", "--model-name", dest="model", metavar="MODEL",
                   help="load this model with inputs from its metadata (no scenario file)")
    g.add_argument("-i", "--protocol", choices=("grpc", "http"), metavar="grpc|http",
                   help="Triton's door: gRPC (default) or HTTP/REST (docs/doors.md); with a "
                        "scenario file, its target.protocol")
    g.add_argument("--shared-memory", choices=("none", "system", "cuda"), metavar="system|none",
                   help="tensors through system shared memory instead of the request (Triton "
                        "on this host); with a scenario file, its target.shared_memory")
    g.add_argument("--output-shared-memory-size", dest="output_shm", metavar="BYTES",
                   help="each output's shared memory slot (default 102400, as perf_analyzer)")
    g.add_argument("-x", "--model-version", dest="model_version", metavar="V",
                   help="with -m: the model version (default: the server's choice)")
    g.add_argument("-b", "--batch-size", dest="batch_size", type=int, metavar="N",
                   help="batch size of each request (default 1; with a scenario file: every "
                        "template's batch_size)")
    g.add_argument("--shape", action="append", default=[], metavar="NAME:D1,D2",
                   help="with -m: the shape of an input with a variable dimension (repeatable)")
    g.add_argument("--input-data", metavar="FILE|random|zero",
                   help="with -m: perf_analyzer's --input-data JSON (or .jsonl/.npz/folder), "
                        "or random (default) or zero data")
    load = g.add_mutually_exclusive_group()
    load.add_argument("--concurrency", "--concurrency-range", dest="concurrency",
                      metavar="START:END:STEP",
                      help="closed loop, e.g. 8 or 1:16:2 (default 1; with a scenario file: "
                           "every closed-loop phase's concurrency)")
    load.add_argument("--rate", "--request-rate-range", dest="rate", metavar="START:END:STEP",
                      help="open loop in requests/s, e.g. 100:500:100 (with a scenario file: "
                           "every rate phase's rate)")
    g.add_argument("--replay", metavar="FILE",
                   help="the load is this traffic file replayed (a Triton trace, perf_analyzer's "
                        "request intervals, a rate CSV or a Prometheus export: docs/replay.md); "
                        "without -m, one template per model the file names; with capacity, "
                        "the search moves its speed; FILE1,FILE2 for a trace's parts")
    g.add_argument("--sample-rate", type=int, metavar="N",
                   help="with --replay of a Triton trace taken with rate=N: each trace stands "
                        "for N requests (default 1)")
    g.add_argument("--sequence-length", type=int, metavar="N",
                   help="with -m on a sequence model: requests per sequence (default 20, "
                        "perf_analyzer's)")
    g.add_argument("--sequence-length-variation", type=float, metavar="PCT",
                   help="with -m: each sequence's length varies by up to this %% (default 20)")
    g.add_argument("--sequence-id-range", metavar="START:END",
                   help="with -m: the correlation ids to use (default 1 to 2^31-1)")
    g.add_argument("--step-duration", metavar="DURATION",
                   help="measured time of each load level (default 5s, perf_analyzer's "
                        "measurement interval; with a scenario file: every phase's)")
    g.add_argument("-p", "--measurement-interval", dest="measurement_ms", type=int,
                   metavar="MS", help="--step-duration in milliseconds")
    g.add_argument("--warmup", metavar="DURATION",
                   help="unmeasured time before each load level (default 1s; with a scenario "
                        "file: every phase's)")


def check_values(args: argparse.Namespace) -> None:
    """Zero and negative values are refused by name, never replaced by a default."""
    for flag, value in (("-b", args.batch_size), ("-p", args.measurement_ms),
                        ("--sample-rate", args.sample_rate),
                        ("--sequence-length", getattr(args, "sequence_length", None))):
        if value is not None and value < 1:
            raise LoadkitError(f"{flag}: expected a whole number of at least 1; found {value}")
    from loadkit.scenario.checks import parse_duration

    for flag, value in (("--step-duration", args.step_duration), ("--warmup", args.warmup)):
        seconds = parse_duration(value) if value is not None else None
        if value is not None and (seconds is None or seconds < 0 or (
                seconds == 0 and flag == "--step-duration")):
            raise LoadkitError(f"{flag}: expected a duration such as 2s or 500ms"
                               f"{' above 0' if flag == '--step-duration' else ''}; found "
                               f"{value!r}")
    variation = getattr(args, "sequence_length_variation", None)
    if variation is not None and not 0 <= variation <= 100:
        raise LoadkitError(f"--sequence-length-variation: expected a percentage from 0 to 100; "
                           f"found {variation:g}")
    if args.measurement_ms is not None and args.step_duration is not None:
        raise LoadkitError("-p and --step-duration both give the step's length: give one")


def scenario_data(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """The scenario the -m flags describe; `base` is the folder the scenario file will be in
    (the data set path is written relative to it, or absolute)."""
    from loadkit.scenario import parse_ramp, parse_rate_ramp

    model = args.model
    if not model:
        return replay_scenario_data(args, base)
    if not re.match(r"^[\w.\-]+$", model):
        raise LoadkitError(f"-m: expected a model name; found {model!r}")
    check_values(args)
    template: dict[str, Any] = {"model": model}
    if args.model_version:
        template["version"] = args.model_version
    if args.batch_size not in (None, 1):
        template["batch_size"] = args.batch_size
    inputs = _shapes(args.shape)
    data = args.input_data
    if data in ("zero", "zeros"):
        if not inputs:
            raise LoadkitError("--input-data zero: loadkit needs the inputs' names for zero "
                               "data; give each a --shape NAME:DIMS, or edit `loadkit init`'s "
                               "scenario (inputs: {NAME: {data: zeros}})")
        inputs = {n: {**v, "data": "zeros"} for n, v in inputs.items()}
    elif data and data != "random":
        file = Path(data)
        if not file.exists():
            raise LoadkitError(f"--input-data: file not found: {data}")
        template["dataset"] = _relative(file.resolve(), base)
    if inputs:
        template["inputs"] = inputs
    sequence = _sequence(args)
    if sequence:
        template["sequence"] = sequence
    if getattr(args, "replay", None):
        if args.rate or args.concurrency:
            raise LoadkitError("--replay gives the load; leave out --rate and --concurrency")
        load: dict[str, Any] = _replay_load(args, base)
    elif args.rate:
        rate = _number(args.rate)
        if parse_rate_ramp(rate)[1]:
            raise LoadkitError(f"--rate: {parse_rate_ramp(rate)[1]}")
        load = {"rate": rate}
    else:
        level = _number(args.concurrency or "1")
        if parse_ramp(level)[1]:
            raise LoadkitError(f"--concurrency: {parse_ramp(level)[1]}")
        load = {"concurrency": level}
    step = f"{args.measurement_ms}ms" if args.measurement_ms else args.step_duration or "5s"
    if "replay" not in load:  # a replay lasts as long as its file
        load |= {"step_duration": step, "warmup": args.warmup or "1s"}
    out: dict[str, Any] = {"name": model}
    if target_key(args):
        out["target"] = target_key(args)
    phase = "replay" if "replay" in load else "rate" if args.rate else "concurrency"
    out |= {"requests": {model: template}, "phases": [{"name": phase, "load": load}]}
    return out


def target_key(args: argparse.Namespace) -> dict[str, Any]:
    """The `target:` of a scenario written from flags: --target (a URL's scheme picks the
    door) and -i."""
    out: dict[str, Any] = {}
    target = getattr(args, "target", None)
    if target:
        out["url" if "://" in target else "grpc"] = target
    if getattr(args, "protocol", None) == "http" and "url" not in out:
        out["protocol"] = "http"
    if getattr(args, "shared_memory", None):
        out["shared_memory"] = args.shared_memory
    if getattr(args, "output_shm", None):
        out["output_shared_memory_size"] = _number(args.output_shm)
    return out


def replay_scenario_data(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """`--replay FILE` without -m: a template per model the file names, its inputs from the
    model's metadata, and the file as the load."""
    from loadkit.errors import DatasetError
    from loadkit.scenario.traffic import ANY, read_traffic

    files = [Path(f) for f in args.replay.split(",") if f]
    try:
        traffic = read_traffic(files if len(files) > 1 else files[0],
                               sample_rate=args.sample_rate or 1)
    except (DatasetError, OSError, ValueError) as exc:
        raise LoadkitError(f"--replay {args.replay}: {exc}") from None
    if ANY in traffic.models:
        raise LoadkitError(f"--replay {args.replay}: the file ({traffic.format}) does not say "
                           "which model each request is for; add -m MODEL")
    out: dict[str, Any] = {"name": Path(args.replay).stem.split(".")[0] or "replay"}
    if target_key(args):
        out["target"] = target_key(args)
    out |= {"requests": {m: {"model": m} for m in traffic.models},
            "phases": [{"name": "replay", "load": _replay_load(args, base)}]}
    return out


def _replay_load(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    load: dict[str, Any] = {"replay": _replayed(args.replay, base)}
    if args.sample_rate not in (None, 1):
        load["sample_rate"] = args.sample_rate
    return load


def _replayed(text: str, base: Path) -> str | list[str]:
    """The file as the scenario names it (relative to the scenario's folder where it can be);
    FILE1,FILE2 for the numbered parts of one Triton trace."""
    files = [Path(f) for f in text.split(",") if f]
    for f in files:
        if not f.exists():
            raise LoadkitError(f"--replay: file not found: {f}")
    names = [_relative(f.resolve(), base) for f in files]
    return names if len(names) > 1 else names[0]


def _number(text: str) -> Any:
    """'8' -> 8, '12.5' -> 12.5; a range such as '1:16:2' stays text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _shapes(specs: list[str]) -> dict[str, dict[str, Any]]:
    """perf_analyzer's `--shape NAME:D1,D2` -> {NAME: {shape: [D1, D2]}}."""
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        name, _, dims = spec.rpartition(":")
        try:
            shape = [int(d) for d in dims.split(",")]
        except ValueError:
            shape = []
        if not name or not shape or min(shape) < 1:
            raise LoadkitError(f"--shape: expected NAME:D1,D2,... with positive dimensions, "
                               f"such as INPUT0:3,224,224; found {spec!r}")
        out[name] = {"shape": shape}
    return out


def _sequence(args: argparse.Namespace) -> dict[str, Any]:
    """perf_analyzer's sequence flags as a template's `sequence:` (the rest take its defaults,
    and a sequence model given none gets them all: scenario/from_model.py)."""
    out: dict[str, Any] = {}
    length = getattr(args, "sequence_length", None)
    variation = getattr(args, "sequence_length_variation", None)
    ids = getattr(args, "sequence_id_range", None)
    if length is None and variation is None and ids is None:
        return out
    out["length"] = 20 if length is None else length
    out["length_variation"] = 20 if variation is None else variation
    if ids is not None:
        m = re.match(r"^\s*(\d+)\s*:\s*(\d+)\s*$", ids)
        if m is None or not 1 <= int(m[1]) <= int(m[2]):
            raise LoadkitError(f"--sequence-id-range: expected START:END with 1 <= START <= END, "
                               f"such as 1:1000; found {ids!r}")
        out["ids"] = [int(m[1]), int(m[2])]
    return out


def _relative(file: Path, base: Path) -> str:
    try:
        return str(file.relative_to(base.resolve()))
    except ValueError:
        return str(file)


def scenario_text(data: dict[str, Any], header: str) -> str:
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
    return f"# {header}\n{body}"


def command_line() -> str:
    return "loadkit " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def write_scenario(args: argparse.Namespace, out_dir: Path) -> Path:
    """`run -m`: the scenario the flags describe, written into the report folder (the report
    then says exactly what ran, and `loadkit run out/scenario.yaml` runs it again)."""
    text = scenario_text(scenario_data(args, out_dir), f"what `{command_line()}` ran (inputs "
                         "from the model's metadata; `loadkit init` writes them out)")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "scenario.yaml"
    path.write_text(text)
    return path
