"""`--fail-on` and `--baseline`: the CI regression gate on the command line (report/gate.py
judges; this maps its answer to files, lines on stderr and exit 1)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from loadkit.exits import EXIT_FAILED, EXIT_OK, err


def rules(args: argparse.Namespace) -> tuple[Any, ...]:
    """The gate's rules from `--fail-on` (with --baseline and no --fail-on: worse)."""
    from loadkit.report.gate import parse_rules

    specs = list(getattr(args, "fail_on", None) or [])
    if not specs and getattr(args, "baseline", None):
        specs = ["worse"]
    return parse_rules(specs)


def read_baseline(args: argparse.Namespace) -> dict[str, Any] | None:
    """The baseline run's results.json (`--baseline DIR`), read before anything is sent."""
    from loadkit.errors import ReportError
    from loadkit.report import read_run

    if not getattr(args, "baseline", None):
        if getattr(args, "fail_on", None):
            raise ReportError("--fail-on needs --baseline DIR (the report to gate against)")
        return None
    folder = Path(args.baseline)
    if not (folder / "results.json").is_file():
        raise ReportError(f"--baseline {folder}: no results.json there (give a report folder "
                          "written by `loadkit run`)")
    results, _ = read_run(folder)
    return results


def check_plan(baseline: dict[str, Any], plan: Any, folder: str) -> None:
    """Refuse before sending when the plan shares no phase and load with the baseline: such a
    gate could only fail or pass on nothing."""
    from loadkit.errors import ReportError

    loads = {(p["name"], json.dumps(s["load"], sort_keys=True))
             for p in baseline["phases"] for s in p["steps"]}
    mine = {(s.phase, json.dumps(s.load, sort_keys=True)) for s in plan.steps}
    if not loads & mine:
        raise ReportError(
            f"--baseline {folder}: its phases and loads ("
            + ", ".join(sorted({n for n, _ in loads})) + ") share nothing with this "
            "scenario's (" + ", ".join(p.name for p in plan.phases) + "): gate against a "
            "report of the same scenario")


def apply(base: dict[str, Any], new: dict[str, Any], found: tuple[Any, ...],
          out_dir: Path | None, junit: str | None) -> int:
    """Judge `new` against `base`, write gate.json and gate.junit.xml (into out_dir, and
    --junit FILE), say the outcome on stderr; exit 1 when a rule caught a comparison."""
    from loadkit.report.gate import judge, junit_xml
    from loadkit.report.writer import atomic_write

    gate = judge(base, new, found)
    xml = junit_xml(gate)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(out_dir / "gate.json", json.dumps(gate.to_json(), indent=1) + "\n")
        atomic_write(out_dir / "gate.junit.xml", xml)
    if junit:
        atomic_write(Path(junit), xml)
    for line in gate.lines():
        err(line)
    return EXIT_OK if gate.passed else EXIT_FAILED
