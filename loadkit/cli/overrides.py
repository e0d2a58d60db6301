"""perf_analyzer's flags beside a scenario file: each one overrides the matching key of every
phase (or template) it applies to, or is refused by name; none is dropped. The scenario that
runs is the file with the overrides applied, written into the report folder as scenario.yaml
with a header that says what the command line changed."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

from loadkit.errors import LoadkitError

# flags that describe one model's template: with a scenario file, its templates say these
REFUSED = {
    "model_version": ("-x/--model-version", "the template's `version:`"),
    "shape": ("--shape", "the template's `inputs: {NAME: {shape: [...]}}`"),
    "input_data": ("--input-data", "the template's `dataset:` (or `inputs: {NAME: {data: "
                   "zeros}}`)"),
    "sample_rate": ("--sample-rate", "the replay load's `sample_rate:`"),
    "sequence_length": ("--sequence-length", "the template's `sequence: {length: N}`"),
    "sequence_length_variation": ("--sequence-length-variation",
                                  "the template's `sequence: {length_variation: PCT}`"),
    "sequence_id_range": ("--sequence-id-range", "the template's `sequence: {ids: [a, b]}`"),
}
# flags that belong to another flag: given without it they would do nothing
NEEDS = (
    ("expect_workers", 1, "--expect-workers", "master", "--master"),
    ("master_bind_host", "127.0.0.1", "--master-bind-host", "master", "--master"),
    ("master_port", 5557, "--master-port", "master", "--master"),
    ("worker_wait", 120.0, "--worker-wait", ("workers", "master"), "--workers or --master"),
    ("prometheus_host", "127.0.0.1", "--prometheus-host", "prometheus_port",
     "--prometheus-port"),
)


def refuse_idle(args: argparse.Namespace) -> None:
    """A flag given without the flag it belongs to is refused, never silently unused."""
    for dest, default, flag, needs, name in NEEDS:
        if getattr(args, dest, default) == default:
            continue
        owners = needs if isinstance(needs, tuple) else (needs,)
        if not any(getattr(args, o, None) for o in owners):
            raise LoadkitError(f"{flag} applies with {name}; found it without")


def overrides(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """(what, value) for each perf_analyzer flag given beside a scenario file; a flag that
    only describes a -m template is refused by name."""
    from loadkit.cli.quick import check_values

    for dest, (flag, where) in REFUSED.items():
        value = getattr(args, dest, None)
        if value not in (None, [], ""):
            raise LoadkitError(f"{flag} describes -m's model; with a scenario file set "
                               f"{where} there instead")
    check_values(args)
    if getattr(args, "command", "") == "capacity" and getattr(args, "concurrency", None):
        raise LoadkitError("--concurrency-range: `loadkit capacity` searches an arrival rate; "
                           "give --start-rate (or --request-rate-range for the first rate)")
    args = argparse.Namespace(**{k: getattr(args, k, None) for k in (
        "concurrency", "rate", "measurement_ms", "step_duration", "warmup", "batch_size",
        "protocol", "shared_memory", "output_shm")})
    out: list[tuple[str, Any]] = []
    if args.protocol is not None:
        out.append(("protocol", args.protocol))
    if args.shared_memory is not None:
        out.append(("shared_memory", args.shared_memory))
    if args.output_shm is not None:
        out.append(("output_shared_memory_size", _number(args.output_shm)))
    if args.concurrency is not None:
        out.append(("concurrency", _number(args.concurrency)))
    if args.rate is not None:
        out.append(("rate", _number(args.rate)))
    if args.measurement_ms is not None:
        out.append(("step_duration", f"{args.measurement_ms}ms"))
    elif args.step_duration is not None:
        out.append(("step_duration", args.step_duration))
    if args.warmup is not None:
        out.append(("warmup", args.warmup))
    if args.batch_size is not None:
        out.append(("batch_size", args.batch_size))
    return out


def _number(text: str) -> Any:
    from loadkit.cli.quick import _number as as_number

    return as_number(text)


def apply(data: dict[str, Any], found: list[tuple[str, Any]]) -> tuple[dict[str, Any],
                                                                       list[str]]:
    """The scenario's data with the overrides applied, and one line per override saying where
    it went; an override that applies nowhere is refused."""
    out = copy.deepcopy(data)
    said = []
    phases = out.get("phases") or []
    for key, value in found:
        if key == "protocol":
            target = out.setdefault("target", {}) or {}
            out["target"] = target
            url = str(target.get("url", ""))
            if url and not url.startswith(value):
                raise LoadkitError(f"-i {value}: the scenario's target.url {url} names its "
                                   "door; change the url (or leave out -i)")
            if value == "http" and "transport" in target:
                raise LoadkitError(f"-i http: the scenario's target.transport "
                                   f"({target['transport']}) chooses between gRPC's calls; "
                                   "remove it to run over HTTP")
            target["protocol"] = value
            said.append(f"-i {value}: target.protocol")
            continue
        if key in ("shared_memory", "output_shared_memory_size"):
            out["target"] = out.get("target") or {}
            out["target"][key] = value
            flag = "--shared-memory" if key == "shared_memory" else "--output-shared-memory-size"
            said.append(f"{flag} {value}: target.{key}")
            continue
        if key == "batch_size":
            names = list(out.get("requests") or {})
            for name in names:
                out["requests"][name]["batch_size"] = value
            said.append(f"-b {value}: batch_size of template(s) {', '.join(names)}")
            continue
        hit = [p for p in phases if isinstance(p, dict) and _applies(key, p.get("load") or {})]
        if not hit:
            kinds = {"concurrency": "closed-loop (concurrency)", "rate": "rate",
                     "step_duration": "concurrency or rate", "warmup": "concurrency or rate"}
            raise LoadkitError(f"--{_flag(key)} {value}: the scenario has no {kinds[key]} "
                               "phase for it to apply to")
        for p in hit:
            p["load"][key] = value
            if key in ("concurrency", "rate") and "until_stable" in p["load"]:
                pass  # a level is a level: until_stable still extends each
        said.append(f"--{_flag(key)} {value}: load.{key} of phase(s) "
                    + ", ".join(str(p.get("name")) for p in hit))
    return out, said


def _applies(key: str, load: dict[str, Any]) -> bool:
    if key in ("concurrency", "rate"):
        return key in load
    return "replay" not in load  # a replay lasts as long as its file (or its own duration)


def _flag(key: str) -> str:
    return {"concurrency": "concurrency-range", "rate": "request-rate-range"}.get(
        key, key.replace("_", "-"))


def write(path: Path, source: Path, data: dict[str, Any], said: list[str], command: str) -> Path:
    """The overridden scenario, with a header naming its source and each override (its
    relative paths stay relative to the source's folder)."""
    from loadkit.cli.quick import scenario_text

    header = (f"{source} as `{command}` ran it (relative paths are from "
              f"{source.resolve().parent}); the command line changed:\n"
              + "\n".join(f"#   {line}" for line in said))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(scenario_text(data, header))
    return path
